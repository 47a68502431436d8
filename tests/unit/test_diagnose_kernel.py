"""Diagnosis of the kernel-log faults that come without an Xid: from the kernel's own lines,
through the kernel_log check as the epilog records its findings, to the report's diagnosis."""

from __future__ import annotations

from typing import Any

import pytest

from slurmhealth.checks import CheckContext, catalog
from slurmhealth.diagnose.engine import diagnose, verdict
from slurmhealth.diagnose.facts import Diagnosis, Facts, NodeFacts
from slurmhealth.kernel_log import parse_xid
from slurmhealth.kernel_log.patterns import parse_events
from slurmhealth.model import Finding, GpuState, NodeSnapshot
from slurmhealth.model_records import Job

T0 = 1_700_000_000.0  # 22:13:20Z
BUSES = ["18", "2a", "3a", "5d", "9a", "ab", "b3", "db"]  # GPU i sits at 0000:<BUSES[i]>:00.0
FALLEN = [
    "NVRM: The NVIDIA GPU 0000:b3:00.0",
    "NVRM: (PCI ID: 10de:2330) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
]
GSP = "NVRM: GPU3 _kgspIsHeartbeatTimedOut: Heartbeat timed out, curtime 0x1b9ad9d3a5 timeout 5200"
SXID_FATAL = (
    "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 30 sourcetrack timeout error"
)
SXID_NONFATAL = (
    "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted "
    "PRIV error (First)"
)
AER_FATAL = "pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:3a:00.0"
XID79 = "NVRM: Xid (PCI:0000:b3:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
SEVERE = ("fail", "critical")


def epilog_findings(lines: list[str], node: str = "n1") -> tuple[dict[str, Any], ...]:
    """``lines`` read from the kernel log after the job, judged by the xid and kernel_log
    checks, as the history's findings rows."""
    gpus = tuple(
        GpuState(index=i, uuid=f"GPU-{i}", pci_bus_id=f"00000000:{b.upper()}:00.0")
        for i, b in enumerate(BUSES)
    )
    snap = NodeSnapshot(node=node, ts=T0, gpus=gpus, device_count=len(gpus))
    xids = tuple(x for line in lines if (x := parse_xid(line, ts=T0)) is not None)
    events = tuple(e for e in parse_events(lines) if e is not None)
    ctx = CheckContext(snap, phase="epilog", xids=xids, kernel_events=events)
    found = [f for name in ("xid", "kernel_log") for f in catalog()[name].fn(ctx, {})]
    return tuple(_row(i, node, f) for i, f in enumerate(found, 1))


def _row(i: int, node: str, f: Finding) -> dict[str, Any]:
    row = {"id": i, "run_id": "r1", "ts": T0 + 5, "node": node, "job_id": "42", **f.to_dict()}
    row["check_name"] = row.pop("check")
    return row


def report(lines: list[str], **node_kw: Any) -> tuple[list[Diagnosis], Facts]:
    n = NodeFacts(node="n1", findings=epilog_findings(lines), **node_kw)
    job = Job(job_id="42", node_names=("n1",), state="failed", exit_code="1:0", end_ts=T0 + 9)
    f = Facts(job=job, nodes=(n,))
    return diagnose(f), f


def only_severe(ds: list[Diagnosis]) -> Diagnosis:
    severe = [d for d in ds if d.severity in SEVERE]
    assert len(severe) == 1, [(d.rule, d.severity) for d in ds]
    return severe[0]


def test_gpu_fallen_off_the_bus_without_an_xid() -> None:
    ds, f = report(FALLEN)
    d = only_severe(ds)
    assert (d.rule, d.node, d.gpu, d.severity) == ("gpu_fell_off_bus", "n1", 6, "critical")
    assert "GPU 6 on n1 (PCI 0000:b3:00.0) stopped answering on PCIe" in d.root_cause
    (cite,) = d.citations
    assert cite.kind == "finding" and cite.gpu == 6
    assert "kernel: NVRM: The NVIDIA GPU 0000:b3:00.0 NVRM: (PCI ID: 10de:2330)" in cite.text
    assert "fallen off the bus and is not responding" in cite.text
    assert verdict(ds, f).startswith("GPU 6 on n1 fell off the bus at 22:13:25Z")
    assert "application_error" not in [x.rule for x in ds]  # the hardware explains the failure


