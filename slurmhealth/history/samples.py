"""Named queries over a job's ``samples``: per-GPU aggregates and series, task metrics.

The aggregation runs in SQL over the covering index ``idx_samples_report`` (migration 2),
so a day of 10 s samples of 8 GPUs stays fast; series come back as plain tuples (70k row
objects would cost a quarter second).
"""

from __future__ import annotations

from typing import Any

from slurmhealth.history.reader import Source, dicts, reading

Series = list[tuple[float, float | None, float | None, int | None]]
"""One GPU's samples in time order: (ts, util %, power W, clock-event reasons bitmask)."""

_WHERE = "from samples where job_id = ? and node = ? and gpu is not null"
_AGG_SQL = f"""
select gpu, max(uuid), count(*), avg(util_pct), min(util_pct), max(util_pct),
       max(mem_used_bytes), avg(power_w), max(temp_c), min(margin_c), min(pcie_gen),
       min(pcie_width), min(nvlink_active), max(nvlink_errors) - min(nvlink_errors),
       max(pcie_replay) - min(pcie_replay)
{_WHERE} group by gpu order by gpu
"""
_SERIES_SQL = f"select ts, util_pct, power_w, clock_reasons {_WHERE} and gpu = ? order by ts"


def _aggregate(row: tuple[Any, ...]) -> dict[str, Any]:
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
    }


def gpu_samples(db: Source, job_id: str, node: str) -> list[tuple[dict[str, Any], Series]]:
    """Per GPU of the job on ``node`` (by index): its aggregates (keys as
    ``diagnose.facts.GpuStats`` fields: ``util_mean``, ``mem_peak_bytes``,
    ``nvlink_errors_delta``...) and its :data:`Series`."""
    out = []
    with reading(db) as conn:
        for agg in conn.execute(_AGG_SQL, (job_id, node)).fetchall():
            series = conn.execute(_SERIES_SQL, (job_id, node, agg[0])).fetchall()  # index range
            out.append((_aggregate(agg), series))
    return out


def task_metrics(db: Source, job_id: str, node: str) -> list[Any]:
    """The decoded ``metrics`` of the job's GPU-less samples on ``node`` (what the training
    loop reported through the task channel), in time order."""
    sql = (
        "select ts, metrics from samples where job_id = ? and node = ? and gpu is null order by ts"
    )
    with reading(db) as conn:
        return [r["metrics"] for r in dicts(conn, "samples", sql, (job_id, node))]
