"""``slurmhealth report JOBID``: everything known about one job, from every reachable source.

Sources, merged per node: the histories the config can reach (the local node's db and,
when ``paths.db`` holds ``{node}``, every node's) and the shared evidence dir's
``<job_id>/<node>/summary.json`` (how a multi-node job is seen from any node). A node's live
history wins over its summary. The result is a frozen :class:`Report`; ``report.render``
prints it for people or as versioned JSON. Times are UTC seconds.

Refusals: a user may read only their own jobs; root and the configured admin group any
(:class:`PermissionDenied`, exit 4). An unknown job is a :class:`UsageError` (exit 2).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

from slurmhealth.config import Config
from slurmhealth.diagnose.engine import diagnose, verdict
from slurmhealth.diagnose.facts import Diagnosis, Facts, JobFacts, NodeFacts
from slurmhealth.errors import StoreError, UsageError
from slurmhealth.history import read
from slurmhealth.report import sources as src
from slurmhealth.report.incidents import Incident
from slurmhealth.report.sources import NodeEvidence, PastIncident

log = logging.getLogger("slurmhealth.report")

SCHEMA = "slurmhealth.report/1"
STRAGGLER_RATIO = 0.75  # a GPU below this share of the job's median utilisation
BAD = ("fail", "critical")
_JOB_ID = re.compile(r"[0-9]+(?:[_+][0-9]+)?")


class PermissionDenied(UsageError):
    """The requester may not read this job's report. Exit 4."""

    exit_code = 4


@dataclass(frozen=True)
class TimelineEntry:
    ts: float
    node: str | None
    gpu: int | None
    kind: str  # job | run | finding | event | drain | task
    severity: str  # ok | info | warn | fail | critical
    text: str


@dataclass(frozen=True)
class Straggler:
    node: str
    gpu: int
    util_mean: float | None
    peer_median: float | None
    source: str  # event (the sidecar saw it) | stats (utilisation over the job)
    text: str


@dataclass(frozen=True)
class Report:
    job: JobFacts
    verdict: str
    failure_ts: float | None
    window_s: float | None
    generated_ts: float
    nodes: tuple[NodeFacts, ...]  # per node: GPU stats, task metrics, rows
    sources: tuple[tuple[str, str, str], ...]  # (node, history | summary, path)
    timeline: tuple[TimelineEntry, ...]
    stragglers: tuple[Straggler, ...]
    diagnoses: tuple[Diagnosis, ...]
    evidence: tuple[NodeEvidence, ...]
    past_incidents: tuple[PastIncident, ...]
    searched: tuple[str, ...]  # every path looked at
    # the knowledge base (`slurmhealth incident add`): (why, incident), linked first
    known_incidents: tuple[tuple[str, Incident], ...] = ()

    @property
    def facts(self) -> Facts:
        return Facts(job=self.job, nodes=self.nodes)


# -- permission -----------------------------------------------------------------------------


def admin_group(cfg: Config) -> str:
    return str(getattr(getattr(cfg, "evidence", None), "admin_group", "") or "")


def check_permission(cfg: Config, job: JobFacts, owner_uid: int | None, requester: int) -> None:
    import grp
    import pwd

    if requester == 0:
        return
    group = admin_group(cfg)
    try:
        me = pwd.getpwuid(requester)
    except KeyError:
        me = None
    if owner_uid is None and job.user:
        with contextlib.suppress(KeyError):
            owner_uid = pwd.getpwnam(job.user).pw_uid
    if owner_uid == requester or (me is not None and job.user and me.pw_name == job.user):
        return
    if group and me is not None:
        with contextlib.suppress(KeyError):
            g = grp.getgrgid(int(group)) if group.isdigit() else grp.getgrnam(group)
            if me.pw_name in g.gr_mem or g.gr_gid in os.getgrouplist(me.pw_name, me.pw_gid):
                return
    who = job.user or "an unknown user"
    only = f"only {job.user}, root" if job.user else "only root"
    only += f" or group {group}" if group else ""
    raise PermissionDenied(f"job {job.job_id} belongs to {who}; {only} may read its report")


# -- assembly -------------------------------------------------------------------------------


def _check_id(job_id: str) -> str:
    job_id = str(job_id).strip()
    if not _JOB_ID.fullmatch(job_id):
        raise UsageError(f"{job_id!r} is not a Slurm job id (e.g. 42, 42_3, 42+1)")
    return job_id


