"""A slice of the detection-quality corpus (benchmarks/detection_quality.py runs all of it),
the benchmark's own judgement, and the faults in the checks it found.

Each corpus case runs as prolog -> epilog -> next prolog on a simulated clock through the
real hooks (tests/support/detection.py); a verdict other than detected / ok is a false
drain, a missed fault or a wrong GPU a site would suffer.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from slurmhealth.checks import CheckContext, catalog
from slurmhealth.gpu.nvml import NvmlBackend
from slurmhealth.gpu.scenario import load_scenario
from slurmhealth.gpu.sim import SimulatedNvml
from slurmhealth.gpu.sim_device import SimHandle
from slurmhealth.kernel_log import KernelLogReader, format_kmsg_record
from slurmhealth.model import Action, Finding, GpuState, GpuStatus, NodeSnapshot, Severity
from tests.support.corpus_benign import benign_cases
from tests.support.corpus_common import blame, fault, scenario
from tests.support.corpus_faults import fault_cases
from tests.support.detection import Case, run_case

# the simulated clock starts now: the kernel-log reader's first read keeps the last hour by
# the real clock (hooks/check.py passes it time.time())
EPOCH = float(int(time.time()))

SLICE = (
    "nvlink_errors/h100-sxm/mild",  # a sustained replay rate, judged by the epilog
    "gpu_lost_no_xid/h100-sxm/gone",  # only the driver's multi-line message tells
    "xid_95/a100-sxm4/severe",  # MIG-prefixed lines with the driver's RST: Yes
    "stale_process/v100-sxm2/mild",  # left by the last job: the next prolog drains
    "pcie_downgrade/h100-sxm/severe",  # warn-level, seen only under load (check by hand)
    "gsp_timeout/h100-sxm/severe",  # the banner names no GPU, the next line does
    "driver_mismatch/v100-sxm2/mild",  # node-level: no GPU may be blamed
    "nvlink_one_replay/h100-sxm",  # one replay 5 s before a prolog
    "xid_94_contained/h100-sxm",  # contained: warn, no drain
    "busy_node_checked_by_hand/a100-sxm4",  # the job's own processes are not stale
    "xid_app/v100-sxm2/13+45",  # an application error and its cleanup
    "nvswitch_sxid_nonfatal/a100-sxm4",
)


def _by_name() -> dict[str, Case]:
    return {c.name: c for c in fault_cases() + benign_cases()}


def test_corpus_covers_every_class_and_model() -> None:
    faults, benign = fault_cases(), benign_cases()
    assert len(faults) >= 60 and len(benign) >= 20
    assert len({c.name for c in faults + benign}) == len(faults) + len(benign)
    assert {c.preset for c in faults} == {"h100-sxm", "a100-sxm4", "v100-sxm2"}
    assert all(c.blame or c.klass in ("driver_mismatch", "gpu_missing", "nvswitch_sxid_fatal")
               for c in faults)  # fmt: skip


@pytest.mark.parametrize("name", SLICE)
def test_corpus_slice(name: str, tmp_path: Path) -> None:
    outcome = run_case(_by_name()[name], tmp_path, EPOCH)
    assert outcome.verdict in ("detected", "ok"), (outcome.verdict, outcome.detail)


# -- the judgement can fail ------------------------------------------------------------------
def _case(expect: str, data: dict[str, object], gpus: tuple[int, ...]) -> Case:
    return Case("t", "t", "h100-sxm", expect, data, blame=blame("h100-sxm", *gpus))


def test_a_fault_nobody_drains_for_is_missed(tmp_path: Path) -> None:
    outcome = run_case(_case("drain", scenario("h100-sxm"), (3,)), tmp_path, EPOCH)
    assert (outcome.verdict, outcome.detail) == ("missed", "never drained")


def test_a_healthy_node_drained_is_a_false_drain(tmp_path: Path) -> None:
    data = scenario("h100-sxm", faults=[fault(60, 2, ecc_volatile_uncorrectable=1)])
    outcome = run_case(_case("ok", data, ()), tmp_path, EPOCH)
    assert outcome.verdict == "false_drain" and "ecc_uncorrectable gpu2" in outcome.detail


def test_draining_for_another_gpu_is_wrong_blame(tmp_path: Path) -> None:
    data = scenario("h100-sxm", gpu={5: {"nvlink.17.state": "inactive"}})
    outcome = run_case(_case("drain", data, (4,)), tmp_path, EPOCH)
    assert outcome.verdict == "wrong_gpu"


# -- faults in the checks the benchmark found ------------------------------------------------
BUSES = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]


def _snapshot(**fields: object) -> NodeSnapshot:
    gpus = tuple(
        GpuState(index=i, uuid=f"GPU-{i}", pci_bus_id=f"00000000:{b.upper()}:00.0", **fields)  # type: ignore[arg-type]
        for i, b in enumerate(BUSES)
    )
    return NodeSnapshot(node="n1", ts=EPOCH, gpus=gpus, device_count=len(gpus))


def _kernel_findings(texts: list[str], tmp_path: Path, **gpu: object) -> list[Finding]:
    log = tmp_path / "kmsg"
    log.write_text("".join(format_kmsg_record(n, 1_000 + n, t) + "\n" for n, t in enumerate(texts)))
    read = KernelLogReader(str(log), boot_time=EPOCH - 60).read_new(None, EPOCH)
    # a first read: every line is before the (rebuilt) position; judge them all the same
    ctx = CheckContext(
        _snapshot(**gpu),
        xids=read.events + read.old_events,
        kernel_events=read.kernel_events + read.old_kernel_events,
    )
    return [f for name in ("xid", "kernel_log") for f in catalog()[name].fn(ctx, {})]


def test_gsp_timeout_banner_is_blamed_on_the_gpu_its_report_names(tmp_path: Path) -> None:
    """The "*** GSP Timeout ***" banner names no GPU; the lines of the same report do. It
    used to be a node-level finding of its own, which led the drain reason (no GPU named)."""
    found = _kernel_findings(
        [
            "NVRM: ********************************* GSP Timeout *****************************",
            "NVRM: GPU1 _kgspRpcRecvPoll: LibOS heartbeat timed out",
        ],
        tmp_path,
    )
    assert [(f.check, f.gpu, f.severity, f.action) for f in found] == [
        ("kernel_log", 1, Severity.FAIL, Action.RESET)
    ]


def test_gsp_banner_alone_stays_a_node_finding(tmp_path: Path) -> None:
    found = _kernel_findings(["NVRM: *** GSP Timeout ***"], tmp_path)
    assert [(f.check, f.gpu, f.severity) for f in found] == [("kernel_log", None, Severity.FAIL)]


def test_a_fatal_sxid_with_its_detail_lines_is_one_fatal_finding(tmp_path: Path) -> None:
    dev = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034"
    found = _kernel_findings(
        [
            f"{dev}, Fatal, Link 48 LTSSM Fault Up",
            f"{dev}, Severity 1 Engine instance 48 Sub-engine instance 00",
            f"{dev}, Data {{0x10000000, 0x10000000, 0x00000000}}",
        ],
        tmp_path,
    )
    assert [(f.severity, f.message) for f in found] == [
        (Severity.FAIL, "fatal NVSwitch error 20034 on 0000:06:00.0")
    ]


@pytest.mark.parametrize(
    ("pending", "severity", "takes_node_out"),
    [(True, Severity.FAIL, True), (False, Severity.INFO, False)],
)
def test_xid_63_on_a_gpu_that_retires_pages(
    tmp_path: Path, pending: bool, severity: Severity, takes_node_out: bool
) -> None:
    """A V100 has no row remapper: whether Xid 63 needs a reset is its retired-pages
    pending flag (it used to read "row remap state unknown" and only warn)."""
    line = (
        "NVRM: Xid (PCI:0000:3a:00): 63, pid='<unknown>', name=<unknown>, Dynamic Page "
        "Retirement: New page retired, reboot to activate (0x00000000003c8f1a)."
    )
    [f] = _kernel_findings([line], tmp_path, retired_pages_pending=pending)
    assert (f.gpu, f.severity, f.action.takes_node_out) == (2, severity, takes_node_out)


def test_the_judged_outcome_round_trips_to_json(tmp_path: Path) -> None:
    case = dataclasses.replace(_by_name()["driver_mismatch/v100-sxm2/mild"], name="dm")
    doc = run_case(case, tmp_path, EPOCH).to_dict()
    assert doc["verdict"] == "detected" and doc["steps"][0]["drain_state"] == "drained"


def test_one_aer_error_reported_by_port_and_device_counts_once(tmp_path: Path) -> None:
    """Linux reports one AER error twice (the port's "error received", the device's "PCIe
    Bus Error"): the finding read "(x2)" for a single fatal error."""
    found = _kernel_findings(
        [
            "pcieport 0000:5c:00.0: AER: Uncorrected (Fatal) error received: 0000:5d:00.0",
            "nvidia 0000:5d:00.0: PCIe Bus Error: severity=Uncorrected (Fatal), "
            "type=Inaccessible, (Unregistered Agent ID)",
        ],
        tmp_path,
    )
    assert [(f.gpu, f.severity, f.evidence["count"]) for f in found] == [(3, Severity.CRITICAL, 1)]
    assert "(x" not in found[0].message


class _Starved(SimulatedNvml):
    """Every NVML call answers, two of them slowly: a process starved of CPU, not a hung
    GPU (each call well inside the deadline, the whole read past it)."""

    def nvmlDeviceGetName(self, h: SimHandle) -> str:
        time.sleep(0.3)
        return super().nvmlDeviceGetName(h)

    def nvmlDeviceGetSerial(self, h: SimHandle) -> str:
        time.sleep(0.3)
        return super().nvmlDeviceGetSerial(h)


def test_a_slow_read_that_keeps_answering_is_not_an_unresponsive_gpu(tmp_path: Path) -> None:
    """The 1,000 node-day soak drained healthy nodes as "GPU unresponsive" when the machine
    was overloaded: the deadline judged the whole read, not a hung call."""
    path = tmp_path / "v100.toml"
    path.write_text('preset = "v100-sxm2"\ngpus = 1\n')
    lib = _Starved(load_scenario(str(path)), "n1", epoch=EPOCH, kernel_log_path=str(tmp_path / "k"))
    backend = NvmlBackend(lib, node="n1", timeout_s=0.4)
    try:
        t0 = time.monotonic()
        snap = backend.snapshot()
        took = time.monotonic() - t0
    finally:
        backend.close()
    assert took > 0.4  # slower than the deadline...
    assert [g.status for g in snap.gpus] == [GpuStatus.OK]  # ...and still read


def test_a_hung_call_is_still_unresponsive_at_the_deadline(tmp_path: Path) -> None:
    path = tmp_path / "hang.toml"
    path.write_text('preset = "v100-sxm2"\ngpus = 2\n[gpu.1]\nhang = true\nhang_s = 30.0\n')
    lib = SimulatedNvml(
        load_scenario(str(path)), "n1", epoch=EPOCH, kernel_log_path=str(tmp_path / "k")
    )
    backend = NvmlBackend(lib, node="n1", timeout_s=0.25)
    try:
        t0 = time.monotonic()
        snap = backend.snapshot()
        took = time.monotonic() - t0
    finally:
        backend.close()
    assert [g.status for g in snap.gpus] == [GpuStatus.OK, GpuStatus.UNRESPONSIVE]
    assert took < 0.25 + 10  # cut at the deadline, not after the 30 s hang (busy-CI slack)


def test_a_healthy_node_day_soaks_without_a_drain(tmp_path: Path) -> None:
    """The soak's path (benchmarks/detection_quality.py runs 1,000 node-days of it) on one
    node-day, so a change that breaks it (a config it no longer accepts) fails here."""
    from tests.support.soak import soak

    result = soak(tmp_path, EPOCH, nodes=1, days=1.0)
    assert result.runs["prolog"] > 0 and result.runs["epilog"] > 0, result.runs
    assert result.drains == [] and result.alarms == [], (result.drains, result.alarms)


def test_the_network_corpus_is_detected_without_false_drains(tmp_path: Path) -> None:
    """benchmarks/detection_quality.py's network part: each mlx5 case's expected action
    through the hooks, each NCCL case's expected rules and no other NCCL rule."""
    from tests.support.corpus_network import judge_nccl, nccl_cases, network_cases

    for c in network_cases(tmp_path / "rdma-tree"):
        o = run_case(c, tmp_path / c.name.replace("/", "_"), EPOCH)
        assert o.verdict == ("ok" if c.expect == "ok" else "detected"), (c.name, o.detail)
    for n in nccl_cases():
        assert judge_nccl(n) == set(n.expect), n.name
