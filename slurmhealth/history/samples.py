"""Named queries over a job's samples: per-GPU aggregates and series from the rollups
(``history.rollups``: O(GPUs x buckets), whatever the job's length), task metrics.

A job sampled before the rollups existed (a history not yet migrated, or rows written by
an older release) has none: its raw samples are rolled up in memory by the same code and
read the same way. Series come back as plain tuples.
"""

from __future__ import annotations

import sqlite3
import statistics
from dataclasses import dataclass, field
from typing import Any

from slurmhealth.history import rollups
from slurmhealth.history.reader import Source, dicts, reading

Series = list[tuple[float, float | None, float | None]]
"""One GPU's points in time order: (ts, util %, power W)."""


@dataclass(frozen=True)
class GpuRollup:
    """One GPU's samples over a job, summed up. ``stats`` has ``diagnose.facts.GpuStats``
    keys (``samples``, ``util_mean``, ``mem_peak_bytes``, ``nvlink_errors_delta``...);
    ``reasons``: clock-event reason name -> samples that showed it; ``util_hist``:
    utilisation bin (``rollups.HIST_WIDTH`` % wide, as text) -> samples; ``step_s``: the
    median sampling step (None with fewer than two samples in any bucket)."""

    stats: dict[str, Any]
    reasons: dict[str, int] = field(default_factory=dict)
    util_hist: dict[str, int] = field(default_factory=dict)
    step_s: float | None = None
    series: Series = field(default_factory=list)


_WHERE = "from sample_rollups where job_id = ? and node = ?"
_COUNTED = (*rollups.HIST, *rollups.REASONS)
_AGG_SQL = f"""
select gpu, max(uuid), sum(n), 1.0 * sum(util_sum) / nullif(sum(util_n), 0), min(util_min),
       max(util_max), max(mem_max), 1.0 * sum(power_sum) / nullif(sum(power_n), 0),
       max(temp_max), min(margin_min), min(pcie_gen_min), min(pcie_width_min),
       min(nvlink_active_min), max(nvlink_errors_max) - min(nvlink_errors_min),
       max(pcie_replay_max) - min(pcie_replay_min),
       sum(swings) + coalesce(sum(mark_first != mark_in), 0), count(*),
       {", ".join(f"sum({c})" for c in _COUNTED)}
{_WHERE} group by gpu order by gpu
"""
_SERIES_SQL = f"""
select max(ts_last), 1.0 * sum(util_sum) / nullif(sum(util_n), 0),
       1.0 * sum(power_sum) / nullif(sum(power_n), 0)
{_WHERE} and gpu = ? group by bucket / ? order by 1
"""
_STEPS_SQL = (
    f"select (ts_last - ts_first) / (n - 1) {_WHERE} and gpu = ? and n > 1"
    " and ts_last > ts_first order by bucket desc limit ?"
)
_RAW_COLUMNS = ("ts", "job_id", "node", "gpu", "uuid", "util_pct", "power_w", "mem_used_bytes",
                "temp_c", "margin_c", "clock_reasons", "pcie_gen", "pcie_width",
                "nvlink_active", "nvlink_errors", "pcie_replay")  # fmt: skip
_RAW_SQL = (
    f"select {', '.join(_RAW_COLUMNS)} from samples where job_id = ? and node = ? and gpu = ?"
    " order by ts limit ?"
)


def _stats(row: tuple[Any, ...]) -> dict[str, Any]:
    return {
        "gpu": int(row[0]),
        "uuid": row[1],
        "samples": int(row[2]),
        "util_mean": row[3],
        "util_min": row[4],
        "util_max": row[5],
        "mem_peak_bytes": None if row[6] is None else int(row[6]),
        "power_mean_w": row[7],
        "temp_max_c": row[8],
        "margin_min_c": row[9],
        "pcie_gen_min": row[10],
        "pcie_width_min": row[11],
        "nvlink_active_min": row[12],
        "nvlink_errors_delta": max(0, int(row[13] or 0)),
        "pcie_replays_delta": max(0, int(row[14] or 0)),
        "util_swings": int(row[15] or 0),
    }


