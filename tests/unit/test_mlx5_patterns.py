"""The mlx5 pattern table against the driver's own format strings, filled the way the
driver fills them (``%u``, ``%d``, ``%x``, ``%llx``, ``%s``), behind both device prefixes;
the real lines of public reports (``tests/data/mlx5``, see SOURCES); and the verdict each
kind gets: firmware fatal states and command-interface hangs drain, one link flap warns,
repeated flaps within the window drain, informational lines record."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurmhealth.checks import CheckContext, catalog, run_check
from slurmhealth.checks.network_kernel import VERDICTS
from slurmhealth.hooks.drain import drain_reason
from slurmhealth.kernel_log import split_line
from slurmhealth.kernel_log.net_patterns import NET_EVENT_KINDS, PATTERNS, parse_net_event
from slurmhealth.model import Action, Severity
from slurmhealth.model_records import KernelEvent
from slurmhealth.rdma import read_rdma, simtree
from slurmhealth.rdma.model import RdmaExpect
from tests.unit.test_checks import TS, node

DATA = Path(__file__).resolve().parents[1] / "data" / "mlx5"
MLX5_1 = "0000:3c:00.0"  # ndr4: mlx5_1, behind the PCIe switch of GPUs 2 and 3
PREFIXES = (
    f"mlx5_core {MLX5_1}: ",
    f"mlx5_core {MLX5_1}: poll_health:800:(pid 0): ",
    f"mlx5_core {MLX5_1} ibp60s0: ",
)
# pattern -> (printf arguments, code, level) as the driver fills them
FILLED: dict[str, tuple[tuple[object, ...], int | None, str]] = {
    "link_down": ((), None, "warn"),
    "link_up": ((), None, "info"),
    "module_error": ((1, "Cable error", "High Temperature"), 1, "error"),
    "module_cable_error": ((2, "Cable error"), 2, "error"),
    "module": ((0, "Cable unplugged"), 0, "warn"),
    "temperature": ((0x1, 0x40), None, "warn"),
    "pcie_power": ((27,), 27, "error"),
    "fatal_error": ((5,), 5, "fatal"),
    "miss_count": ((), None, "fatal"),
    "iseg_reads": ((), None, "fatal"),
    "internal_state": ((), None, "fatal"),
    "recovery_aborted": ((), None, "fatal"),
    "health_issue": (("firmware internal error", 3, "ERROR"), None, "error"),
    "health_synd": ((0x1, "firmware internal error"), 1, "error"),
    "cmd_no_completion": ((0, "ACCESS_REG", 0x805), 0x805, "fatal"),
    "cmd_leak": (("DESTROY_RMP", 0x90E), 0x90E, "fatal"),
    "cmd_canceled": (("CREATE_MKEY", 0x200), 0x200, "fatal"),
    "cmd_recovered": ((3, "QUERY_VPORT_STATE", 0x750), 0x750, "warn"),
    "cmd_late": ((0,), None, "warn"),
    "cmd_failed": (("ACCESS_REG", 0x805, 0x1, "bad parameter", 0x3, 0x1F2E3D, -22), 0x805,
                   "info"),
    "pci_error": (("mlx5_pci_err_detected", 1, 1, 1, 2), 2, "fatal"),
    "pci_slot": ((), None, "fatal"),
}  # fmt: skip


def cprintf(fmt: str, args: tuple[object, ...]) -> str:
    """C printf for the conversions the driver uses here."""
    py = re.sub(r"%l{0,2}([udxs])", lambda m: "%" + {"u": "d"}.get(m[1], m[1]), fmt)
    return py % args


def test_every_pattern_has_filled_values_and_a_verdict() -> None:
    assert set(FILLED) == {p.name for p in PATTERNS}
    assert set(NET_EVENT_KINDS) <= set(VERDICTS)


@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: p.name)
@pytest.mark.parametrize("prefix", PREFIXES)
def test_each_pattern_reads_its_format_string_filled(pattern: object, prefix: str) -> None:
    name, fmt, kind = pattern.name, pattern.fmt, pattern.kind  # type: ignore[attr-defined]
    args, code, level = FILLED[name]
    line = prefix + cprintf(fmt, args)
    e = parse_net_event(line, seq=3, ts=7.0)
    assert e is not None, line
    assert (e.kind, e.code, e.level, e.pci_bus_id) == (kind, code, level, MLX5_1), line
    assert e.device == ("ibp60s0" if "ibp60s0" in prefix else "mlx5_core")


@pytest.mark.parametrize(
    "line",
    [
        f"mlx5_core {MLX5_1}: firmware version: 28.39.1002",
        f"mlx5_core {MLX5_1}: Port module event: module 0, Cable plugged",  # parsed, info
        f"mlx5_core {MLX5_1}: mlx5_trigger_health_work:756:(pid 0): new health works are "
        "not permitted at this stage",
        "e1000e 0000:00:1f.6 eno1: Link is Down",
    ],
)
def test_lines_that_are_not_findings(tmp_path: Path, line: str) -> None:
    e = parse_net_event(line)
    events = (e,) if e is not None else ()
    assert run_check(catalog()["ib_kernel_log"], ctx(tmp_path, events)) == []


def ctx(tmp_path: Path, events: tuple[KernelEvent, ...]) -> CheckContext:
    simtree.write_tree(str(tmp_path / "sys"), simtree.preset("ndr4"))
    rdma = read_rdma(str(tmp_path / "sys"), ts=TS)
    expect = RdmaExpect(devices=("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"))
    return CheckContext(node(), kernel_events=events, rdma=rdma, rdma_expect=expect)


def real(name: str, bus: str) -> tuple[KernelEvent, ...]:
    """A public report's lines, its HCA's address replaced by ndr4's mlx5_1."""
    out = []
    for i, raw in enumerate((DATA / name).read_text().splitlines()):
        text = split_line(raw).text.replace(bus, MLX5_1)
        if (e := parse_net_event(text, seq=i, ts=1000.0 + i)) is not None:
            out.append(e)
    return tuple(out)