def test_gsp_timeout_without_an_xid_names_the_gpu() -> None:
    ds, _ = report([GSP])
    d = only_severe(ds)
    assert (d.rule, d.gpu, d.severity) == ("gsp_timeout", 3, "critical")
    assert "GPU System Processor firmware of GPU 3 on n1" in d.root_cause
    assert "(Xid" not in d.root_cause
    assert "kernel: " + GSP in d.citations[0].text
    assert "nvidia-smi -r -i 3" in d.action


def test_gsp_timeout_in_the_kernel_tail_alone_names_the_node() -> None:
    line = "[ 9843.308145] NVRM: _kgspLogXid119: ****************** GSP Timeout ******************"
    n = NodeFacts(node="n1", logs={"kernel": f"[ 9843.1] usb 1-1: new device\n{line}\n"})
    ds = diagnose(Facts(job=Job(job_id="42", node_names=("n1",)), nodes=(n,)))
    d = only_severe(ds)
    assert (d.rule, d.node, d.gpu) == ("gsp_timeout", "n1", None)
    assert [(c.kind, c.text) for c in d.citations] == [("log", line)]


@pytest.mark.parametrize(
    ("line", "severity", "words"),
    [
        (SXID_FATAL, "fail", "SXid 24007 (fatal)"),
        (SXID_NONFATAL, "warn", "SXid 12028 (non-fatal)"),
    ],
)
def test_nvswitch_sxid_is_the_nodes(line: str, severity: str, words: str) -> None:
    ds, f = report([line])
    d = next(d for d in ds if d.rule == "nvswitch_error")
    assert (d.node, d.gpu, d.severity) == ("n1", None, severity)
    assert f"An NVSwitch of n1 (PCI {line.split('PCI:')[1][:12]})" in d.root_cause
    assert words in d.root_cause and "kernel: " + line in d.citations[0].text
    assert [x.rule for x in ds if x.severity in SEVERE and x.rule != "nvswitch_error"] == []
    if severity == "fail":
        assert verdict(ds, f) == f"NVSwitch {words} on n1 at 22:13:25Z"


def test_fatal_pcie_aer_on_a_gpu() -> None:
    ds, _ = report([AER_FATAL])
    d = only_severe(ds)
    assert (d.rule, d.gpu, d.severity) == ("pcie_bus_error", 2, "critical")
    assert "GPU 2 on n1 (PCI 0000:3a:00.0) reported an uncorrectable PCIe error (fatal)" in (
        d.root_cause
    )
    assert "lspci -vv -s 0000:3a:00.0" in d.verify and "kernel: " + AER_FATAL in d.citations[0].text


def test_corrected_pcie_errors_are_no_diagnosis() -> None:
    line = "nvidia 0000:3a:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer"
    ds, _ = report([line])
    assert [d.rule for d in ds if d.rule != "application_error"] == []


def test_init_failure_on_a_gpu() -> None:
    ds, _ = report(["NVRM: GPU 0000:5d:00.0: RmInitAdapter failed! (0x11:0x45:2540)"])
    d = only_severe(ds)
    assert (d.rule, d.gpu, d.severity) == ("gpu_init_failed", 3, "fail")
    assert "could not initialize GPU 3 on n1 (PCI 0000:5d:00.0)" in d.root_cause


def test_xid_79_with_its_fallen_off_message_is_one_diagnosis() -> None:
    ds, _ = report([XID79, *FALLEN])
    d = only_severe(ds)
    assert (d.rule, d.gpu) == ("gpu_fell_off_bus", 6) and "(Xid 79)" in d.root_cause


def test_faults_logged_before_a_rebuilt_position_are_not_the_jobs() -> None:
    rows = tuple(
        {
            **r,
            "severity": "warn",
            "action": "record",
            "evidence": {**r["evidence"], "predates_position": True},
        }
        for r in epilog_findings([XID79, *FALLEN])
    )
    n = NodeFacts(node="n1", findings=rows)
    assert diagnose(Facts(job=Job(job_id="42", node_names=("n1",)), nodes=(n,))) == []
