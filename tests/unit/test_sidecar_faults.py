"""The sidecar's kernel-reported faults: Xids with the driver's own verdict, and the faults
that come without an Xid, judged exactly as the prolog/epilog checks judge them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurmhealth.checks import CheckContext, catalog
from slurmhealth.config import ChecksConfig, Config
from slurmhealth.kernel_log.parse import parse_xid
from slurmhealth.kernel_log.patterns import parse_events
from slurmhealth.model import Severity, XidEvent
from slurmhealth.model_records import KernelEvent
from slurmhealth.sidecar.detectors import KINDS, Detectors
from tests.unit.test_detectors import T0, gpu, snap

BY_BUS = {gpu(i).pci_bus_id or "": i for i in range(8)}  # 18 2a 3a 5d 9a ab ba db
FALLEN_9A = [
    "NVRM: The NVIDIA GPU 0000:9a:00.0",
    "NVRM: (PCI ID: 10de:2330) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
]
GSP_GPU2 = "NVRM: GPU2 _kgspIsHeartbeatTimedOut: Heartbeat timed out ... timeout 5200"
SXID_FATAL = (
    "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 30 sourcetrack timeout error"
)


def xid(line: str) -> XidEvent:
    x = parse_xid(line, ts=T0 + 5)
    assert x is not None
    return x


def faults(lines: list[str]) -> list[KernelEvent]:
    return [replace(e, ts=T0 + 7) for e in parse_events(lines)]


def started(gpus: list[int] | None = None, cfg: Config | None = None) -> Detectors:
    det = Detectors(cfg or Config(), list(range(8)) if gpus is None else gpus)
    det.observe(snap(0))
    return det


def test_contained_xid_94_mid_job_is_a_warning_event_not_a_critical_one() -> None:
    det = started()
    line = (
        "NVRM: Xid (PCI:0000:5d:00): 94, pid=4242, name=python, "
        "Contained: SM (0x1). RST: No, D-RST: No"
    )
    (ev,) = det.observe_xids([xid(line)], BY_BUS)
    assert (ev.kind, ev.gpu, ev.severity, ev.ts) == ("xid", 3, Severity.WARN, T0 + 5)
    assert ev.evidence["basis"] == "driver" and ev.evidence["action"] == "record"
    # the driver's "reset required" makes the same Xid number act
    line = (
        "NVRM: Xid (PCI:0000:5d:00): 95, pid=7062, "
        "Uncontained: LTC TAG (0x2,0x1). RST: Yes, D-RST: No"
    )
    (ev,) = det.observe_xids([xid(line)], BY_BUS)
    assert (ev.gpu, ev.severity, ev.evidence["action"]) == (3, Severity.CRITICAL, "reset")


@pytest.mark.parametrize(
    ("lines", "gpu_index", "severity"),
    [
        (FALLEN_9A, 4, Severity.CRITICAL),
        ([GSP_GPU2], 2, Severity.FAIL),
        ([SXID_FATAL], None, Severity.FAIL),  # an NVSwitch: the node's, so every job's
    ],
)
def test_faults_without_an_xid_become_one_kernel_event_judged_as_the_check_judges(
    lines: list[str], gpu_index: int | None, severity: Severity
) -> None:
    det = started()
    (ev,) = det.observe_kernel(faults(lines))
    assert (ev.kind, ev.gpu, ev.severity, ev.ts) == ("kernel", gpu_index, severity, T0 + 7)
    # one place decides: the kernel_log check over the same lines says the same
    ctx = CheckContext(snap(0), kernel_events=tuple(faults(lines)))
    (f,) = catalog()["kernel_log"].fn(ctx, {})
    assert (f.gpu, f.severity, f.message, f.action.value) == (
        ev.gpu,
        ev.severity,
        ev.message,
        ev.evidence["action"],
    )
    assert "kernel" in KINDS


def test_a_fault_on_another_jobs_gpu_is_not_this_jobs_event() -> None:
    det = started(gpus=[0, 1, 2, 3])
    assert det.observe_kernel(faults(FALLEN_9A)) == []  # GPU 4 (9a) belongs to another job
    (ev,) = det.observe_kernel(faults([SXID_FATAL]))  # the NVSwitch serves every GPU
    assert ev.gpu is None and ev.severity is Severity.FAIL


def test_an_acting_xid_covers_the_other_faults_of_its_gpu() -> None:
    det = started()
    x79 = xid("NVRM: Xid (PCI:0000:9a:00): 79, pid=1, name=p, GPU has fallen off the bus.")
    events = det.observe_xids([x79], BY_BUS) + det.observe_kernel(faults(FALLEN_9A), [x79])
    assert [(e.kind, e.gpu, e.severity) for e in events] == [("xid", 4, Severity.CRITICAL)]


def test_disabled_kernel_log_check_gives_no_kernel_events() -> None:
    det = started(cfg=Config(checks=ChecksConfig(disabled=("kernel_log",))))
    assert det.observe_kernel(faults(FALLEN_9A)) == []


def test_no_kernel_events_before_the_first_snapshot() -> None:
    det = Detectors(Config(), [0])  # which GPUs are the job's is not known yet
    assert det.observe_kernel(faults(FALLEN_9A)) == []
