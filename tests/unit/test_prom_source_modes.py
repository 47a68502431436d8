"""The login-node report of a 64-node job gives the same per-GPU stats whether its series
carry the job's labels (``[metrics] job_labels = "series"``) or only the GPU's, attributed
by ``slurmhealth_job_gpu_info`` (``"info"``), from a real Prometheus.

The same samples are scraped twice through the real collector, once in each mode (job 4711
on nodes a001..a064 with its labels on every series, job 4712 on b001..b064 without), and
backfilled with promtool into one Prometheus. In both modes the job's GPUs ran another job
just before it and another just after (in ``info`` mode the same series: the report must
keep to the job's own scrapes), each with values the job never shows (100 % busy, 99 C), and
that next job publishes its stats too after the job's.
Half the nodes published the job's stats (``final_series``), half did not.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields

import pytest

from slurmhealth import final_series
from slurmhealth.diagnose.facts import GpuStats
from slurmhealth.model import GpuState, GpuStatus, NodeSnapshot
from slurmhealth.model_records import ExportState, Job
from slurmhealth.report.prometheus import PromSource
from tests.prometheus_util import start_prometheus
from tests.support.prom_backfill import (
    backfill,
    scrape,
    scrape_families,
    stamped,
    write_openmetrics,
)

pytestmark = pytest.mark.prometheus

NODES, GPUS, N, STEP, AROUND = 64, 8, 40, 10.0, 12
MODES = {"series": ("4711", "a"), "info": ("4712", "b")}
BEFORE, AFTER = "4700", {"series": "4798", "info": "4799"}  # on the same GPUs, before/after


def gpu(node: int, g: int, i: int, other: bool) -> GpuState:
    if other:  # the neighbours: values the job never shows
        return GpuState(index=g, uuid=f"GPU-{node}-{g}", utilization_gpu_pct=100,
                        temperature_c=99, power_w=700.0, memory_used_bytes=79 * 2**30,
                        memory_total_bytes=80 * 2**30, pcie_gen=3, pcie_width=8,
                        pcie_replay_errors=1000, margin_temperature_c=-5,
                        clock_event_reasons=0x40)  # fmt: skip
    if node == 5 and g == 3 and i >= 30:
        return GpuState(index=g, status=GpuStatus.LOST, error="GPU is lost")
    return GpuState(
        index=g, uuid=f"GPU-{node}-{g}", utilization_gpu_pct=(i * 37 + 11 * g + node) % 90,
        temperature_c=40 + (i + g) % 30, power_w=300.0 + (i * 13 + g + node) % 50 + 0.25,
        memory_used_bytes=2**30 * (10 + (i + g) % 7), memory_total_bytes=80 * 2**30,
        pcie_gen=4 if g == 1 and 10 <= i < 14 else 5, pcie_width=16,
        pcie_replay_errors=i // 8 + g, margin_temperature_c=30 - (i + g) % 30,
        clock_event_reasons=0x8 if g == 2 and i % 9 == 0 else 0,
    )  # fmt: skip


def stats_of(i_node: int, other: bool = False) -> list[dict[str, object]]:
    """What a node's epilog published (any numbers: they are taken as they are; the next
    job's differ)."""
    return [{"gpu": g, "uuid": f"GPU-{i_node}-{g}", "samples": N,
             "util_mean": 40.0 + g + 50 * other, "util_p5": 5.0, "util_min": 1.0,
             "util_max": 89.0, "util_swings": 0,
             "mem_peak_bytes": 2**34, "mem_total_bytes": 80 * 2**30, "power_mean_w": 320.5,
             "temp_max_c": 69.0, "margin_min_c": 1.0, "pcie_gen_min": 4, "pcie_width_min": 16,
             "nvlink_active_min": 18, "nvlink_errors_delta": 0, "pcie_replays_delta": 5 + g,
             "throttle_seconds": {"hw_slowdown": 50.0} if g == 2 else {}}
            for g in range(GPUS)]  # fmt: skip


def node_scrapes(mode: str, prefix: str, job_id: str, k: int, t0: float) -> list[tuple[float, str]]:
    node = f"{prefix}{k:03d}"
    out = []
    runs = ((BEFORE, -AROUND - 1, -1), (job_id, 0, N), (AFTER[mode], N + 1, N + 1 + AROUND))
    for jid, first, last in runs:
        labels = Job(job_id=jid, node=node, user="alice" if jid == job_id else "bob",
                     priority=100, account="acct", partition="gpu", qos="normal")  # fmt: skip
        for i in range(first, last):
            ts = t0 + i * STEP
            snap = NodeSnapshot(node, ts, tuple(gpu(k, g, i, jid != job_id) for g in range(GPUS)))
            state = ExportState(labels=labels, snapshot=snap, samples_total=i - first + 1)
            out.append((ts, stamped(scrape(state, mode), ts)))
        if k % 2 == 0 and jid != BEFORE:  # even nodes' epilogs published the stats
            stats = stats_of(k, other=jid != job_id)
            text = scrape_families(final_series.families(labels, node, stats, mode))
            end = t0 + (last - 1) * STEP
            out += [(end + d, stamped(text, end + d)) for d in (5.0, 15.0)]
    return out


