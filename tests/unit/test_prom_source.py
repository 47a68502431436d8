"""Per-GPU stats from a real Prometheus (``report.prometheus.PromSource``) equal, within 1 %,
what the report computes from the node histories (``summary.collect``) for the same samples:
the acceptance of "per-GPU stats within 1% of the full report" from any login node.

One job on 2 nodes x 4 GPUs, 400 samples 10 s apart: each snapshot goes into the node's
history through the sidecar's own rows and writer, and into Prometheus as the exporter's
scrape of that moment (the real collector), backfilled with promtool. The samples hold what
every field measures: utilisation swinging idle <-> busy, HW slowdown and thermal throttling
(and an idle-clock reason that is no throttle), a PCIe link that downshifts, growing NVLink
and PCIe replay counters, a GPU without a power reading.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pytest

from slurmhealth.diagnose.facts import GpuStats
from slurmhealth.errors import PrometheusError, UsageError
from slurmhealth.history import Batch, History
from slurmhealth.history.read import Reader
from slurmhealth.history.rows import sample_rows
from slurmhealth.metrics import final_series
from slurmhealth.model import GpuState, GpuStatus, NodeSnapshot, NvLink
from slurmhealth.model_records import ExportState, Job
from slurmhealth.report import prometheus
from slurmhealth.report.prometheus import PromSource
from slurmhealth.summary.collect import node_facts
from tests.prometheus_util import free_port, start_prometheus
from tests.support.prom_backfill import (
    backfill,
    scrape,
    scrape_families,
    stamped,
    write_openmetrics,
)

pytestmark = pytest.mark.prometheus

JOB, NODES, GPUS, N, STEP = "4711", ("n1", "n2"), 4, 400, 10.0
PUBLISHED = "n1"  # its epilog published the job's stats (final_series); n2's did not
CONFIG = "global:\n  scrape_interval: 10s\n"


def gpu_state(node: str, g: int, i: int) -> GpuState:
    """GPU ``g`` of ``node`` at sample ``i``: each GPU shows another pattern; GPU 1 of n2
    falls off the bus at sample 300 (NVML answers nothing more about it); GPU 2 of n2 has
    no NVLink."""
    k = NODES.index(node)
    if (node, g, i >= 300) == ("n2", 1, True):
        return GpuState(index=g, status=GpuStatus.LOST, error="GPU is lost")
    util = (95 if (i // 7) % 2 else 5) if g == 0 else (i * 37 + 11 * g + k) % 101
    reasons = 0x1 if i % 5 == 0 else 0  # gpu_idle: a clock event, never throttle time
    if g == 2 and i % 9 == 0:
        reasons |= 0x8  # hw_slowdown
    if g == 1 and 50 <= i < 70:
        reasons |= 0x40  # hw_thermal
    links = tuple(
        NvLink(link=n, active=not (g == 3 and n == 2 and i > 200),
               replay_errors=i // 50 if g == 1 else 0, recovery_errors=i // 100)
        for n in range(4)
    )  # fmt: skip
    return GpuState(
        index=g, uuid=f"GPU-{node}-{g}", name="NVIDIA H100 80GB HBM3",
        temperature_c=50 + (i * 7 + g) % 30, margin_temperature_c=30 - (i * 7 + g) % 30,
        power_w=None if (node, g) == ("n2", 3) else 300.0 + (i * 13 + g) % 50 + 0.25,
        utilization_gpu_pct=util, utilization_memory_pct=40,
        memory_total_bytes=80 * 2**30, memory_used_bytes=2**30 * (10 + (i + g) % 7),
        clock_event_reasons=reasons, pcie_gen=4 if g == 1 and 100 <= i < 110 else 5,
        pcie_width=16, pcie_replay_errors=i // 40 + g,
        nvlinks=None if (node, g) == ("n2", 2) else links,  # a PCIe card: no NVLink
    )  # fmt: skip


@dataclass
class Backfilled:
    url: str
    dbs: dict[str, Path]
    start: float
    end: float


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfilled]:
    tmp = tmp_path_factory.mktemp("prom-source")
    t0 = float(int(time.time()) - 3 * 3600)  # within Prometheus' default retention
    dbs = {node: tmp / f"{node}.db" for node in NODES}
    scrapes = []
    for node in NODES:
        labels = Job(job_id=JOB, node=node, user="alice", priority=100)
        rows = []
        for i in range(N):
            snap = NodeSnapshot(
                node, t0 + i * STEP, tuple(gpu_state(node, g, i) for g in range(GPUS))
            )
            rows += [("samples", r) for r in sample_rows(snap, JOB)]
            state = ExportState(labels=labels, snapshot=snap, samples_total=i + 1)
            scrapes.append((snap.ts, stamped(scrape(state), snap.ts)))
        with History(dbs[node]) as db:
            assert db.write(Batch(inserts=rows))
    with Reader(dbs[PUBLISHED]) as db:
        gpus = [asdict(g) for g in node_facts(db, JOB, PUBLISHED).gpus]
    labels = Job(job_id=JOB, node=PUBLISHED, user="alice", priority=100)
    final = scrape_families(final_series.families(labels, PUBLISHED, gpus))
    scrapes += [(t0 + N * STEP + d, stamped(final, t0 + N * STEP + d)) for d in (15, 25)]
    scrapes.sort(key=lambda s: s[0])
    backfill(write_openmetrics(tmp / "job.om", (text for _, text in scrapes)), tmp / "tsdb")
    url, stop = start_prometheus(tmp, CONFIG)
    try:
        yield Backfilled(url, dbs, t0 - 3, t0 + (N - 1) * STEP + 3)
    finally:
        stop()


def history_stats(job: Backfilled, node: str) -> tuple[GpuStats, ...]:
    with Reader(job.dbs[node]) as db:
        return node_facts(db, JOB, node).gpus


def close(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=0.01, abs_tol=1e-9)
    return a == b


def test_per_gpu_stats_equal_the_histories_within_one_percent(job: Backfilled) -> None:
    """Computed from the series alone (no node published its stats)."""
    source = PromSource(job.url, 30)
    got = source.gpu_stats(JOB, job.start, job.end, final=False)
    assert sorted(got) == list(NODES) and source.skipped == ()
    compared = [f.name for f in fields(GpuStats)
                if f.name not in ("series", "nvlink_active_min", "mem_total_bytes")]  # fmt: skip
    for node in NODES:
        want = history_stats(job, node)
        assert [g.gpu for g in got[node]] == [g.gpu for g in want] == list(range(GPUS))
        for p, h in zip(got[node], want, strict=True):
            diff = {f: (getattr(p, f), getattr(h, f)) for f in compared
                    if not close(getattr(p, f), getattr(h, f))}  # fmt: skip
            assert not diff, f"{node} GPU {h.gpu}: (prometheus, history) {diff}"
            lost = (node, p.gpu) == ("n2", 1)  # framebuffer: read in the job's last minutes
            assert p.mem_total_bytes == (None if lost else 80 * 2**30)
            assert p.nvlink_active_min is None  # it holds the links down, not the links


def test_published_stats_are_the_histories_and_the_rest_come_from_series(
    job: Backfilled,
) -> None:
    """n1's epilog published its stats: they are taken as they are (equal to its
    history's, the links and the framebuffer included); n2's come from its series."""
    source = PromSource(job.url, 30)
    got = source.gpu_stats(JOB, job.start, job.end)
    assert sorted(got) == list(NODES)
    for p, h in zip(got[PUBLISHED], history_stats(job, PUBLISHED), strict=True):
        assert dataclasses.replace(p, series=()) == dataclasses.replace(h, series=())
    from_series = source.gpu_stats(JOB, job.start, job.end, final=False)
    assert got["n2"] == from_series["n2"]
    assert got[PUBLISHED][0].nvlink_active_min == 4  # only the published stats know it
    assert from_series[PUBLISHED][0].nvlink_active_min is None


def test_the_samples_exercise_every_field(job: Backfilled) -> None:
    """The equality above is no equality of Nones and zeros."""
    n1, n2 = history_stats(job, "n1"), history_stats(job, "n2")
    assert n1[0].util_swings > 50 and n1[1].util_swings > 0
    assert n1[2].throttle_seconds == {"hw_slowdown": 450.0}
    assert n1[1].throttle_seconds == {"hw_thermal": 200.0}
    assert n1[1].pcie_gen_min == 4 and n1[1].nvlink_errors_delta == 4 * 7 + 4 * 3
    assert n1[0].util_p5 == 5 and 0 < n1[1].util_p5 < n1[1].util_mean
    assert n1[3].pcie_replays_delta == 9 and n2[3].power_mean_w is None
    assert n1[3].power_mean_w is not None
    assert n2[1].samples == N and n2[1].uuid == "GPU-n2-1"  # lost at 300: still counted
    assert n2[1].util_mean != n1[1].util_mean  # ...over the samples it answered
    assert n2[2].nvlink_active_min is None and n2[2].nvlink_errors_delta == 0


@pytest.mark.parametrize("node", NODES)  # published stats, and stats from the series
def test_plot_series_follow_the_histories(job: Backfilled, node: str) -> None:
    """Point for point: each stride is one of the history's 5-minute buckets (a sample on a
    bucket's edge in the bucket it starts, as the history counts it)."""
    got = PromSource(job.url, 30).gpu_stats(JOB, job.start, job.end)[node][0]
    want = history_stats(job, node)[0]
    assert 0 < len(got.series) <= 300 and len(want.series) <= 300
    for col in (1, 2):  # utilisation and power
        values = [[round(p[col], 6) for p in s.series] for s in (got, want)]
        assert values[0] == values[1], col
    assert got.series[0][0] >= job.start and got.series[-1][0] <= job.end + prometheus.SLACK_S