def build_report(
    cfg: Config,
    job_id: str,
    *,
    window_s: float | None = None,
    requester_uid: int | None = None,
    now: float | None = None,
) -> Report:
    """Merge every source about ``job_id`` and diagnose it. ``requester_uid`` None: no check.

    Raises :class:`PermissionDenied` (exit 4) or :class:`UsageError` (unknown job, exit 2).
    """
    job_id = _check_id(job_id)
    summaries = src.summaries(cfg, job_id)
    job, owner, dbs, unreadable = src.scan(cfg, job_id, summaries)
    try:
        where = [d.path for d in dbs] or read.history_paths(cfg)
        where = where or [f"{cfg.db_path()} (missing)"]
        where.append(os.path.join(src.evidence_root(cfg, "*"), job_id))
        if job is None and not summaries and not any(d.nodes for d in dbs):
            if unreadable:  # the job may well be in there: say so, not "no record"
                raise StoreError("; ".join(f"history {p} cannot be read: {why}"
                                           for p, why in unreadable.items()))  # fmt: skip
            raise UsageError(f"no record of job {job_id} in {', '.join(where)}")
        for path, why in unreadable.items():
            log.warning("history %s cannot be read (%s): the report may miss part of job %s",
                        path, why, job_id)  # fmt: skip
        job = job or JobFacts(job_id=job_id)
        if requester_uid is not None:
            check_permission(cfg, job, owner, requester_uid)
        nodes, sources, evidence = src.read_nodes(cfg, job, dbs, summaries)
        if not job.nodes:
            job = replace(job, nodes=tuple(n.node for n in nodes))
        facts = Facts(job=job, nodes=tuple(nodes))
        diagnoses = diagnose(facts)
        verdict_text = verdict(diagnoses, facts)
        timeline = _timeline(facts)
        failure = _failure_ts(timeline, job)
        if window_s is not None and failure is not None:
            timeline = [e for e in timeline if abs(e.ts - failure) <= window_s]
        incidents = src.past_incidents(dbs, job_id, facts)
    finally:
        for d in dbs:
            d.db.close()
    return Report(
        job=job,
        verdict=verdict_text,
        failure_ts=failure,
        window_s=window_s,
        generated_ts=time.time() if now is None else now,
        nodes=facts.nodes,
        sources=tuple(sources),
        timeline=tuple(timeline),
        stragglers=tuple(_stragglers(facts)),
        diagnoses=tuple(diagnoses),
        evidence=tuple(evidence),
        past_incidents=tuple(incidents),
        searched=tuple(where),
        known_incidents=tuple(_known_incidents(cfg, job_id, facts)),
    )


def _known_incidents(cfg: Config, job_id: str, facts: Facts) -> list[tuple[str, Incident]]:
    """Incidents recorded for this job, and similar ones (same GPU, Xid, node and check)."""
    from slurmhealth.report.incidents import context_of, related

    context: dict[str, set[Any]] = {"nodes": set(), "gpus": set(), "xids": set(), "checks": set()}
    for nf in facts.nodes:
        for key, values in context_of([*nf.findings, *nf.events], nf.node).items():
            context[key] |= values
    return related(cfg, job_id, context)


def _timeline(facts: Facts) -> list[TimelineEntry]:
    job, out = facts.job, []

    def add(ts: Any, node: str | None, gpu: Any, kind: str, sev: Any, text: str) -> None:
        if ts is not None:
            out.append(TimelineEntry(float(ts), node, gpu, kind, str(sev or "info").lower(), text))

    add(job.start_ts, None, None, "job", "info", "job started")
    for nf in facts.nodes:
        n = nf.node
        for r in nf.runs:
            status, gpus = str(r.get("status") or "?"), r.get("gpus")
            text = f"{r.get('phase', 'check')} {status} on {len(gpus or ())} GPU(s)"
            text += f" in {float(r['duration_s']):.1f} s" if r.get("duration_s") else ""
            text += f": {r['error']}" if r.get("error") else ""
            add(r["ts"], n, None, "run", status if status in ("ok", "warn", "fail") else "", text)
        for f in nf.findings:
            text = f"{f.get('check_name')}: {f.get('message')}"
            text += f" (action {f['action']})" if f.get("action") else ""
            add(f["ts"], n, f.get("gpu"), "finding", f.get("severity"), text)
        for e in nf.events:
            text = f"{e.get('kind')}: {e.get('message')}"
            add(e["ts"], n, e.get("gpu"), "event", e.get("severity"), text)
        for d in nf.drains:
            text = f"{d.get('state')} by {d.get('actor')}: {d.get('reason')}"
            add(d["ts"], n, None, "drain", "fail" if d.get("state") == "drained" else "warn", text)
        t = nf.task
        first, last = (t.samples_per_second_first, t.samples_per_second_last) if t else (None, None)
        if first and last and abs(last - first) / first >= 0.1:
            ts = job.end_ts or max((s[0] for g in nf.gpus for s in g.series[-1:]), default=None)
            text = f"throughput {first:.4g} -> {last:.4g} samples/s ({last / first - 1:+.0%})"
            add(ts, n, None, "task", "warn", text)
    text = f"job ended: {job.state or '?'}" + (f", exit {job.exit_code}" if job.exit_code else "")
    add(job.end_ts, None, None, "job", "fail" if job.state == "failed" else "info", text)
    return sorted(out, key=lambda e: (e.ts, e.node or "", -1 if e.gpu is None else e.gpu))


def _failure_ts(timeline: list[TimelineEntry], job: JobFacts) -> float | None:
    bad = [e.ts for e in timeline if e.severity in BAD and e.kind != "job"]
    if bad:
        return min(bad)
    return job.end_ts if job.end_ts is not None else (timeline[-1].ts if timeline else None)


def _stragglers(facts: Facts) -> list[Straggler]:
    out: dict[tuple[str, int], Straggler] = {}
    for nf in facts.nodes:
        for e in nf.events:
            if e.get("kind") == "straggler" and e.get("gpu") is not None:
                key = (nf.node, int(e["gpu"]))
                out[key] = Straggler(nf.node, key[1], None, None, "event", str(e.get("message")))
    means = [(nf.node, g) for nf in facts.nodes for g in nf.gpus if g.util_mean is not None]
    if len(means) >= 3:
        median = statistics.median(g.util_mean or 0.0 for _, g in means)
        for node, g in means:
            if median > 0 and (g.util_mean or 0.0) < STRAGGLER_RATIO * median:
                text = f"mean utilisation {g.util_mean:.0f}% vs job median {median:.0f}%"
                old = out.get((node, g.gpu))
                out[(node, g.gpu)] = Straggler(
                    node, g.gpu, g.util_mean, median, old.source if old else "stats", text
                )
    return [out[k] for k in sorted(out)]
