"""In-job detectors on hand-built snapshot sequences.

Every test runs a healthy 8x H100 node sampled every 10 s and breaks one thing with
``dataclasses.replace``, then asserts the one event that must come out: kind, GPU, severity,
time, and that it fires once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from functools import lru_cache

from slurmhealth.config import Config, SidecarConfig
from slurmhealth.model import GpuState, GpuStatus, NodeSnapshot, NvLink, Severity, XidEvent
from slurmhealth.model_records import TaskStats
from slurmhealth.sidecar.detectors import KINDS, Detectors
from slurmhealth.sidecar.state import Event
from slurmhealth.sidecar.task import StepRecord

H100 = "NVIDIA H100 80GB HBM3"
BUS = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
T0 = 1_700_000_000.0
JOB_GPUS = list(range(8))


@lru_cache(maxsize=256)
def gpu(index: int, util: float = 95.0, links: int = 18) -> GpuState:
    """A healthy H100 SXM under load: ``util`` percent busy, power in proportion."""
    return GpuState(
        index=index,
        uuid=f"GPU-{index:08d}-aaaa-bbbb-cccc-dddddddddddd",
        name=H100,
        pci_bus_id=f"00000000:{BUS[index]}:00.0",
        temperature_c=60,
        power_w=100.0 + 6.0 * util,
        power_limit_w=700.0,
        utilization_gpu_pct=int(util),
        sm_clock_mhz=1980,
        clock_event_reasons=0x0,
        ecc_volatile_uncorrectable=0,
        remap_pending=False,
        remap_failure=False,
        nvlinks=tuple(
            NvLink(link=n, active=True, replay_errors=0, recovery_errors=0, crc_flit_errors=0)
            for n in range(links)
        ),
    )


def snap(t: float, util: float = 95.0, **per_gpu: GpuState) -> NodeSnapshot:
    """The node at ``T0 + t``; ``g3=...`` replaces GPU 3."""
    gpus = tuple(per_gpu.get(f"g{i}", gpu(i, util)) for i in range(8))
    return NodeSnapshot(node="node1", ts=T0 + t, gpus=gpus, device_count=8)


def run(
    det: Detectors, times: Iterable[float], make: Callable[[float], NodeSnapshot]
) -> list[Event]:
    out: list[Event] = []
    for t in times:
        out += det.observe(make(t))
    return out


def detectors(**cfg: float) -> Detectors:
    return Detectors(Config(sidecar=SidecarConfig(**cfg)), JOB_GPUS)  # type: ignore[arg-type]


def only(events: list[Event]) -> Event:
    assert len(events) == 1, [(e.kind, e.gpu, e.ts - T0) for e in events]
    return events[0]


def link_down(g: GpuState, *down: int) -> GpuState:
    assert g.nvlinks is not None
    return replace(g, nvlinks=tuple(replace(lk, active=lk.link not in down) for lk in g.nvlinks))


def test_healthy_busy_job_has_no_events() -> None:
    assert run(detectors(), range(0, 1200, 10), snap) == []


def test_every_kind_has_a_severity() -> None:
    assert KINDS["gpu_lost"] is KINDS["nvlink_down"] is KINDS["hang"] is Severity.CRITICAL
    assert KINDS["straggler"] is KINDS["throughput_drop"] is Severity.WARN
    for kind in ("nvlink_errors", "throttle", "ecc", "row_remap", "step_stall"):
        assert KINDS[kind] is Severity.FAIL


def test_nvlink_down_mid_job_fires_once_per_link() -> None:
    def make(t: float) -> NodeSnapshot:
        return snap(t, g2=link_down(gpu(2), 5)) if t >= 60 else snap(t)

    ev = only(run(detectors(), range(0, 200, 10), make))
    assert (ev.kind, ev.gpu, ev.severity, ev.ts) == ("nvlink_down", 2, Severity.CRITICAL, T0 + 60)
    assert ev.evidence["link"] == 5
    assert ev.uuid == gpu(2).uuid


def test_nvlink_down_again_after_recovery_and_two_links() -> None:
    def make(t: float) -> NodeSnapshot:
        if 60 <= t < 100 or t >= 150:
            return snap(t, g2=link_down(gpu(2), 5, 7))
        return snap(t)

    events = run(detectors(), range(0, 200, 10), make)
    assert [(e.ts - T0, e.evidence["link"]) for e in events] == [
        (60, 5),
        (60, 7),
        (150, 5),
        (150, 7),
    ]


def test_nvlink_down_from_the_start_and_unknown_state() -> None:
    det = detectors()
    first = det.observe(snap(0, g1=link_down(gpu(1), 0)))  # expected: all reported links
    assert [(e.kind, e.gpu, e.evidence["link"]) for e in first] == [("nvlink_down", 1, 0)]
    g = gpu(1)
    assert g.nvlinks is not None
    unknown = replace(g, nvlinks=tuple(replace(lk, active=None) for lk in g.nvlinks))
    assert det.observe(snap(10, g1=unknown)) == []
    assert run(det, range(20, 60, 10), lambda t: snap(t, g1=link_down(gpu(1), 0))) == []


def test_all_links_down_at_once_on_a_model_the_config_does_not_list() -> None:
    def make(t: float) -> NodeSnapshot:
        gpus = {f"g{i}": replace(gpu(i), name="NVIDIA B200") for i in range(8)}
        if t >= 60:
            gpus = {k: link_down(g, *range(18)) for k, g in gpus.items()}
        return snap(t, **gpus)

    events = run(detectors(), range(0, 120, 10), make)
    assert len(events) == 8 * 18 and {e.kind for e in events} == {"nvlink_down"}
    assert {e.ts for e in events} == {T0 + 60}


def test_nvlink_error_growth() -> None:
    def make(t: float) -> NodeSnapshot:
        g = gpu(4)
        assert g.nvlinks is not None
        replays = 0 if t < 50 else int(t)  # +10 per 10 s: 60/min from t=60
        nvl = tuple(replace(lk, replay_errors=replays if lk.link == 3 else 0) for lk in g.nvlinks)
        return snap(t, g4=replace(g, nvlinks=nvl))

    # judged once the check's min_window_s (300 s) of evidence is in: from t=0 to t=300
    ev = only(run(detectors(), range(0, 600, 10), make))
    assert (ev.kind, ev.gpu, ev.severity, ev.ts) == ("nvlink_errors", 4, Severity.FAIL, T0 + 300)
    assert ev.evidence["link"] == 3 and ev.evidence["window_s"] == 300
    assert ev.evidence["replay_per_min"] == 60  # 300 replays over 300 s


def test_single_nvlink_replay_mid_job_is_no_event() -> None:
    def make(t: float) -> NodeSnapshot:
        g = gpu(4)
        assert g.nvlinks is not None
        nvl = tuple(replace(lk, replay_errors=int(t >= 50)) for lk in g.nvlinks)
        return snap(t, g4=replace(g, nvlinks=nvl))

    assert run(detectors(), range(0, 900, 10), make) == []


def test_xid_79_mapped_to_its_gpu_by_bus_id() -> None:
    det = detectors()
    det.observe(snap(0))
    gpu_by_bus = {gpu(i).pci_bus_id or "": i for i in range(8)}
    uuid_by_gpu = {i: gpu(i).uuid or "" for i in range(8)}
    x = XidEvent(
        xid=79,
        pci_bus_id="PCI:0000:5D:00",  # kernel-log spelling, NVML says 00000000:5D:00.0
        message="GPU has fallen off the bus.",
        raw="NVRM: Xid (PCI:0000:5D:00): 79, pid=123, name=python, GPU has fallen off the bus.",
        ts=T0 + 42,
        pid=123,
    )
    ev = only(det.observe_xids([x], gpu_by_bus, uuid_by_gpu))
    assert (ev.kind, ev.gpu, ev.severity, ev.ts) == ("xid", 3, Severity.CRITICAL, T0 + 42)
    assert ev.message == "Xid 79 GPU has fallen off the bus on GPU 3"
    assert ev.uuid == gpu(3).uuid
    assert ev.evidence["xid"] == 79 and ev.evidence["action"] == "reset"
    # the same Xid again from the other source (NVML event API, no pid, a second later)
    dup = replace(x, pci_bus_id="00000000:5D:00.0", ts=T0 + 43, pid=None)
    assert det.observe_xids([dup], gpu_by_bus, uuid_by_gpu) == []


def test_xid_application_level_is_recorded_not_critical() -> None:
    det = Detectors(Config(), [0, 1])
    gpu_by_bus = {gpu(i).pci_bus_id or "": i for i in range(8)}
    xids = [
        XidEvent(xid=13, pci_bus_id="0000:2a:00", message="", raw="", ts=None),
        XidEvent(xid=79, pci_bus_id="0000:db:00", message="", raw="", ts=T0),  # GPU 7: not ours
        XidEvent(xid=48, pci_bus_id="0000:99:00", message="", raw="", ts=T0),  # unknown bus
    ]
    events = det.observe_xids(xids, gpu_by_bus, now=T0 + 5)
    assert [(e.gpu, e.severity, e.ts) for e in events] == [(1, Severity.INFO, T0 + 5)]
    # GPU 1's bus id unknown: an Xid on an unmapped bus may be ours, keep it without a GPU
    partial = {gpu(0).pci_bus_id or "": 0}
    events = det.observe_xids([replace(xids[2], ts=T0 + 60)], partial)
    assert [(e.gpu, e.severity, e.ts) for e in events] == [(None, Severity.FAIL, T0 + 60)]
    assert events[0].message == "Xid 48 Double Bit ECC Error (DBE) on PCI 0000:99:00.0"


def test_throttle_blip_is_ignored_sustained_fires_once_at_start_plus_sustain() -> None:
    def make(t: float) -> NodeSnapshot:
        slow = 100 <= t < 110 or t >= 200
        return snap(t, g6=replace(gpu(6), clock_event_reasons=0x8 | 0x4)) if slow else snap(t)

    det = detectors()
    assert run(det, range(0, 200, 10), make) == []  # a 10 s blip
    ev = only(run(det, range(200, 400, 10), make))
    assert (ev.kind, ev.gpu, ev.severity, ev.ts) == ("throttle", 6, Severity.FAIL, T0 + 230)
    assert ev.evidence["reason"] == "hw_slowdown"
    assert ev.evidence["since"] == T0 + 200


def test_throttle_not_for_power_cap_or_sw_reasons() -> None:
    def make(t: float) -> NodeSnapshot:
        return snap(t, g6=replace(gpu(6), clock_event_reasons=0x4 | 0x20))  # SW power, SW thermal

    assert run(detectors(), range(0, 200, 10), make) == []


def test_hang_when_all_gpus_idle_for_hang_after_s() -> None:
    events = run(detectors(), range(0, 2000, 10), lambda t: snap(t, util=0.0))
    ev = only(events)
    assert (ev.kind, ev.gpu, ev.severity, ev.ts) == ("hang", None, Severity.CRITICAL, T0 + 900)
    assert ev.evidence["idle_since"] == T0
    assert ev.evidence["utilization_pct"] == {str(i): 0 for i in range(8)}


def test_hang_counts_from_when_the_gpus_went_idle_and_rearms() -> None:
    def make(t: float) -> NodeSnapshot:
        return snap(t, util=95.0 if t < 300 or 1500 <= t < 1600 else 2.0)

    events = run(detectors(), range(0, 3000, 10), make)
    assert [e.ts - T0 for e in events if e.kind == "hang"] == [1200, 2500]


def test_no_hang_while_one_gpu_stays_busy() -> None:
    def make(t: float) -> NodeSnapshot:
        return snap(t, util=0.0, g5=gpu(5, util=90.0))

    assert run(detectors(), range(0, 2000, 10), make) == []


def test_straggler_gpu_3_at_60_percent_vs_peers_at_95() -> None:
    det = detectors()
    # 30 samples at 10 s fill the 300 s window: judged at the 30th, t=290
    assert run(det, range(0, 290, 10), lambda t: snap(t, g3=gpu(3, 60.0))) == []
    events = run(det, range(290, 900, 10), lambda t: snap(t, g3=gpu(3, 60.0)))
    ev = only(events)
    assert (ev.kind, ev.gpu, ev.severity, ev.ts) == ("straggler", 3, Severity.WARN, T0 + 290)
    assert ev.evidence["metric"] == "utilization"
    assert ev.evidence["mean"] == 60.0 and ev.evidence["peers_median"] == 95.0


def test_a_late_sampler_does_not_make_a_straggler_fire_twice() -> None:
    # samples stretched to 12 s (a loaded node) leave fewer than the window's 30 samples
    # within 300 s: the condition is unknown then, neither cleared nor fired again
    times = [*range(0, 400, 10), *range(400, 800, 12), *range(800, 1200, 10)]
    events = run(detectors(), times, lambda t: snap(t, g3=gpu(3, 60.0)))
    assert [(e.kind, e.gpu, e.ts) for e in events] == [("straggler", 3, T0 + 290)]


def test_no_straggler_at_92_vs_95_or_when_peers_are_idle() -> None:
    assert run(detectors(), range(0, 900, 10), lambda t: snap(t, g3=gpu(3, 92.0))) == []

    def idle_job(t: float) -> NodeSnapshot:
        return snap(t, util=20.0, g3=gpu(3, 5.0))

    assert [e.kind for e in run(detectors(), range(0, 900, 10), idle_job)] == []


def test_straggler_by_power_when_utilisation_looks_equal() -> None:
    def make(t: float) -> NodeSnapshot:
        return snap(t, g0=replace(gpu(0), power_w=300.0))  # peers at 670 W

    ev = only(run(detectors(), range(0, 400, 10), make))
    assert (ev.kind, ev.gpu, ev.evidence["metric"]) == ("straggler", 0, "power")


def test_straggler_needs_two_gpus() -> None:
    det = Detectors(Config(), [3])
    assert run(det, range(0, 900, 10), lambda t: snap(t, g3=gpu(3, 10.0))) == []


def test_ecc_increase_fires_then_rearms_after_a_quiet_interval() -> None:
    counts = {0: 1, 50: 2, 60: 2, 80: 5, 90: 5}  # 1 from before the job: no event

    def make(t: float) -> NodeSnapshot:
        n = max(v for k, v in counts.items() if k <= t)
        return snap(t, g1=replace(gpu(1), ecc_volatile_uncorrectable=n))

    events = run(detectors(), range(0, 120, 10), make)
    assert [(e.kind, e.gpu, e.severity, e.ts - T0) for e in events] == [
        ("ecc", 1, Severity.FAIL, 50),
        ("ecc", 1, Severity.FAIL, 80),
    ]
    assert events[0].evidence == {"before": 1, "after": 2}


def test_row_remap_pending_fires_once() -> None:
    def make(t: float) -> NodeSnapshot:
        return snap(t, g7=replace(gpu(7), remap_pending=t >= 30))

    ev = only(run(detectors(), range(0, 120, 10), make))
    assert (ev.kind, ev.gpu, ev.severity, ev.ts) == ("row_remap", 7, Severity.FAIL, T0 + 30)


def test_gpu_lost_fires_once() -> None:
    lost = GpuState(index=5, status=GpuStatus.LOST, error="GPU is lost")

    def make(t: float) -> NodeSnapshot:
        return snap(t, g5=lost) if t >= 40 else snap(t)

    ev = only(run(detectors(), range(0, 300, 10), make))
    assert (ev.kind, ev.gpu, ev.severity, ev.ts) == ("gpu_lost", 5, Severity.CRITICAL, T0 + 40)
    assert ev.evidence["status"] == "lost"


def test_unresponsive_gpu_is_lost_too() -> None:
    stuck = GpuState(index=0, status=GpuStatus.UNRESPONSIVE)
    assert [e.kind for e in detectors().observe(snap(0, g0=stuck))] == ["gpu_lost"]


def stats(steps: int, sps: float, last: float = T0) -> TaskStats:
    return TaskStats(steps_total=steps, step_seconds=1.0, samples_per_second=sps, last_step_ts=last)


def test_throughput_drop_from_100_to_60_samples_per_second() -> None:
    det = detectors()
    out: list[Event] = []
    for i in range(10):
        out += det.observe_task(stats(10 * (i + 1), 100.0, T0 + 10 * i), T0 + 10 * i)
    assert out == []
    for i in range(10, 15):
        out += det.observe_task(stats(10 * (i + 1), 60.0, T0 + 10 * i), T0 + 10 * i)
    ev = only(out)
    assert (ev.kind, ev.gpu, ev.severity, ev.ts) == (
        "throughput_drop",
        None,
        Severity.WARN,
        T0 + 100,
    )
    assert ev.evidence["metric"] == "samples_per_second"
    assert ev.evidence["value"] == 60.0 and ev.evidence["median"] == 100.0


def test_no_throughput_judgement_without_history_or_new_steps() -> None:
    det = detectors()
    out: list[Event] = []
    for step in range(1, 5):
        out += det.observe_task(stats(step, 100.0, T0 + step), T0 + step)
    out += det.observe_task(stats(5, 10.0, T0 + 5), T0 + 5)  # only 4 values before: not judged
    for step in range(6, 11):
        out += det.observe_task(stats(step, 100.0, T0 + step), T0 + step)
    out += det.observe_task(stats(10, 10.0, T0 + 10), T0 + 11)  # no new step: not judged
    assert out == []
    assert [e.kind for e in det.observe_task(stats(11, 10.0, T0 + 11), T0 + 11)] == [
        "throughput_drop"
    ]


def test_step_stall_after_stall_factor_median_steps() -> None:
    det = detectors(stall_min_s=0.0)  # stall_factor 5, no minimum
    base = TaskStats(steps_total=10, step_seconds=2.0, last_step_ts=T0)
    assert det.observe_task(base, T0 + 9) == []
    ev = only(det.observe_task(base, T0 + 11))
    assert (ev.kind, ev.gpu, ev.severity, ev.ts) == ("step_stall", None, Severity.FAIL, T0 + 10)
    assert det.observe_task(base, T0 + 60) == []
    moving = replace(base, steps_total=11, last_step_ts=T0 + 61)
    assert det.observe_task(moving, T0 + 62) == []
    assert [e.kind for e in det.observe_task(moving, T0 + 80)] == ["step_stall"]


def test_no_step_stall_before_three_steps() -> None:
    det = detectors()
    early = TaskStats(steps_total=2, step_seconds=1.0, last_step_ts=T0)
    assert det.observe_task(early, T0 + 1000) == []


def _rank_steps(slow_rank: int | None, steps: int = 20) -> dict[int, list[StepRecord]]:
    """Four ranks of one DDP job: a step takes 0.2 s everywhere (the all-reduce waits for
    the slowest); own work 0.05 s, the slow rank's 0.15 s (the others wait 0.1 s more)."""
    out: dict[int, list[StepRecord]] = {}
    for rank in range(4):
        own = 0.15 if rank == slow_rank else 0.05
        out[rank] = [
            StepRecord(ts=T0 + i * 0.2, rank=rank, step=i, step_seconds=0.2, comm_seconds=0.2 - own)
            for i in range(steps)
        ]
    return out