def test_every_sample_plotted_for_a_short_window(job: Backfilled) -> None:
    end = job.start + 100 * STEP
    got = PromSource(job.url, 30).gpu_stats(JOB, job.start, end)["n2"]
    assert [len(g.series) for g in got] == [100 + prometheus.SLACK_S // STEP] * GPUS
    assert all(p[2] is None for p in got[3].series)  # no power reading: no power points


def test_a_job_prometheus_never_saw_has_no_gpus(job: Backfilled) -> None:
    assert PromSource(job.url, 30).gpu_stats("999", job.start, job.end) == {}


def test_swings_beyond_their_budget_are_named(
    job: Backfilled, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prometheus, "SWING_BUDGET", 1000)
    source = PromSource(job.url, 30)
    got = source.gpu_stats(JOB, job.start, job.end, final=False)
    assert source.skipped == ("util_swings",)
    assert got["n1"][0].util_swings == 0 and got["n1"][0].util_mean is not None


def test_prometheus_refusing_a_query_is_one_line(job: Backfilled) -> None:
    source = PromSource(job.url, 30)
    with pytest.raises(PrometheusError) as exc:
        source.client.query("sum(", job.end)
    assert str(exc.value).startswith(f"prometheus {job.url}: HTTP 400: bad_data: ")
    assert "\n" not in str(exc.value)


def test_prometheus_down_is_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(PrometheusError) as exc:
        PromSource(url, 5).gpu_stats(JOB, 0.0, 3600.0)
    assert str(exc.value) == f"prometheus {url}: Connection refused"


@pytest.mark.parametrize("job_id", ["", '42"} or vector(1) #', "4 2", "x" * 65])
def test_a_job_id_slurm_never_gives_is_refused(job_id: str) -> None:
    with pytest.raises(UsageError, match="not one Slurm gives"):
        PromSource("http://127.0.0.1:1", 5).gpu_stats(job_id, 0.0, 1.0)


def test_a_window_that_ends_before_it_starts_is_refused() -> None:
    with pytest.raises(UsageError, match="not a time range"):
        PromSource("http://127.0.0.1:1", 5).gpu_stats(JOB, 10.0, 1.0)


def test_stats_serialise_like_the_histories(job: Backfilled) -> None:
    got = PromSource(job.url, 30).gpu_stats(JOB, job.start, job.end)["n1"][0]
    assert set(asdict(got)) == {f.name for f in fields(GpuStats)}
