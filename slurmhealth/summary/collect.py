"""Turn what one node's history knows about a job into :class:`NodeFacts`.

The history's named queries read the rows and each GPU's rollups (O(GPUs x buckets), so a
month-long job costs about what a day does); here they become facts: p5, throttle time and
the plot series of each GPU, the task's throughput, the job's node list.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from slurmhealth.checks.thermal import SEVERITY
from slurmhealth.diagnose.facts import GpuStats, NodeFacts, TaskFacts
from slurmhealth.history import read
from slurmhealth.history.read import Source
from slurmhealth.history.rollups import HIST_WIDTH
from slurmhealth.model import CLOCK_EVENT_REASONS
from slurmhealth.model_records import Job
from slurmhealth.slurm import HostlistError, expand_hostlist, null

# the clock-event reasons counted as throttle time: those the clock_events check judges
HW_THROTTLE = {CLOCK_EVENT_REASONS[name]: name for name in SEVERITY}
MAX_SERIES = 300  # points per GPU kept for plots


def job_facts(db: Source, job_id: str) -> Job | None:
    """The job's ``jobs`` row in ``db`` as facts, or None."""
    r = read.job_row(db, job_id)
    if r is None:
        return None

    def text(key: str) -> str:  # rows written before "(null)" was read as unset hold it
        return null(str(r.get(key) or ""))

    return Job(
        job_id=job_id,
        user=text("user"),
        account=text("account"),
        partition=text("partition"),
        qos=text("qos"),
        priority=r.get("priority"),
        node_names=_nodes(text("nodes")) or ((str(r["node"]),) if r.get("node") else ()),
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


def _gpu_stats(db: Source, job_id: str, node: str) -> tuple[GpuStats, ...]:
    """Each GPU's stats from its rollups (O(buckets), whatever the job's length): exact
    count, mean, min and max; p5 from the utilisation histogram (to within its bin);
    throttle seconds as samples showing the reason x the sampling step."""
    out = []
    for g in read.gpu_rollups(db, job_id, node, MAX_SERIES):
        step = g.step_s or 0.0
        throttle = {name: round(g.reasons[name] * step, 1)
                    for name in HW_THROTTLE.values() if g.reasons.get(name)}  # fmt: skip
        p5 = _percentile(g.util_hist, 0.05)
        if p5 is not None:
            lo, hi = g.stats["util_min"], g.stats["util_max"]
            p5 = min(max(p5, lo if lo is not None else p5), hi if hi is not None else p5)
        out.append(GpuStats(**g.stats, util_p5=p5, throttle_seconds=throttle,
                            series=tuple(g.series)))  # fmt: skip
    return tuple(out)


def _percentile(hist: Mapping[str, int], q: float) -> float | None:
    """The lower edge of the histogram bin holding the ``q`` quantile (the sample of rank
    ``int(q * (n - 1))``, as a sorted list would give it)."""
    bins = sorted((int(k), n) for k, n in hist.items())
    total = sum(n for _, n in bins)
    if not total:
        return None
    rank, seen = int(q * (total - 1)), 0
    for b, n in bins:
        seen += n
        if seen > rank:
            return float(b * HIST_WIDTH)
    return float(bins[-1][0] * HIST_WIDTH)


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


def _remediations(db: Source, job_id: str, node: str) -> tuple[dict[str, Any], ...]:
    """The node's repair of the fault the job met (none in a history from before it)."""
    try:
        return tuple(reversed(read.remediation_rows(db, node=node, job=job_id, limit=50)))
    except read.StoreError:
        return ()


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
        remediations=_remediations(db, job_id, node),
        gpus=_gpu_stats(db, job_id, node),
        task=_task(db, job_id, node),
        evidence=rows("evidence"),
        logs=dict(logs or {}),
    )
