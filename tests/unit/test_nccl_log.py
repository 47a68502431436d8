"""NCCL_DEBUG=INFO transport lines: which transport each channel used, and the two verdicts
(intra-node traffic off NVLink/P2P, inter-node traffic on sockets). Lines follow the formats
NCCL 2.4 to 2.2x print (see slurmhealth/diagnose/nccl_log.py), with made-up hosts and ranks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.diagnose import nccl_log
from slurmhealth.diagnose.nccl_log import INTER_SOCKET, INTRA_SLOW, classify, parse, parse_channel


def line(host: str, pid: int, dev: int, msg: str) -> str:
    return f"{host}:{pid}:{pid + 90} [{dev}] NCCL INFO {msg}\n"


@pytest.mark.parametrize(
    ("via", "expected"),
    [
        ("P2P/IPC", ("P2P", None)),
        ("P2P/IPC/read", ("P2P", None)),
        ("P2P/CUMEM/read", ("P2P", None)),
        ("P2P/direct pointer", ("P2P", None)),
        ("SHM/direct/direct", ("SHM", None)),
        ("SHM/CE/CE", ("SHM", None)),
        ("direct shared memory", ("SHM", None)),
        ("NET/IB/0/GDRDMA", ("NET", "IB")),
        ("NET/IB/3", ("NET", "IB")),
        ("NET/IBext/1/GDRDMA", ("NET", "IB")),
        ("NET/IBext_v8/0/GDRDMA/Shared", ("NET", "IB")),
        ("NET/Socket/0", ("NET", "Socket")),
        ("NET/AWS Libfabric/0/GDRDMA", ("NET", "AWS Libfabric")),
        ("NVLS", ("NVLS", None)),
        ("CollNet/0", ("COLLNET", None)),
        ("something new", ("OTHER", None)),
    ],
)
def test_transport_of_each_documented_via(via: str, expected: tuple[str, str | None]) -> None:
    assert classify(via) == expected


@pytest.mark.parametrize(
    ("text", "rank", "peer", "channel"),
    [
        ("gpu7:919:1150 [0] NCCL INFO Channel 01/0 : 8[0] -> 15[7] via P2P/IPC/read", 8, 15, 1),
        (
            "m1:16194:18586 [6] NCCL INFO Channel 03 : 7[b2000] -> 14[b1000] [receive] via "
            "NET/IB/0/GDRDMA",
            14,
            7,
            3,
        ),
        ("old:20:289 [0] NCCL INFO Ring 00 : 0[0] -> 1[1] via P2P/IPC", 0, 1, 0),
        (
            "2025-11-12 20:42:20,261 - INFO - g340-cd51:4450:4887 [5] NCCL INFO Channel 31/1 : "
            "5[5] -> 0[0] via P2P/IPC",
            5,
            0,
            31,
        ),
        (
            "[2025-01-02 03:04:05] a-b.c:1:2 [3] NCCL INFO Channel 12/0 : 3[3] -> 2[2] [send] via "
            "NET/Socket/1",
            3,
            2,
            12,
        ),
    ],
)
def test_channel_lines_across_versions(text: str, rank: int, peer: int, channel: int) -> None:
    ch = parse_channel(text)
    assert ch is not None
    assert (ch.rank, ch.peer, ch.channel) == (rank, peer, channel)


def test_lines_that_are_not_channels() -> None:
    for text in (
        "n1:1:1 [0] NCCL INFO Connected all rings",
        "n1:1:1 [0] NCCL WARN Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",  # not INFO
        "Channel 00/0 : 0[0] -> 1[1] via P2P/IPC",  # no prefix
        "n1:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC" + " " * 3000,
    ):
        assert parse_channel(text) is None


def healthy_two_nodes(net: str = "NET/IB/0/GDRDMA") -> list[str]:
    """2 nodes x 2 GPUs: ranks 0,1 on a, 2,3 on b; a ring 0->1->2->3->0."""
    out = []
    for host, pid, dev, rank in (
        ("a", 100, 0, 0),
        ("a", 101, 1, 1),
        ("b", 200, 0, 2),
        ("b", 201, 1, 3),
    ):
        out.append(
            line(
                host,
                pid,
                dev,
                f"comm 0x55d1 rank {rank} nranks 4 cudaDev {dev} "
                "nvmlDev 0 busId 18000 commId 0xf0 - Init COMPLETE",
            )
        )
    out.append(line("a", 100, 0, "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"))
    out.append(line("b", 200, 0, "Channel 00/0 : 2[0] -> 3[1] via P2P/CUMEM/read"))
    out.append(line("a", 101, 1, f"Channel 00/0 : 1[1] -> 2[0] [send] via {net}"))
    out.append(line("b", 200, 0, f"Channel 00/0 : 1[1] -> 2[0] [receive] via {net}"))
    out.append(line("b", 201, 1, f"Channel 00/0 : 3[1] -> 0[0] [send] via {net}"))
    out.append(line("a", 100, 0, f"Channel 00/0 : 3[1] -> 0[0] [receive] via {net}"))
    return out


def test_a_healthy_job_names_each_ranks_transports_and_flags_nothing() -> None:
    got = parse(healthy_two_nodes())
    assert not got.flags
    assert got.ranks[("a", 0)].intra == ("P2P",)
    assert got.ranks[("a", 0)].inter == ("IB",)
    assert got.ranks[("b", 2)].inter == ("IB",)
    assert got.ranks[("b", 3)].inter == ("IB",)


def test_inter_node_sockets_are_flagged_with_the_rank_pairs() -> None:
    got = parse(healthy_two_nodes("NET/Socket/0"))
    assert [f.kind for f in got.flags] == [INTER_SOCKET]
    assert (1, 2) in got.flags[0].ranks and (0, 3) in got.flags[0].ranks
    assert got.ranks[("a", 1)].inter == ("Socket",)


def test_shm_between_gpus_of_one_node_is_flagged() -> None:
    lines = healthy_two_nodes()
    lines[4] = line("a", 100, 0, "Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct")
    got = parse(lines)
    assert [f.kind for f in got.flags] == [INTRA_SLOW]
    assert got.flags[0].ranks == ((0, 1),)
    assert "SHM" in got.flags[0].text
    assert got.ranks[("a", 0)].intra == ("SHM",)


def test_net_between_ranks_known_on_one_host_is_intra_node() -> None:
    """NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 on one node: the GPUs talk over the NIC."""
    lines = [
        line("a", 1, 0, "comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0"),
        line("a", 2, 1, "comm 0x2 rank 1 nRanks 2 nNodes 1 localRanks 2 localRank 1 MNNVL 0"),
        line("a", 1, 0, "Channel 00/0 : 0[0] -> 1[1] [send] via NET/IB/0"),
    ]
    got = parse(lines)
    assert [f.kind for f in got.flags] == [INTRA_SLOW]
    assert got.ranks[("a", 0)].intra == ("NET",)
    assert got.ranks[("a", 0)].inter == ()


def test_chosen_network_without_channel_lines() -> None:
    lines = [
        line("a", 1, 0, "NET/IB : No device found."),
        line("a", 1, 0, "NET/Socket : Using [0]eth0:10.0.0.1<0>"),
        line("a", 1, 0, "Using network Socket"),
        line("b", 2, 0, "NET/Socket : Using [0]eth0:10.0.0.2<0>"),
        line("b", 2, 0, "Using network Socket"),
    ]
    got = parse(lines)
    assert got.networks == {"a": {"Socket"}, "b": {"Socket"}}
    assert got.no_ib_device == {"a"}
    assert [f.kind for f in got.flags] == [INTER_SOCKET]
    # one node alone: sockets are never used between its GPUs, nothing to flag
    assert not parse(lines[:3]).flags


def test_ib_network_is_not_a_fallback() -> None:
    lines = [
        line("a", 1, 0, "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB ib0:10.1.0.1<0>"),
        line("a", 1, 0, "Using network IB"),
        line("b", 2, 0, "Using network IBext_v8"),
    ]
    got = parse(lines)
    assert not got.flags
    assert got.networks["a"] == {"IB"}


def test_hostile_input_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nccl_log, "MAX_EDGES", 10)
    lines = [
        line("a", 1, 0, f"Channel 00/0 : {i}[0] -> {i + 1}[0] via SHM/direct/direct")
        for i in range(50)
    ]
    lines.append("x" * 10_000)
    got = parse(lines)
    assert got.skipped_lines == 1
    assert len(got.ranks) == 10
    assert len(got.flags[0].ranks) == nccl_log.MAX_EXAMPLES


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=300), max_size=30))
def test_fuzz_never_raises(lines: list[str]) -> None:
    parse(lines)


_PIECES = st.sampled_from(
    [
        "n1:1:2 [0] NCCL INFO ",
        "Channel ",
        "Ring ",
        "00/0",
        " : ",
        "0[0]",
        " -> ",
        "1[1]",
        " [send]",
        " [receive]",
        " via ",
        "NET/",
        "Socket/0",
        "IB/0",
        "SHM",
        "P2P/IPC",
        "rank 1 ",
        "nranks 2",
        "Using network ",
        "[",
        "]",
        ":",
        "/",
        " ",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_PIECES, max_size=14).map("".join), max_size=20))
def test_fuzz_near_miss_lines(lines: list[str]) -> None:
    got = parse(lines)
    for key, rt in got.ranks.items():
        assert key == (rt.host, rt.rank)
        assert set(rt.intra) <= {"P2P", "SHM", "NET", "NVLS", "COLLNET", "OTHER"}
    for text in lines:
        ch = parse_channel(text)
        assert ch is None or ch.via in text
