"""The report of a job no node history or evidence summary reaches (a login node, after the
nodes' files are gone): the job's facts from Slurm accounting (``sacct``), the summary
``ctld-epilog`` stored in its AdminComment (verdict, whose fault, failing rows, drains),
the nodes' drains and reasons from slurmdbd's node events (``sacctmgr show event``), and
per-GPU statistics from Prometheus (``report.prometheus_url``), when configured.

:func:`facts_from_accounting` is pure (records in, facts out); :func:`read_accounting`
asks the outside world, each source optional: what could not be read is named, never
fatal, unless there is no record of the job at all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurmhealth.config import Config
from slurmhealth.diagnose.facts import Facts, GpuStats, NodeFacts
from slurmhealth.model_records import Job
from slurmhealth.slurm import SlurmCli, SlurmError
from slurmhealth.slurm.acct import NodeEvent
from slurmhealth.summary import admin_comment

log = logging.getLogger("slurmhealth.report")
DRAIN_SLACK_S = 300.0  # a drain this soon after the job's end is the epilog's, about the job
GpuStatsFn = Callable[[str, float, float], Mapping[str, Sequence[GpuStats]]]


@dataclass
class AccountingRead:
    """What the accounting sources said about a job, and which of them failed (why)."""

    job: Job
    summary: dict[str, Any] | None = None
    events: list[NodeEvent] = field(default_factory=list)
    gpus: Mapping[str, Sequence[GpuStats]] = field(default_factory=dict)
    used: list[tuple[str, str]] = field(default_factory=list)  # (source, where)
    failed: dict[str, str] = field(default_factory=dict)  # source -> why


def job_facts(acct: Job) -> Job:
    return Job(
        job_id=acct.job_id,
        user=acct.user,
        account=acct.account,
        partition=acct.partition,
        qos=acct.qos,
        node_names=acct.node_names,
        start_ts=acct.start_ts,
        end_ts=acct.end_ts,
        state=acct.state,
        exit_code=acct.exit_code,
        time_limit_s=acct.time_limit_s,
    )


def _drain_rows(job: Job, events: Sequence[NodeEvent], node: str) -> list[dict[str, Any]]:
    """The node's drains that began while the job ran or just after it (its epilog's)."""
    start = job.start_ts or 0.0
    end = (job.end_ts or start) + DRAIN_SLACK_S
    return [{"node": node, "state": "drained", "reason": e.reason, "ts": e.start_ts,
             "actor": e.user.split("(")[0]}
            for e in events
            if e.node == node and "drain" in e.state and e.start_ts is not None
            and start <= e.start_ts <= end]  # fmt: skip


def facts_from_accounting(read: AccountingRead) -> Facts:
    """The job's facts as a node history would give them, from what accounting knows."""
    job = job_facts(read.job)
    nodes = []
    for node in dict.fromkeys([*job.node_names, *read.gpus]):
        rows = admin_comment.node_rows(read.summary or {}, node)
        drains = _drain_rows(job, read.events, node) or list(rows["drains"])
        gpus = tuple(sorted(read.gpus.get(node, ()), key=lambda g: g.gpu))
        nodes.append(NodeFacts(node=node, findings=rows["findings"], events=rows["events"],
                               drains=tuple(drains), gpus=gpus))  # fmt: skip
    gpu_ids = sorted({g.gpu for n in nodes for g in n.gpus})
    if gpu_ids:
        from dataclasses import replace

        job = replace(job, gpus=tuple(gpu_ids))
    return Facts(job=job, nodes=tuple(nodes))


def enabled(cfg: Config) -> bool:
    """Whether the report may ask Slurm accounting (``report.accounting``)."""
    return cfg.report.accounting


def prometheus_stats(cfg: Config) -> tuple[GpuStatsFn | None, str]:
    """The per-GPU statistics source of ``report.prometheus_url`` and its URL; (None, "")
    when none is configured."""
    from slurmhealth.report.prometheus import PromSource

    url = cfg.report.prometheus_url
    if not url:
        return None, ""
    return PromSource(url, cfg.report.prometheus_timeout_s).gpu_stats, url


def read_accounting(job_id: str, slurm: SlurmCli | None = None) -> AccountingRead | None:
    """The job from slurmdbd; None when accounting has no record of it (or cannot be
    asked: the reason is logged). Node events are read by the caller after the access
    check (:func:`read_details`)."""
    slurm = slurm or SlurmCli(timeout_s=10.0)
    try:
        acct = slurm.accounting_job(job_id)
    except SlurmError as exc:
        log.info("Slurm accounting cannot be asked about job %s: %s", job_id, exc)
        return None
    if acct is None:
        return None
    read = AccountingRead(acct, used=[("accounting", "sacct")])
    read.summary = admin_comment.decode(acct.admin_comment)
    if read.summary is not None:
        read.used.append(("summary", "AdminComment"))
    elif acct.admin_comment:
        read.failed["summary"] = "the job's AdminComment holds no slurmhealth summary"
    else:
        read.failed["summary"] = "no summary in the job's AdminComment (no ctld-epilog?)"
    return read


def read_details(
    cfg: Config, read: AccountingRead, slurm: SlurmCli | None = None,
    stats: GpuStatsFn | None = None, url: str = "",
) -> None:  # fmt: skip
    """Add the node events and the Prometheus statistics to ``read`` (each optional)."""
    slurm = slurm or SlurmCli(timeout_s=10.0)
    job = read.job
    start, end = job.start_ts, job.end_ts
    if job.node_names and start is not None:
        try:
            read.events = slurm.node_events(job.node_names, start, (end or start) + DRAIN_SLACK_S)
            read.used.append(("node events", "sacctmgr show event"))
        except SlurmError as exc:
            read.failed["node events"] = str(exc)
    if stats is None and not url:
        stats, url = prometheus_stats(cfg)
    if stats is None:
        read.failed["prometheus"] = "report.prometheus_url is not set"
        return
    if start is None:
        read.failed["prometheus"] = "the job has no start time"
        return
    try:
        read.gpus = stats(job.job_id, start, end or time.time())  # running: until now
        read.used.append(("prometheus", url))
    except Exception as exc:  # any failure of an optional source: named, not fatal
        read.failed["prometheus"] = str(exc)  # it names the URL already
