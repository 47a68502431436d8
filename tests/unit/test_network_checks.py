"""The network checks over generated sysfs trees: every fault is found on the right HCA and
port, with the GPUs behind it and the right severity; the healthy presets (4-HCA NDR,
8-HCA NDR, RoCE) give nothing; one flap 5 s apart warns, a sustained flap rate fails."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from slurmhealth.checks import PHASES, CheckContext, run_checks, window_of
from slurmhealth.checks.counters import load, pack, remember
from slurmhealth.checks.network import rdma_counters_of
from slurmhealth.config import load_config
from slurmhealth.errors import ConfigError
from slurmhealth.hooks.drain import drain_reason
from slurmhealth.model import Action, Finding, Severity
from slurmhealth.rdma import expect_from, read_rdma, simtree
from slurmhealth.rdma.model import RdmaExpect, RdmaSnapshot
from tests.conftest import run_cli
from tests.unit.test_checks import TS, node

NDR = RdmaExpect(hca_count=4, rate_gbps=400, gpudirect=True, link_layer="InfiniBand")
NET = ("ib_port_state", "ib_rate", "ib_hca_count", "ib_errors", "gpudirect")


class Node:
    """One node's generated sysfs tree, checked run after run with its counter history kept
    as the prolog keeps it (JSON)."""

    def __init__(self, root: Path, spec: simtree.NodeSpec, expect: RdmaExpect = NDR) -> None:
        self.root, self.spec, self.expect = str(root), spec, expect
        self.stored: Any = None
        self.written = False

    def run(self, t: float = 0.0, phase: str = "prolog") -> list[Finding]:
        if self.written:
            simtree.update_counters(self.root, self.spec, t)
        else:
            simtree.write_tree(self.root, self.spec, t)
            self.written = True
        rdma = read_rdma(self.root, ts=TS + t)
        snap = node(ts=TS + t)
        history = load(self.stored)
        ctx = CheckContext(
            snap, phase=phase, counter_history=history, rdma=rdma, rdma_expect=self.expect
        )
        findings = run_checks(ctx)
        counters = rdma_counters_of(rdma)
        self.stored = json.loads(json.dumps(pack(remember(history, snap, window_of(), counters))))
        return [f for f in findings if f.check in NET]


def one(findings: list[Finding], check: str) -> Finding:
    assert [f.check for f in findings] == [check], [f.message for f in findings]
    return findings[0]


@pytest.mark.parametrize(
    ("preset", "expect"),
    [
        ("ndr4", NDR),
        ("ndr8", RdmaExpect(hca_count=8, rate_gbps=400, gpudirect=True)),
        ("roce8", RdmaExpect(hca_count=8, rate_gbps=400, gpudirect=True, link_layer="Ethernet")),
    ],
)
def test_healthy_presets_have_no_findings_in_any_phase(
    tmp_path: Path, preset: str, expect: RdmaExpect
) -> None:
    n = Node(tmp_path, simtree.preset(preset), expect)
    for t, phase in enumerate(PHASES):
        assert n.run(t * 60.0, phase) == [], phase


@pytest.mark.parametrize(
    ("fault", "state"),
    [
        ("down", "DOWN/Polling"),
        ("polling", "DOWN/Polling"),
        ("init", "INIT/LinkUp"),
        ("disabled", "DOWN/Disabled"),
    ],
)
def test_a_port_not_active_fails_on_its_hca_naming_the_gpus_behind_it(
    tmp_path: Path, fault: str, state: str
) -> None:
    spec = simtree.fault(simtree.preset("ndr4"), fault, "mlx5_1")
    fabric = RdmaExpect(hca_count=4, rate_gbps=400, devices=tuple(f"mlx5_{i}" for i in range(4)))
    f = one(Node(tmp_path, spec, fabric).run(), "ib_port_state")
    assert (f.severity, f.action) == (Severity.FAIL, Action.DRAIN)
    assert f.message == f"mlx5_1/1 port {state} (GPUs 2,3 behind it)"
    assert (f.evidence["hca"], f.evidence["port"], f.evidence["gpus"]) == ("mlx5_1", 1, [2, 3])
    assert f.evidence["pci_bus_id"] == "0000:3c:00.0"
    assert drain_reason([f]).startswith("slurmhealth: ib_port_state mlx5_1/1 port")


def test_a_port_down_outside_a_named_fabric_is_recorded_never_drained(tmp_path: Path) -> None:
    """Without [rdma] devices a down port may be one nobody cabled (a dual-port card's
    second port): recorded with the hint, no drain, no evidence bundle."""
    spec = simtree.fault(simtree.preset("ndr4"), "down", "mlx5_1")
    f = one(Node(tmp_path, spec, RdmaExpect(hca_count=4)).run(), "ib_port_state")
    assert (f.severity, f.action) == (Severity.INFO, Action.RECORD)
    assert "name the fabric's ports in [rdma] devices" in f.message


def test_8_hca_node_names_the_one_gpu_sharing_the_switch(tmp_path: Path) -> None:
    spec = simtree.fault(simtree.preset("ndr8"), "down", "mlx5_5")
    f = one(Node(tmp_path, spec, RdmaExpect(hca_count=8)).run(), "ib_port_state")
    assert f.message.endswith("(GPU 5 behind it)") and f.evidence["hca"] == "mlx5_5"


def test_an_hca_on_a_switch_without_gpus_names_the_unserved_gpus_of_its_numa_node(
    tmp_path: Path,
) -> None:
    spec = simtree.preset("ndr4")
    spec.switches.append(0x50)  # a switch of its own on NUMA node 0 (GPUs 0-3's node)
    spec.hcas[1].switch = len(spec.switches) - 1
    spec = simtree.fault(spec, "down", "mlx5_1")
    f = one(Node(tmp_path, spec, RdmaExpect(devices=("mlx5_1",))).run(), "ib_port_state")
    # GPUs 0 and 1 share mlx5_0's switch: theirs; 2 and 3 have no HCA of their own
    assert f.evidence["gpus"] == [2, 3] and f.message.endswith("(GPUs 2,3 behind it)")


def test_a_degraded_rate_fails_on_its_port(tmp_path: Path) -> None:
    spec = simtree.fault(simtree.preset("ndr4"), "rate", "mlx5_2")
    f = one(Node(tmp_path, spec).run(), "ib_rate")
    assert f.severity is Severity.FAIL
    assert f.message.startswith("mlx5_2/1 rate 200 Gb/sec (4X HDR), expected 400 Gb/sec")
    assert (f.evidence["rate_gbps"], f.evidence["gpus"]) == (200.0, [4, 5])


def test_a_narrower_link_at_the_same_speed_is_a_lower_rate(tmp_path: Path) -> None:
    spec = simtree.fault(simtree.preset("ndr8"), "rate", "mlx5_0", rate="200 Gb/sec (2X NDR)")
    f = one(Node(tmp_path, spec, RdmaExpect(rate_gbps=400)).run(), "ib_rate")
    assert (f.evidence["width"], f.evidence["speed"]) == (2, "NDR")


def test_rate_unchecked_without_an_expected_rate(tmp_path: Path) -> None:
    spec = simtree.fault(simtree.preset("ndr4"), "rate", "mlx5_2")
    assert Node(tmp_path, spec, RdmaExpect()).run() == []


def test_a_missing_hca_fails_the_count_and_names_it_when_devices_are_listed(
    tmp_path: Path,
) -> None:
    spec = simtree.fault(simtree.preset("ndr4"), "missing", "mlx5_3")
    f = one(Node(tmp_path / "a", spec).run(), "ib_hca_count")
    assert (f.severity, f.message) == (Severity.FAIL, "3 RDMA devices, expected 4")
    named = RdmaExpect(hca_count=4, devices=("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"))
    f = one(Node(tmp_path / "b", spec, named).run(), "ib_hca_count")
    assert f.message == "3 RDMA devices, expected 4: mlx5_3 missing"


def test_peermem_missing_fails_only_where_gpudirect_is_expected(tmp_path: Path) -> None:
    spec = simtree.preset("ndr4")
    spec.peermem = False
    f = one(Node(tmp_path / "a", spec).run(), "gpudirect")
    assert (f.severity, f.action) == (Severity.FAIL, Action.DRAIN)
    assert Node(tmp_path / "b", spec, RdmaExpect(hca_count=4)).run() == []


def test_ports_outside_the_fabric_are_not_judged(tmp_path: Path) -> None:
    """A management Ethernet port that is down does not drain an InfiniBand node, nor does
    a port left out of [rdma] devices."""
    spec = simtree.preset("ndr4")
    spec.hcas[3].ports[1].link_layer = "Ethernet"
    spec = simtree.fault(spec, "down", "mlx5_3")
    assert Node(tmp_path / "a", spec, RdmaExpect(link_layer="InfiniBand")).run() == []
    fabric = RdmaExpect(devices=("mlx5_0", "mlx5_1", "mlx5_2/1"))
    assert Node(tmp_path / "b", spec, fabric).run() == []
    assert one(Node(tmp_path / "c", spec, RdmaExpect()).run(), "ib_port_state")


@pytest.mark.parametrize(
    ("counter", "per_s"),
    [
        ("symbol_error", 1.0),
        ("link_error_recovery", 0.1),
        ("link_downed", 0.05),
        ("port_rcv_errors", 1.0),
        ("excessive_buffer_overrun_errors", 0.1),
        ("port_xmit_discards", 5.0),
    ],
)
def test_a_sustained_error_rate_fails_on_its_port(
    tmp_path: Path, counter: str, per_s: float
) -> None:
    spec = simtree.fault(simtree.preset("ndr4"), "counter", "mlx5_1", counter=counter, per_s=per_s)
    n = Node(tmp_path, spec)
    assert n.run(0) == []
    for t in (60, 120, 180, 240):
        assert all(f.severity < Severity.FAIL for f in n.run(t)), t
    f = one(n.run(330), "ib_errors")
    assert (f.severity, f.action) == (Severity.FAIL, Action.DRAIN)
    assert f.evidence["failing"] == [counter] and f.evidence["gpus"] == [2, 3]
    assert f.message.startswith(f"mlx5_1/1 errors growing: {counter} +")
    assert drain_reason([f]).startswith("slurmhealth: ib_errors mlx5_1/1 ")


def test_one_flap_5_s_apart_warns_and_never_drains(tmp_path: Path) -> None:
    spec = simtree.fault(simtree.preset("ndr4"), "flaps", "mlx5_1", at=[3.0])
    n = Node(tmp_path, spec)
    assert n.run(0) == []  # the epilog
    f = one(n.run(5), "ib_errors")  # the next prolog
    assert (f.severity, f.action) == (Severity.WARN, Action.WARN)
    assert f.evidence["counts"] == {"link_downed": 1} and f.evidence["failing"] == []
    later = n.run(600)
    assert all(x.severity < Severity.FAIL for x in later)


def test_a_sustained_flap_rate_drains(tmp_path: Path) -> None:
    flaps = [float(t) for t in range(20, 400, 40)]  # one every 40 s
    spec = simtree.fault(simtree.preset("ndr4"), "flaps", "mlx5_0", at=flaps)
    n = Node(tmp_path, spec)
    worst = [max((f.severity for f in n.run(t)), default=Severity.OK) for t in range(0, 420, 30)]
    assert worst[-1] is Severity.FAIL
    assert Severity.FAIL not in worst[:10]  # not before 300 s of evidence


def test_a_few_transmit_discards_are_congestion_not_a_finding(tmp_path: Path) -> None:
    spec = simtree.fault(
        simtree.preset("ndr4"), "counter", "mlx5_1", counter="port_xmit_discards", per_s=0.5
    )
    n = Node(tmp_path, spec)
    assert [n.run(t) for t in (0, 120, 330)] == [[], [], []]


def test_a_counter_reset_is_not_growth(tmp_path: Path) -> None:
    spec = simtree.preset("ndr4")
    spec.hcas[0].ports[1].counters["symbol_error"] = 5000
    n = Node(tmp_path, spec)
    assert n.run(0) == []
    spec.hcas[0].ports[1].counters["symbol_error"] = 0  # the driver reloaded
    assert n.run(400) == []


def test_nothing_is_judged_without_an_rdma_read() -> None:
    ctx = CheckContext(node(), rdma_expect=NDR)
    assert [f for f in run_checks(ctx) if f.check in NET] == []


def test_config_rdma_section_and_ranges(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text(
        "[rdma]\nexpected_hcas = 8\nexpected_rate_gbps = 400\ngpudirect = true\n"
        'link_layer = "InfiniBand"\ndevices = ["mlx5_0", "mlx5_1/1"]\n'
    )
    expect = expect_from(load_config(str(good), env={}))
    assert expect == RdmaExpect(8, 400.0, True, "InfiniBand", ("mlx5_0", "mlx5_1/1"))
    for line, key in (
        ("expected_hcas = -1", "rdma.expected_hcas"),
        ("expected_rate_gbps = 1e9", "rdma.expected_rate_gbps"),
        ('link_layer = "Infiniband"', "rdma.link_layer"),
    ):
        bad = tmp_path / "bad.toml"
        bad.write_text(f"[rdma]\n{line}\n")
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(str(bad), env={})


def test_a_saturated_counter_warns_that_its_rate_is_unknown(tmp_path: Path) -> None:
    spec = simtree.preset("ndr4")
    spec.hcas[2].ports[1].counters["symbol_error"] = 65535  # 16 bits, stuck at the top
    f = one(Node(tmp_path, spec).run(), "ib_errors")
    assert (f.severity, f.action, f.evidence["saturated"]) == (
        Severity.WARN,
        Action.WARN,
        ["symbol_error"],
    )
    assert f.message.startswith("mlx5_2/1 symbol_error saturated")


def test_an_unreadable_rdma_class_is_recorded_not_a_missing_hca() -> None:
    rdma = RdmaSnapshot(TS, error="cannot list /sys/class/infiniband: Permission denied")
    findings = run_checks(CheckContext(node(), rdma=rdma, rdma_expect=NDR))
    f = one([f for f in findings if f.check in NET], "ib_hca_count")
    assert (f.severity, f.action) == (Severity.WARN, Action.RECORD)


def _check_with_tree(tmp_path: Path, sim_env: Any, spec: simtree.NodeSpec) -> Any:
    """`slurmhealth check --json` on a simulated node whose sysfs holds ``spec``'s HCAs."""
    import json

    from tests.conftest import run_cli

    root = tmp_path / "sys"
    simtree.write_tree(str(root), spec)
    env = sim_env("healthy", SLURMHEALTH_RDMA_SYSFS=str(root))
    fabric = ", ".join(f'"mlx5_{i}"' for i in range(4))
    (tmp_path / "config.toml").write_text(f"[rdma]\ndevices = [{fabric}]\nexpected_hcas = 4\n")
    proc = run_cli("check", "--json", env=env)
    return proc.returncode, json.loads(proc.stdout)


