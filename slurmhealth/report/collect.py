"""Turn what one node's history knows about a job into :class:`NodeFacts`.

The history's named queries read the rows (the sample aggregation runs in SQL there, so a
day of 10 s samples of 8 GPUs stays fast); here they become facts: p5, swings, throttle
time and the plot series of each GPU, the task's throughput, the job's node list.
"""

from __future__ import annotations

import itertools
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from slurmhealth.checks.thermal import SEVERITY
from slurmhealth.diagnose.facts import GpuStats, JobFacts, NodeFacts, TaskFacts
from slurmhealth.history import read
from slurmhealth.history.read import Series, Source
from slurmhealth.model import CLOCK_EVENT_REASONS
from slurmhealth.slurm import HostlistError, expand_hostlist, null

# the clock-event reasons counted as throttle time: those the clock_events check judges
HW_THROTTLE = {CLOCK_EVENT_REASONS[name]: name for name in SEVERITY}
MAX_SERIES = 300  # points per GPU kept for plots


def job_facts(db: Source, job_id: str) -> JobFacts | None:
    """The job's ``jobs`` row in ``db`` as facts, or None."""
    r = read.job_row(db, job_id)
    if r is None:
        return None

    def text(key: str) -> str:  # rows written before "(null)" was read as unset hold it
        return null(str(r.get(key) or ""))

    return JobFacts(
        job_id=job_id,
        user=text("user"),
        account=text("account"),
        partition=text("partition"),
        qos=text("qos"),
        priority=r.get("priority"),
        nodes=_nodes(text("nodes")) or ((str(r["node"]),) if r.get("node") else ()),
        gpus=tuple(r.get("gpus") or ()),
        start_ts=r.get("start_ts"),
        end_ts=r.get("end_ts"),
        state=text("state"),
        exit_code=r.get("exit_code"),
    )


def _nodes(hostlist: str) -> tuple[str, ...]:
    """The job's node names; none when the stored list is not one Slurm would write."""
    try:
        return expand_hostlist(hostlist)
    except HostlistError:
        return ()


def _swings(values: Sequence[float]) -> int:
    """How often utilisation crossed between idle (<10%) and busy (>90%): the extremes as a
    string of l/h, then its l->h and h->l steps counted by the regex engine."""
    marks = "".join(["l" if v < 10 else "h" for v in values if v < 10 or v > 90])
    return len(_STEP.findall(marks))


_STEP = re.compile(r"(?<=l)h|(?<=h)l")


def _gpu_stats(db: Source, job_id: str, node: str) -> tuple[GpuStats, ...]:
    """The SQL aggregates, and one pass over (ts, util, power, reasons) for what SQL does
    not do well: p5, swings, throttle time and the plot series (a day of 10 s samples of
    8 GPUs in ~0.15 s)."""
    out = []
    for agg, rows in read.gpu_samples(db, job_id, node):
        util = [r[1] for r in rows if r[1] is not None]
        out.append(GpuStats(**agg, **_series_stats(rows, util)))
    return tuple(out)


def _series_stats(rows: Series, util: Sequence[float]) -> dict[str, Any]:
    """p5, swings, throttle seconds and the plot series from (ts, util, power, reasons)."""
    throttle: dict[str, float] = {}
    if any(r[3] for r in rows):  # most jobs never throttle: skip the walk
        reasons = [r[3] for r in rows]
        ts = [r[0] for r in rows]
        steps = [b - a for a, b in itertools.pairwise(ts) if b > a]
        cap = 2 * statistics.median(steps) if steps else 0.0
        for i in range(len(rows) - 1):
            mask = reasons[i]
            if mask:
                dt = min(ts[i + 1] - ts[i], cap)
                for bit, name in HW_THROTTLE.items():
                    if int(mask) & bit:
                        throttle[name] = throttle.get(name, 0.0) + dt
    stride = max(1, len(rows) // MAX_SERIES)
    util_sorted = sorted(util)
    n = len(util_sorted)
    return {
        "util_p5": util_sorted[int(0.05 * (n - 1))] if n else None,
        "util_swings": _swings(util),
        "throttle_seconds": {k: round(v, 1) for k, v in throttle.items()},
        "series": tuple((r[0], r[1], r[2]) for r in rows[::stride]),
    }


def _task(db: Source, job_id: str, node: str) -> TaskFacts | None:
    tasks = [m for m in read.task_metrics(db, job_id, node) if isinstance(m, dict)]
    tasks = [t for t in tasks if t.get("kind") == "task"]
    if not tasks:
        return None
    last = tasks[-1]
    throughput = [t["samples_per_second"] for t in tasks if t.get("samples_per_second")]
    step_s = [t["step_seconds"] for t in tasks if t.get("step_seconds")]
    return TaskFacts(
        steps_total=int(last.get("steps_total") or 0),
        step_seconds_median=statistics.median(step_s) if step_s else None,
        samples_per_second_first=throughput[0] if throughput else None,
        samples_per_second_last=throughput[-1] if throughput else None,
        mfu_ratio=last.get("mfu_ratio"),
        comm_ratio=last.get("comm_ratio"),
        data_wait_ratio=last.get("data_wait_ratio"),
    )


def node_facts(
    db: Source, job_id: str, node: str, logs: Mapping[str, str] | None = None
) -> NodeFacts:
    """Everything this node's history holds about the job."""

    def rows(table: str) -> tuple[dict[str, Any], ...]:
        return tuple(read.job_node_rows(db, table, job_id, node))

    return NodeFacts(
        node=node,
        findings=rows("findings"),
        runs=rows("check_runs"),
        events=rows("events"),
        drains=rows("drains"),
        gpus=_gpu_stats(db, job_id, node),
        task=_task(db, job_id, node),
        evidence=rows("evidence"),
        logs=dict(logs or {}),
    )