def test_the_rank_the_others_wait_for_is_named_once_while_it_lasts() -> None:
    det = detectors()
    ev = only(det.observe_ranks(_rank_steps(slow_rank=2), T0 + 10))
    assert (ev.kind, ev.severity, ev.gpu, ev.evidence["rank"]) == (
        "rank_straggler", Severity.WARN, None, 2,
    )  # fmt: skip
    assert ev.message.startswith("rank 2 is the straggler") and ev.evidence["cause"] == "compute"
    assert det.observe_ranks(_rank_steps(slow_rank=2), T0 + 20) == []  # still slow: said once
    assert det.observe_ranks(_rank_steps(slow_rank=None), T0 + 30) == []  # recovered
    assert only(det.observe_ranks(_rank_steps(slow_rank=2), T0 + 40)).evidence["rank"] == 2


def test_balanced_ranks_or_too_few_steps_name_nobody() -> None:
    det = detectors()
    assert det.observe_ranks(_rank_steps(slow_rank=None), T0 + 10) == []
    assert det.observe_ranks(_rank_steps(slow_rank=1, steps=3), T0 + 10) == []


def test_a_pause_shorter_than_stall_min_s_is_no_stall() -> None:
    """A job that finished its steps and is shutting down (or saving a checkpoint) pauses
    for many median step times: no hang until the pause outlasts stall_min_s too."""
    det = detectors()  # stall_factor 5, stall_min_s 300
    done = TaskStats(steps_total=60, step_seconds=0.36, last_step_ts=T0)
    assert det.observe_task(done, T0 + 5) == []  # 14 median steps: shutting down
    assert det.observe_task(done, T0 + 299) == []
    ev = only(det.observe_task(done, T0 + 301))
    assert (ev.kind, ev.ts) == ("step_stall", T0 + 300)