def test_the_check_command_reads_the_nodes_hcas_and_fails_a_port_down(
    tmp_path: Path, sim_env: Any
) -> None:
    code, data = _check_with_tree(tmp_path, sim_env, simtree.preset("ndr4"))
    assert code == 0 and data["findings"] == []
    down = simtree.fault(simtree.preset("ndr4"), "down", "mlx5_1")
    code, data = _check_with_tree(tmp_path, sim_env, down)
    assert code == 1
    (f,) = data["findings"]
    assert (f["check"], f["severity"]) == ("ib_port_state", "fail")
    assert f["message"].startswith("mlx5_1/1 port DOWN")


def test_a_node_expecting_hcas_that_shows_none_fails_the_count(
    tmp_path: Path, sim_env: Callable[..., dict[str, str]]
) -> None:
    """The mlx5 driver did not load: no /sys/class/infiniband at all. A node that must show
    4 HCAs is not a node without a network."""
    env = sim_env("healthy")
    cfg = Path(env["SLURMHEALTH_CONFIG"])
    cfg.write_text(cfg.read_text() + f'[rdma]\nsysfs_root = "{tmp_path}/sys"\nexpected_hcas = 4\n')
    proc = run_cli("check", "--json", env=env)
    assert proc.returncode == 1, proc.stderr
    found = [f for f in json.loads(proc.stdout)["findings"] if f["check"] == "ib_hca_count"]
    assert found and found[0]["severity"] == "fail", found
    cfg.write_text(cfg.read_text().replace("expected_hcas = 4", "expected_hcas = 0"))
    assert run_cli("check", env=env).returncode == 0  # no expectation: nothing to judge
