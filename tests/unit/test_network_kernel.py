"""mlx5 kernel-log lines from the reader to a finding on the right HCA: the kernel-log reader
hands them on as network events, ``ib_kernel_log`` names the HCA (and the GPUs behind it)
and drains only for a cable/module error or a firmware failure on the fabric's HCA; the GPU
``kernel_log`` check leaves them alone; the sidecar records them while the job runs."""

from __future__ import annotations

from pathlib import Path

from slurmhealth.checks import CheckContext, catalog, run_check, run_checks
from slurmhealth.config import ChecksConfig
from slurmhealth.hooks.drain import drain_reason
from slurmhealth.kernel_log import KernelLogReader, format_kmsg_record
from slurmhealth.model import Action, Severity
from slurmhealth.model_records import KernelEvent
from slurmhealth.rdma import read_rdma, simtree
from slurmhealth.rdma.model import RdmaExpect
from slurmhealth.sidecar.faults import KernelFaults
from tests.unit.test_checks import TS, node

BOOT = 1_700_000_000.0
MLX5_1 = "0000:3c:00.0"  # ndr4: mlx5_1 shares the PCIe switch of GPUs 2 and 3
LINES = [
    f"mlx5_core {MLX5_1}: Port module event[error]: module 1, Cable error, High Temperature",
    f"mlx5_core {MLX5_1} ibp60s0: Link down",
    f"mlx5_core {MLX5_1} ibp60s0: Link up",
    f"mlx5_core {MLX5_1}: Port module event: module 1, Cable plugged",
    "mlx5_core 0000:1a:00.0: firmware version: 28.39.1002",  # not a fault
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.90.07",  # not one either
]


def kernel_events(tmp_path: Path, lines: list[str], net: bool = True) -> tuple[KernelEvent, ...]:
    log = tmp_path / "kmsg"
    recs = [format_kmsg_record(i + 1, 5_000_000 + i, t) for i, t in enumerate(lines)]
    log.write_text("".join(r + "\n" for r in recs))
    res = KernelLogReader(str(log), boot_time=BOOT, net=net).read_new(None, BOOT + 10)
    return res.kernel_events + res.old_kernel_events


def ctx(tmp_path: Path, events: tuple[KernelEvent, ...], devices: tuple[str, ...]) -> CheckContext:
    simtree.write_tree(str(tmp_path / "sys"), simtree.preset("ndr4"))
    rdma = read_rdma(str(tmp_path / "sys"), ts=TS)
    expect = RdmaExpect(devices=devices)
    return CheckContext(node(), kernel_events=events, rdma=rdma, rdma_expect=expect)


def test_the_reader_passes_mlx5_faults_on_and_nothing_else(tmp_path: Path) -> None:
    events = kernel_events(tmp_path, LINES)
    assert [(e.kind, e.pci_bus_id) for e in events] == [
        ("net_module_error", MLX5_1),
        ("net_link_down", MLX5_1),
        ("net_link_up", MLX5_1),
        ("net_module", MLX5_1),
    ]
    assert events[1].device == "ibp60s0" and events[0].code == 1


def test_a_node_without_rdma_devices_does_not_parse_mlx5_lines(tmp_path: Path) -> None:
    assert kernel_events(tmp_path, LINES, net=False) == ()  # the hooks: cfg.has_rdma()


def test_a_cable_error_on_the_fabrics_hca_drains_naming_it_and_its_gpus(tmp_path: Path) -> None:
    c = ctx(tmp_path, kernel_events(tmp_path, LINES), ("mlx5_0", "mlx5_1"))
    found = run_check(catalog()["ib_kernel_log"], c)
    assert [(f.severity, f.action, f.evidence["kind"]) for f in found] == [
        (Severity.FAIL, Action.DRAIN, "net_module_error"),
        (Severity.WARN, Action.RECORD, "net_link_down"),
    ]  # link up and a cable plugged in are not findings
    assert found[0].message == "mlx5_1 cable/module error: High Temperature (GPUs 2,3 behind it)"
    assert found[1].message.startswith("mlx5_1 link down")
    assert found[1].evidence["netdev"] == "ibp60s0" and found[1].evidence["hca"] == "mlx5_1"
    assert drain_reason(found).startswith("slurmhealth: ib_kernel_log mlx5_1 cable/module error")


def test_outside_the_named_fabric_a_cable_error_is_only_recorded(tmp_path: Path) -> None:
    events = kernel_events(tmp_path, LINES[:1])
    for devices in ((), ("mlx5_0",)):
        (f,) = run_check(catalog()["ib_kernel_log"], ctx(tmp_path, events, devices))
        assert (f.severity, f.action) == (Severity.WARN, Action.RECORD)


def test_without_the_rdma_read_the_finding_names_the_pci_function(tmp_path: Path) -> None:
    events = kernel_events(tmp_path, LINES[:1])
    (f,) = run_check(catalog()["ib_kernel_log"], CheckContext(node(), kernel_events=events))
    assert f.message == f"mlx5_core {MLX5_1} cable/module error: High Temperature"
    assert f.severity is Severity.WARN


def test_the_gpu_kernel_log_check_leaves_network_lines_alone(tmp_path: Path) -> None:
    c = ctx(tmp_path, kernel_events(tmp_path, LINES), ("mlx5_1",))
    checks = {f.check for f in run_checks(c)}
    assert "kernel_log" not in checks and "ib_kernel_log" in checks


def test_the_sidecar_records_an_hcas_kernel_fault_for_the_job(tmp_path: Path) -> None:
    events = kernel_events(tmp_path, LINES[:2])
    faults = KernelFaults(ChecksConfig(), [0, 1])  # the job's GPUs are not behind mlx5_1
    out = faults.kernel(events, (), node(), TS)
    assert sorted(e.evidence["kind"] for e in out) == ["net_link_down", "net_module_error"]
    off = KernelFaults(ChecksConfig(disabled=["ib_kernel_log"]), [0, 1])
    assert off.kernel(events, (), node(), TS) == []
