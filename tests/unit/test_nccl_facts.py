"""The NCCL reader's facts and the diagnoses built on them, on real logs quoted in NVIDIA/nccl
issues (``tests/data/nccl``, see SOURCES) and on lines filled from NCCL's own format strings
(``"Using network %s"``, ``"%s set by environment to %s."``, ``"Channel %02d/%d : %d[%d] ->
%d[%d] [%s] via %s"``): a multi-host job that fell back to sockets is flagged whatever the
NCCL version, and a job that asked for sockets is told it was its own choice."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurmhealth.diagnose.engine import diagnose
from slurmhealth.diagnose.facts import Facts, NodeFacts
from slurmhealth.diagnose.nccl_log import NcclFacts, read_facts
from slurmhealth.evidence.summary import bundle_nccl
from slurmhealth.model_records import Job

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"


def real(name: str) -> list[str]:
    return (DATA / name).read_text().splitlines()


def job(n_nodes: int, *nodes: NodeFacts) -> Facts:
    names = tuple(f"n{i + 1}" for i in range(n_nodes))
    return Facts(Job("77", node_names=names, state="completed", exit_code="0:0"), nodes)


def rules(f: Facts) -> dict[str, str]:
    return {d.rule: d.fault_class for d in diagnose(f)}


def line(host: str, dev: int, msg: str) -> str:
    return f"{host}:{100 + dev}:{200 + dev} [{dev}] NCCL INFO {msg}"


@pytest.mark.parametrize(
    ("name", "transport", "version", "hosts"),
    [
        ("issue226_nccl247_8hosts_socket.log", "socket", "2.4.7", 8),
        ("issue367_ring_net_socket.log", "socket", None, 1),
        ("issue1267_nccl2193_one_rank_socket.log", "socket", "2.19.3", 1),
        ("issue1189_h20_ib_gdrdma_cumem.log", "ib", None, 2),
        ("issue1814_ibext_v8_plugin.log", "ib", None, 1),
    ],
)
def test_real_logs_inter_node_transport(
    name: str, transport: str, version: str | None, hosts: int
) -> None:
    f = read_facts(real(name))
    assert (f.inter_node_transport, f.version, len(f.hosts)) == (transport, version, hosts)
    assert f.user_choice is None and f.evidence


def test_nccl_2_4_eight_hosts_without_ib_is_flagged_as_the_nodes_fault() -> None:
    """The miss this was built for: 'NET/IB : No device found.' then 'NET/Socket : Using'
    and nothing more (NCCL 2.4 prints neither 'Using network' nor channel lines at WARN)."""
    n = NodeFacts("n1", logs={"nccl": "\n".join(real("issue226_nccl247_8hosts_socket.log"))})
    got = rules(job(8, n))
    assert got.get("nccl_socket_fallback") == "system", got
    (d,) = [d for d in diagnose(job(8, n)) if d.rule == "nccl_socket_fallback"]
    assert "NCCL 2.4.7 on n1" in d.root_cause
    assert any("NET/IB : No device found" in c.text for c in d.citations)


def test_pre_2_7_ring_lines_and_current_channel_lines_are_both_flagged() -> None:
    old = NodeFacts("n1", logs={"nccl": "\n".join(real("issue367_ring_net_socket.log"))})
    assert "nccl_socket_fallback" in rules(job(2, old))
    current = "\n".join(
        [
            line("a", 0, "Using network Socket"),
            line("a", 0, "Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0"),
            line("b", 0, "Channel 00/0 : 0[0] -> 8[0] [receive] via NET/Socket/0"),
        ]
    )
    assert "nccl_socket_fallback" in rules(job(2, NodeFacts("n1", logs={"nccl": current})))


def test_one_node_and_infiniband_jobs_are_not_flagged() -> None:
    one = NodeFacts("n1", logs={"nccl": "\n".join(real("issue1267_nccl2193_one_rank_socket.log"))})
    assert "nccl_socket_fallback" not in rules(job(1, one))
    ib = NodeFacts("n1", logs={"nccl": "\n".join(real("issue1189_h20_ib_gdrdma_cumem.log"))})
    got = rules(job(2, ib))
    assert "nccl_socket_fallback" not in got and "nvlink_degraded" not in got


@pytest.mark.parametrize(
    "setting",
    [
        "NCCL_IB_DISABLE set by environment to 1.",
        "Comm config netName reset to NCCL_NET=Socket",
    ],
)
def test_sockets_the_job_asked_for_are_its_choice_not_the_nodes_fault(setting: str) -> None:
    text = "\n".join(
        [
            line("a", 0, setting),
            line("a", 0, "Using network Socket"),
            line("b", 0, "Using network Socket"),
        ]
    )
    f = read_facts(text.splitlines())
    assert f.user_choice in ("NCCL_IB_DISABLE=1", "NCCL_NET=Socket")
    got = rules(job(2, NodeFacts("n1", logs={"nccl": text})))
    assert got.get("nccl_sockets_by_choice") == "application"
    assert "nccl_socket_fallback" not in got
    (d,) = [
        d
        for d in diagnose(job(2, NodeFacts("n1", logs={"nccl": text})))
        if d.rule == "nccl_sockets_by_choice"
    ]
    assert f.user_choice in d.root_cause and "not a fault of n1" in d.root_cause


def test_a_network_plugin_is_not_a_fallback() -> None:
    text = [
        line("a", 0, "NET/Plugin: Loaded net plugin AWS Libfabric (v7)"),
        line("a", 0, "Using network AWS Libfabric"),
    ]
    assert read_facts(text).inter_node_transport == "aws libfabric"
    assert "nccl_socket_fallback" not in rules(
        job(2, NodeFacts("n1", logs={"nccl": "\n".join(text)}))
    )


def test_p2p_disabled_between_nvlink_gpus_and_the_users_p2p_choice() -> None:
    off = line(
        "a",
        0,
        "P2P is disabled between NVLINK connected GPUs 1 and 0. This should "
        "not be the case given their connectivity, and is probably due to a hardware "
        "issue. If you still want to proceed, you can set NCCL_IGNORE_DISABLED_P2P=1.",
    )
    assert read_facts([off]).intra_node_left_nvlink
    assert "nvlink_degraded" in rules(job(1, NodeFacts("n1", logs={"nccl": off})))
    shm = line("a", 0, "Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct")
    chosen = "\n".join([line("a", 0, "NCCL_P2P_DISABLE set by environment to 1."), shm])
    assert read_facts(chosen.splitlines()).intra_choice == "NCCL_P2P_DISABLE=1"
    assert "nvlink_degraded" not in rules(job(1, NodeFacts("n1", logs={"nccl": chosen})))


def test_the_summarys_facts_win_over_the_tail_and_survive_json() -> None:
    whole = read_facts(real("issue226_nccl247_8hosts_socket.log"))
    summary = json.loads(json.dumps(NodeFacts("n1", nccl=whole.to_dict()).to_dict()))
    back = NodeFacts.from_dict(summary)
    assert NcclFacts.from_dict(dict(back.nccl)) == whole
    # the tail kept only the end of the files: no NCCL line says anything there
    back = NodeFacts(
        "n1", logs={"nccl": "n1:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 8"}, nccl=back.nccl
    )
    assert "nccl_socket_fallback" in rules(job(8, back))


def test_the_epilogs_summary_reads_the_bundles_whole_nccl_files(tmp_path: Path) -> None:
    (tmp_path / "nccl").mkdir()
    (tmp_path / "nccl" / "rank0.log").write_text(
        "\n".join(real("issue226_nccl247_8hosts_socket.log"))
    )
    (tmp_path / "nccl" / "rank1.log").write_text(
        line("b", 1, "NCCL_IB_DISABLE set by environment to 1.")
    )
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        got = bundle_nccl(fd, 1 << 20)
    finally:
        os.close(fd)
    assert got["inter_node_transport"] == "socket" and got["user_choice"] == "NCCL_IB_DISABLE=1"
    empty = tmp_path / "empty"
    empty.mkdir()
    fd = os.open(empty, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert bundle_nccl(fd, 1 << 20) == {}
    finally:
        os.close(fd)


@pytest.mark.parametrize("bad", [None, [], {"hosts": "x", "intra_node_left_nvlink": "yes"}])
def test_facts_from_a_tampered_summary_are_unknown_not_errors(bad: object) -> None:
    f = NcclFacts.from_dict(bad)
    assert f.inter_node_transport is None and not f.intra_node_left_nvlink and f.hosts == ()