def test_a_numbered_fatal_error_after_an_eeh_freeze_drains_naming_the_sensor(
    tmp_path: Path,
) -> None:
    events = real("netdev_2022_eeh_sriov.log", "400f:01:00.0")
    kinds = [e.kind for e in events]
    assert kinds == ["net_link_up", "net_link_up", "net_health", "net_pci_error",
                     "net_cmd_timeout", "net_cmd_timeout"]  # fmt: skip
    found = run_check(catalog()["ib_kernel_log"], ctx(tmp_path, events))
    by_kind = {f.evidence["kind"]: f for f in found}
    fatal = by_kind["net_health"]
    assert (fatal.severity, fatal.action) == (Severity.CRITICAL, Action.DRAIN)
    assert fatal.message == (
        "mlx5_1 firmware fatal error 1 (PCI communication lost) (GPUs 2,3 behind it)"
    )
    cmd = by_kind["net_cmd_timeout"]  # a consequence of the fatal state: it still drains
    assert (cmd.severity, cmd.action, cmd.evidence["count"]) == (Severity.FAIL,
                                                                   Action.DRAIN, 2)  # fmt: skip
    assert cmd.message.startswith("mlx5_1 command interface timeout after the firmware's "
                                  "fatal error: DESTROY_RMP(0x90e) (x2)")  # fmt: skip
    assert by_kind["net_pci_error"].action == Action.DRAIN
    assert drain_reason(found).startswith(
        "slurmhealth: ib_kernel_log mlx5_1 firmware fatal error 1 (PCI communication lost)"
    )


def test_a_command_interface_hang_on_connectx7_drains_its_late_completion_records(
    tmp_path: Path,
) -> None:
    events = real("netdev_2025_cx7_access_reg.log", "0000:56:00.0")
    assert [(e.kind, e.code) for e in events] == [
        ("net_cmd_timeout", 0x805), ("net_cmd_timeout", 0x805), ("net_cmd_late", None)]  # fmt: skip
    found = run_check(catalog()["ib_kernel_log"], ctx(tmp_path, events))
    assert [(f.evidence["kind"], f.severity, f.action) for f in found] == [
        ("net_cmd_timeout", Severity.CRITICAL, Action.DRAIN),
        ("net_cmd_late", Severity.WARN, Action.RECORD),
    ]
    reason = drain_reason(found)
    assert reason.startswith(
        "slurmhealth: ib_kernel_log mlx5_1 command interface timeout: ACCESS_REG(0x805)"
    ), reason
    (e,) = real("kernel_2024_create_uctx.log", "0000:06:00.0")  # cmd[-22]: an unset index
    assert (e.kind, e.code) == ("net_cmd_timeout", 0xA04)


def _downs(times: list[float]) -> tuple[KernelEvent, ...]:
    line = f"mlx5_core {MLX5_1} ibp60s0: Link down"
    return tuple(e for i, t in enumerate(times) if (e := parse_net_event(line, seq=i, ts=t)))


def test_one_flap_warns_repeated_flaps_within_the_window_drain(tmp_path: Path) -> None:
    check = catalog()["ib_kernel_log"]
    (one,) = run_check(check, ctx(tmp_path, _downs([100.0])))
    assert (one.severity, one.action) == (Severity.WARN, Action.RECORD)
    (burst,) = run_check(check, ctx(tmp_path, _downs([100.0, 160.0, 400.0])))
    assert (burst.severity, burst.action) == (Severity.FAIL, Action.DRAIN)
    assert burst.message.startswith("mlx5_1 link flapping (3 link-downs within 600 s)")
    (spread,) = run_check(check, ctx(tmp_path, _downs([0.0, 3600.0, 7200.0])))
    assert (spread.severity, spread.action, spread.evidence["count"]) == (
        Severity.WARN, Action.RECORD, 3)  # fmt: skip


def test_informational_and_warning_lines_are_recorded_not_drained(tmp_path: Path) -> None:
    lines = [
        cprintf(PREFIXES[1] + "%s(0x%x) op_mod(0x%x) failed, status %s(0x%x), syndrome "
                "(0x%x), err(%d)", ("ACCESS_REG", 0x805, 1, "bad parameter", 3, 0x1234, -22)),
        PREFIXES[0] + "Health issue observed, High temperature, severity(4) WARNING:",
        PREFIXES[0] + "High temperature on sensors with bit set 0 1",
        PREFIXES[0] + "mlx5_pci_err_detected Device state = 1 health sensors: 0 "
        "pci_status: 1. Enter, pci channel state = 1",
    ]  # fmt: skip
    events = tuple(e for t in lines if (e := parse_net_event(t)))
    found = run_check(catalog()["ib_kernel_log"], ctx(tmp_path, events))
    assert {f.evidence["kind"]: (f.severity, f.action) for f in found} == {
        "net_cmd_error": (Severity.INFO, Action.RECORD),
        "net_health_warn": (Severity.WARN, Action.RECORD),
        "net_temperature": (Severity.WARN, Action.RECORD),
        "net_pci_warn": (Severity.WARN, Action.RECORD),
    }