@dataclass
class Backfilled:
    url: str
    start: float
    end: float


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfilled]:
    tmp = tmp_path_factory.mktemp("prom-modes")
    t0 = float(int(time.time()) - 3 * 3600)
    scrapes = []
    for mode, (job_id, prefix) in MODES.items():
        for k in range(NODES):
            scrapes += node_scrapes(mode, prefix, job_id, k, t0)
    scrapes.sort(key=lambda s: s[0])
    backfill(write_openmetrics(tmp / "job.om", (text for _, text in scrapes)), tmp / "tsdb")
    url, stop = start_prometheus(tmp, "global:\n  scrape_interval: 10s\n")
    try:
        yield Backfilled(url, t0 - 3, t0 + (N - 1) * STEP + 3)
    finally:
        stop()


def by_index(got: dict[str, tuple[GpuStats, ...]]) -> dict[int, tuple[GpuStats, ...]]:
    return {int(node[1:]): gpus for node, gpus in got.items()}


def same(a: object, b: object) -> bool:
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


@pytest.mark.parametrize("final", [True, False], ids=["published", "from-series"])
@pytest.mark.parametrize("points", [300, 3], ids=["every-sample", "strided"])
def test_a_64_node_job_has_the_same_stats_in_both_modes(
    prom: Backfilled, final: bool, points: int
) -> None:
    got = {mode: by_index(PromSource(prom.url, 60).gpu_stats(
        job_id, prom.start, prom.end, final=final, series_points=points))
        for mode, (job_id, _) in MODES.items()}  # fmt: skip
    assert sorted(got["series"]) == sorted(got["info"]) == list(range(NODES))
    for k in range(NODES):
        series, info = got["series"][k], got["info"][k]
        assert [g.gpu for g in series] == [g.gpu for g in info] == list(range(GPUS))
        for a, b in zip(series, info, strict=True):
            diff = {f.name: (getattr(a, f.name), getattr(b, f.name)) for f in fields(GpuStats)
                    if not same(getattr(a, f.name), getattr(b, f.name))}  # fmt: skip
            assert not diff, f"node {k} GPU {a.gpu}: (series, info) {diff}"


def test_the_stats_are_the_jobs_own_not_its_neighbours(prom: Backfilled) -> None:
    """The GPUs' series run on through the jobs before and after it (info mode): none of
    their samples, nor the next job's published stats, reach the job's stats."""
    got = by_index(PromSource(prom.url, 60).gpu_stats("4712", prom.start, prom.end))
    published, computed = got[0][2], got[1][2]
    assert published.util_mean == 42.0 and published.throttle_seconds == {"hw_slowdown": 50.0}
    assert published.samples == N and published.pcie_replays_delta == 7
    assert computed.samples == N and computed.util_max is not None and computed.util_max < 90
    assert computed.temp_max_c is not None and computed.temp_max_c < 99
    assert computed.pcie_gen_min == 5 and computed.margin_min_c is not None
    assert computed.margin_min_c >= 0 and computed.pcie_replays_delta == (N - 1) // 8
    assert set(computed.throttle_seconds) == {"hw_slowdown"}  # the neighbours': hw_thermal
    assert len(computed.series) == N and all(p[1] < 90 for p in computed.series)
    lost = got[5][3]  # fell off the bus at sample 30: its last values, not the next job's
    assert lost.util_max is not None and lost.util_max < 90 and lost.samples == N
    strided = by_index(PromSource(prom.url, 60).gpu_stats(
        "4712", prom.start, prom.end, final=False, series_points=3))[1][2]  # fmt: skip
    assert 0 < len(strided.series) <= 3 and all(p[1] < 90 for p in strided.series)
    assert dataclasses.replace(strided, series=()) == dataclasses.replace(computed, series=())


@pytest.mark.parametrize("mode", MODES)
def test_the_neighbours_are_there_to_be_left_out(prom: Backfilled, mode: str) -> None:
    """The job after it is in Prometheus (info: on the same series): its report finds it,
    and only it."""
    after = PromSource(prom.url, 60).gpu_stats(
        AFTER[mode], prom.end + 2 * STEP, prom.end + (AROUND + 1) * STEP, final=False
    )  # fmt: skip
    assert sorted(after) == [f"{MODES[mode][1]}{k:03d}" for k in range(NODES)]
    assert {g.util_max for gpus in after.values() for g in gpus} == {100.0}
    assert {g.samples for gpus in after.values() for g in gpus} == {AROUND}
