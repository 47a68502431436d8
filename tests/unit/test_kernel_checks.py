"""From kernel-log text to findings: the reader's events, the ``xid`` and ``kernel_log`` checks."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from slurmhealth.checks import CheckContext, catalog
from slurmhealth.hooks.check import CheckResult
from slurmhealth.kernel_log import KernelLogReader, format_kmsg_record
from slurmhealth.model import Action, Finding, GpuState, NodeSnapshot, Severity
from tests.conftest import run_cli

BOOT = 1_700_000_000.0
RESET = Action.RESET
NOW = BOOT + 10_000.0
BUSES = ["18", "2a", "3a", "5d", "9a", "ab", "b3", "db"]


def snapshot() -> NodeSnapshot:
    gpus = tuple(
        GpuState(index=i, uuid=f"GPU-{i}", pci_bus_id=f"00000000:{b.upper()}:00.0")
        for i, b in enumerate(BUSES)
    )
    return NodeSnapshot(node="gpu-node-01", ts=NOW, gpus=gpus, device_count=len(gpus))


def kmsg_file(tmp_path: Path, texts: list[str]) -> Path:
    log = tmp_path / "kmsg.log"
    recs = [format_kmsg_record(n, 9_000_000_000 + n, t) for n, t in enumerate(texts, 1)]
    log.write_text("".join(r + "\n" for r in recs))
    return log


# positions from before the log was replaced / the node rebooted: what is new in the last
# hour counts (with no position at all, everything read is old and only recorded)
EARLIER_FILE = {"source": "file", "path": "x", "inode": 0, "dev": 0, "offset": 0, "line": 0}
EARLIER_BOOT = {"source": "dmesg", "boot_id": "an earlier boot", "usec": 0, "n_at": 0}
NO_JOURNAL_ENTRY_YET = {"source": "journalctl", "cursor": None}


def judge(texts: list[str], tmp_path: Path) -> list[Finding]:
    """Read ``texts`` as kmsg records and run the two kernel-log checks on the result."""
    log = str(kmsg_file(tmp_path, texts))
    res = KernelLogReader(log, boot_time=BOOT).read_new(EARLIER_FILE, NOW)
    assert res.available and res.error is None
    ctx = CheckContext(snapshot(), xids=res.events, kernel_events=res.kernel_events)
    specs = catalog()
    return [f for name in ("xid", "kernel_log") for f in specs[name].fn(ctx, {})]


def exit_code(findings: list[Finding]) -> int:
    result = CheckResult("r", "gpu-node-01", "prolog", None, snapshot(), tuple(findings), 0.0)
    return result.exit_code


# -- Xid verdicts ------------------------------------------------------------------------------
def test_contained_xid_94_warns_and_exits_0(tmp_path: Path) -> None:
    line = (
        "NVRM: Xid (PCI:0000:b3:00): 94, pid='<unknown>', name=<unknown>, "
        "Contained: SM (0x1). RST: No, D-RST: No"
    )
    [f] = judge([line], tmp_path)
    assert (f.check, f.gpu, f.severity, f.action) == ("xid", 6, Severity.WARN, Action.RECORD)
    assert f.evidence["basis"] == "driver"
    assert exit_code([f]) == 0


def test_uncontained_xid_95_drains_and_resets(tmp_path: Path) -> None:
    line = (
        "NVRM: Xid (PCI:0000:5d:00): 95, pid=7062, Uncontained: LTC TAG (0x2,0x1). "
        "RST: Yes, D-RST: No"
    )
    [f] = judge([line], tmp_path)
    assert (f.gpu, f.severity, f.action) == (3, Severity.CRITICAL, Action.RESET)
    assert f.action.takes_node_out and exit_code([f]) == 1


def test_xid_45_names_its_cause(tmp_path: Path) -> None:
    findings = judge(
        [
            "NVRM: Xid (PCI:0000:18:00): 62, 32260b5e 000154b0 00000000 2026da96",
            "NVRM: Xid (PCI:0000:18:00): 45, pid=2864945, name=kit, Ch 0000000b",
            "NVRM: Xid (PCI:0000:2a:00): 45, pid=9, name=p, Ch 01 caused by previous Xid 149",
        ],
        tmp_path,
    )
    by = {(f.evidence["xid"], f.gpu): f for f in findings}
    assert by[(45, 0)].evidence["caused_by"] == 62 and "caused by Xid 62" in by[(45, 0)].message
    assert by[(45, 1)].evidence["caused_by"] == 149
    assert by[(45, 0)].severity is Severity.INFO and by[(62, 0)].action is Action.RESET


# -- faults without an Xid ----------------------------------------------------------------------
FALLEN = [
    "NVRM: The NVIDIA GPU 0000:b3:00.0",
    "NVRM: (PCI ID: 10de:2330) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
]


@pytest.mark.parametrize(
    ("texts", "gpu", "severity", "action"),
    [
        (FALLEN, 6, Severity.CRITICAL, Action.RESET),
        (["\n".join(FALLEN)], 6, Severity.CRITICAL, Action.RESET),
        (
            ["NVRM: GPU 0000:9a:00.0: GPU has fallen off the bus."],
            4,
            Severity.CRITICAL,
            Action.RESET,
        ),
        (
            ["NVRM: GPU2 _kgspIsHeartbeatTimedOut: Heartbeat timed out ... timeout 5200"],
            2,
            Severity.FAIL,
            Action.RESET,
        ),
        (
            ["NVRM: GPU 0000:db:00.0: RmInitAdapter failed! (0x62:0x40:1941)"],
            7,
            Severity.FAIL,
            Action.RESET,
        ),
        (
            ["nvidia 0000:ab:00.0: probe with driver nvidia failed with error -1"],
            5,
            Severity.FAIL,
            Action.RESET,
        ),
        (
            ["pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:3a:00.0"],
            2,
            Severity.CRITICAL,
            Action.RESET,
        ),
        (
            [
                "nvidia 0000:3a:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
                "(Receiver ID)"
            ],
            2,
            Severity.WARN,
            Action.RECORD,
        ),
    ],
)
def test_fault_on_the_gpu_the_line_names(
    tmp_path: Path, texts: list[str], gpu: int, severity: Severity, action: Action
) -> None:
    [f] = judge(texts, tmp_path)
    assert (f.check, f.gpu, f.uuid, f.severity, f.action) == (
        "kernel_log",
        gpu,
        f"GPU-{gpu}",
        severity,
        action,
    )


@pytest.mark.parametrize(
    ("text", "severity", "action"),
    [
        ("NVRM: RmInitAdapter failed! (0x30:0xffff:660)", Severity.FAIL, Action.RESET),
        ("NVRM: None of the NVIDIA devices were initialized.", Severity.FAIL, Action.RESET),
        (
            "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 30 sourcetrack "
            "timeout error",
            Severity.FAIL,
            Action.DRAIN,
        ),
        (
            "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress "
            "non-posted PRIV error (First)",
            Severity.WARN,
            Action.RECORD,
        ),
        (
            "pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:c1:00.0",
            Severity.WARN,
            Action.RECORD,
        ),
    ],
)
def test_node_level_faults(tmp_path: Path, text: str, severity: Severity, action: Action) -> None:
    [f] = judge([text], tmp_path)
    assert (f.check, f.gpu, f.severity, f.action) == ("kernel_log", None, severity, action)


def test_corrected_aer_on_another_device_is_not_a_gpu_fault(tmp_path: Path) -> None:
    line = "mlx5_core 0000:c1:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer"
    assert judge([line], tmp_path) == []


def test_gsp_lines_after_their_xid_119_are_one_finding(tmp_path: Path) -> None:
    findings = judge(
        [
            "NVRM: GPU at PCI:0000:5d:00: GPU-c9696075-b0f8-0e72-1ab7-13e7bdf9b678",
            "NVRM: Xid (PCI:0000:5d:00): 119, pid=2357, name=nv-hostengine, Timeout waiting "
            "for RPC from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x90cc0301 0xc).",
            "NVRM: GPU0 GSP RPC buffer contains function 76 (GSP_RM_CONTROL) and data "
            "0x0000000090cc0301 0x000000000000000c.",
        ],
        tmp_path,
    )
    assert [(f.check, f.gpu, f.action) for f in findings] == [("xid", 3, Action.RESET)]


def test_repeated_faults_aggregate(tmp_path: Path) -> None:
    line = "nvidia 0000:18:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer"
    [f] = judge([line] * 5, tmp_path)
    assert f.evidence["count"] == 5 and "x5" in f.message


# -- the reader hands over kernel events from every source ---------------------------------------
def fake_binary(tmp_path: Path, name: str, output: str) -> str:
    out = tmp_path / f"{name}.out"
    out.write_text(output)
    script = tmp_path / name
    script.write_text(
        f"#!{sys.executable}\nimport sys\nsys.stdout.write(open({str(out)!r}).read())\n"
    )
    script.chmod(0o755)
    return str(script)


def test_dmesg_continuation_lines_join_the_fallen_off_message(tmp_path: Path) -> None:
    out = (
        "<3>[ 9843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        "               NVRM: fallen off the bus and is not responding to commands.\n"
        "<6>[ 9844.000000] unrelated\n"
    )
    r = KernelLogReader("dmesg", boot_time=BOOT)
    r.dmesg_cmd = (fake_binary(tmp_path, "dmesg", out),)
    res = r.read_new(EARLIER_BOOT, NOW)
    assert [(e.kind, e.pci_bus_id) for e in res.kernel_events] == [
        ("fallen_off_bus", "0000:b3:00.0")
    ]
    assert res.kernel_events[0].ts == pytest.approx(BOOT + 9843.308145)


def test_journal_message_with_newlines(tmp_path: Path) -> None:
    entry = {"__CURSOR": "c1", "__REALTIME_TIMESTAMP": str(int((NOW - 60) * 1e6))}
    entry["MESSAGE"] = "\n".join(FALLEN)
    r = KernelLogReader("journalctl")
    r.journalctl_cmd = (fake_binary(tmp_path, "journalctl", json.dumps(entry) + "\n"),)
    res = r.read_new(NO_JOURNAL_ENTRY_YET, NOW)
    assert [(e.kind, e.pci_bus_id, e.ts) for e in res.kernel_events] == [
        ("fallen_off_bus", "0000:b3:00.0", pytest.approx(NOW - 60))
    ]


def test_first_read_skips_old_kernel_events(tmp_path: Path) -> None:
    log = tmp_path / "kmsg.log"
    old = format_kmsg_record(1, 1_000_000, "NVRM: RmInitAdapter failed! (0x30:0xffff:660)")
    new = format_kmsg_record(2, 9_900_000_000, "NVRM: None of the NVIDIA devices were initialized.")
    log.write_text(old + "\n" + new + "\n")
    res = KernelLogReader(str(log), boot_time=BOOT).read_new(EARLIER_FILE, NOW)
    assert [e.seq for e in res.kernel_events] == [2]
    rebuilt = KernelLogReader(str(log), boot_time=BOOT).read_new(None, NOW)
    assert (rebuilt.kernel_events, [e.seq for e in rebuilt.old_kernel_events]) == ((), [2])


# the driver's verdict alone: uncontained, yet neither RST nor D-RST asked for
UNCONTAINED_NO_RST = (
    "NVRM: Xid (PCI:0000:b3:00): 94, pid='<unknown>', name=<unknown>, "
    "Uncontained: SM (0x1). RST: No, D-RST: No"
)


def test_uncontained_xid_94_without_rst_still_drains_and_resets(tmp_path: Path) -> None:
    [f] = judge([UNCONTAINED_NO_RST], tmp_path)
    assert (f.gpu, f.severity, f.action) == (6, Severity.FAIL, Action.RESET)
    assert f.evidence["basis"] == "driver" and "uncontained: reset required" in f.message
    assert exit_code([f]) == 1


def test_check_exits_1_when_the_kernel_log_gains_an_uncontained_xid(
    sim_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    """`slurmhealth check` on a node whose kernel log gains the line: exit 1, a reset."""
    log = tmp_path / "kmsg.log"
    log.touch()
    env = sim_env("healthy", SLURMHEALTH_KERNEL_LOG=str(log))
    assert run_cli("check", env=env).returncode == 0  # the position now lies at the end
    uptime_usec = int(float(Path("/proc/uptime").read_text().split()[0]) * 1e6)
    line = UNCONTAINED_NO_RST.replace("0000:b3:00", "0000:18:00")  # the scenario's GPU 0
    log.write_text(format_kmsg_record(1, uptime_usec, line) + "\n")
    proc = run_cli("check", "--json", env=env)
    assert proc.returncode == 1, proc.stderr
    [xid] = [f for f in json.loads(proc.stdout)["findings"] if f["check"] == "xid"]
    assert (xid["gpu"], xid["severity"], xid["action"]) == (0, "fail", "reset")
    assert "Xid 94" in xid["message"] and "uncontained" in xid["message"]