def _read(conn: sqlite3.Connection, job_id: str, node: str, max_points: int) -> list[GpuRollup]:
    """Per GPU: one aggregate over its buckets, a series of at most ``max_points`` points
    (consecutive buckets averaged), the median step of its last buckets."""
    out = []
    for row in conn.execute(_AGG_SQL, (job_id, node)).fetchall():
        gpu, buckets, counted = row[0], int(row[16]), dict(zip(_COUNTED, row[17:], strict=True))
        hist = {c[1:]: int(n) for c in rollups.HIST if (n := counted[c])}
        reasons = {c[2:]: int(n) for c in rollups.REASONS if (n := counted[c])}
        stride = rollups.BUCKET_S * max(1, -(-buckets // max(1, max_points)))
        series = conn.execute(_SERIES_SQL, (job_id, node, gpu, stride)).fetchall()
        steps = [r[0] for r in conn.execute(_STEPS_SQL, (job_id, node, gpu, max_points))]
        step = statistics.median(steps) if steps else None
        out.append(GpuRollup(_stats(row), reasons, hist, step, series))
    return out


def _has_rollups(conn: sqlite3.Connection, job_id: str, node: str) -> bool:
    if int(conn.execute("PRAGMA user_version").fetchone()[0]) < 3:
        return False
    return conn.execute(f"select 1 {_WHERE} limit 1", (job_id, node)).fetchone() is not None


def _recount(conn: sqlite3.Connection, job_id: str, node: str) -> sqlite3.Connection:
    """The job's raw samples on ``node`` rolled up into an in-memory database."""
    mem = sqlite3.connect(":memory:")
    for sql in rollups.CREATE_SQL:
        mem.execute(sql)
    gpus = conn.execute(
        "select distinct gpu from samples where job_id = ? and node = ? and gpu is not null",
        (job_id, node),
    ).fetchall()
    for (gpu,) in gpus:
        cur = conn.execute(_RAW_SQL, (job_id, node, gpu, -1))
        rollups.add(mem, (dict(zip(_RAW_COLUMNS, r, strict=True)) for r in cur))
    return mem


def _raw_series(conn: sqlite3.Connection, job_id: str, node: str, g: GpuRollup) -> Series | None:
    """The GPU's raw points when it has at most as many samples as a plot shows and all
    of them are still kept (a short job plots every sample), else None."""
    want = int(g.stats["samples"])
    rows = conn.execute(_RAW_SQL, (job_id, node, g.stats["gpu"], want + 1)).fetchall()
    return [(r[0], r[5], r[6]) for r in rows] if len(rows) == want else None


def gpu_rollups(db: Source, job_id: str, node: str, max_points: int = 300) -> list[GpuRollup]:
    """Per GPU of the job on ``node`` (by index): its aggregates and a series of at most
    ``max_points`` points (every sample when the GPU has no more than that)."""
    with reading(db) as conn:
        if _has_rollups(conn, job_id, node):
            found = _read(conn, job_id, node, max_points)
        else:
            mem = _recount(conn, job_id, node)
            try:
                found = _read(mem, job_id, node, max_points)
            finally:
                mem.close()
        out = []
        for g in found:
            raw = _raw_series(conn, job_id, node, g) if g.stats["samples"] <= max_points else None
            out.append(g if raw is None else GpuRollup(g.stats, g.reasons, g.util_hist,
                                                        g.step_s, raw))  # fmt: skip
        return out


def task_metrics(
    db: Source, job_id: str, node: str, first: int = 50, last: int = 2000
) -> list[Any]:
    """The decoded ``metrics`` of the job's GPU-less samples on ``node`` (what the training
    loop reported through the task channel) in time order: the ``first`` and the ``last``
    ones only, so a month-long job costs what a short one does."""
    sql = (
        "select id, metrics from samples where job_id = ? and node = ? and gpu is null"
        " order by ts {order}, id {order} limit ?"
    )
    with reading(db) as conn:
        head = list(dicts(conn, "samples", sql.format(order="asc"), (job_id, node, first)))
        tail = list(dicts(conn, "samples", sql.format(order="desc"), (job_id, node, last)))
    seen: dict[int, Any] = {}
    for r in head + tail[::-1]:
        seen.setdefault(r["id"], r["metrics"])
    return list(seen.values())
