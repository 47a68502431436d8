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
import glob
import json
import os
import re
import sqlite3
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from slurmhealth.config import Config
from slurmhealth.diagnose.facts import Diagnosis, Facts, JobFacts, NodeFacts
from slurmhealth.errors import UsageError
from slurmhealth.report.collect import connect, history_paths, job_facts, node_facts
from slurmhealth.report.incidents import Incident

SCHEMA = "slurmhealth.report/1"
MAX_INCIDENTS = 10
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
class NodeEvidence:
    node: str
    source: str  # history | summary
    bundle_dir: str | None
    manifest: str | None  # manifest.json path when present
    summary: str | None  # summary.json path when present
    files: tuple[Mapping[str, Any], ...] = ()  # path, kind, size, sha256


@dataclass(frozen=True)
class PastIncident:
    job_id: str | None
    ts: float
    node: str
    gpu: int | None
    what: str
    severity: str


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


# -- sources --------------------------------------------------------------------------------


@dataclass
class _Db:
    path: str
    conn: sqlite3.Connection
    nodes: list[str]  # nodes whose rows about the job this history holds


def _open(path: str) -> sqlite3.Connection | None:
    try:
        conn = connect(path)
        conn.execute("select 1 from jobs limit 1")
    except sqlite3.Error:
        return None
    return conn


def _nodes_in(conn: sqlite3.Connection, job_id: str) -> list[str]:
    sql = " union ".join(
        f"select distinct node from {t} where job_id = ?"
        for t in ("jobs", "check_runs", "findings", "events", "drains", "samples")
    )
    return [r[0] for r in conn.execute(sql, (job_id,) * 6) if r[0]]


def _owner_uid(conn: sqlite3.Connection, job_id: str) -> int | None:
    row = conn.execute("select uid from jobs where job_id = ? and uid is not null", (job_id,))
    found = row.fetchone()
    return None if found is None else int(found[0])


def _merge_job(a: JobFacts | None, b: JobFacts) -> JobFacts:
    """Fill what ``a`` lacks from ``b`` (each node knows part: start on one, end on another)."""
    if a is None:
        return b
    changes = {k: v for k, v in vars(b).items() if v not in (None, "", ()) and not getattr(a, k)}
    merged = replace(a, **changes)
    if a.start_ts and b.start_ts and b.start_ts < a.start_ts:
        merged = replace(merged, start_ts=b.start_ts)
    if a.end_ts and b.end_ts and b.end_ts > a.end_ts:
        merged = replace(merged, end_ts=b.end_ts)
    if _state_rank(b.state) > _state_rank(merged.state):  # a node that saw the end wins
        merged = replace(merged, state=b.state)
    if b.exit_code not in (None, "", "0:0") and merged.exit_code in (None, "", "0:0"):
        merged = replace(merged, exit_code=b.exit_code)
    return merged


def _state_rank(state: str) -> int:
    return {"": 0, "running": 1, "completed": 2}.get(state, 3)


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _evidence_root(cfg: Config, node: str) -> str:
    return cfg.paths.evidence_dir.replace("{node}", node)


def _summaries(cfg: Config, job_id: str) -> dict[str, tuple[str, dict[str, Any]]]:
    out = {}
    pattern = os.path.join(_evidence_root(cfg, "*"), job_id, "*", "summary.json")
    for path in sorted(glob.glob(pattern)):
        data = _read_json(path)
        if isinstance(data, dict) and data.get("node"):
            out[str(data["node"])] = (path, data)
    return out


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


def _scan(
    cfg: Config, job_id: str, summaries: Mapping[str, tuple[str, dict[str, Any]]]
) -> tuple[JobFacts | None, int | None, list[_Db]]:
    """The job row and owner from every reachable history, and which nodes each one holds.
    Two passes: the first may learn the job's node list, whose histories the second opens."""
    job: JobFacts | None = None
    owner: int | None = None
    dbs: list[_Db] = []
    paths = history_paths(cfg)
    for _ in range(2):
        for path in paths:
            if any(d.path == path for d in dbs) or (conn := _open(path)) is None:
                continue
            dbs.append(_Db(path, conn, _nodes_in(conn, job_id)))
            found = job_facts(conn, job_id)
            job = job if found is None else _merge_job(job, found)
            owner = owner if owner is not None else _owner_uid(conn, job_id)
        more = history_paths(cfg, (*(job.nodes if job else ()), *summaries))
        if set(more) <= set(paths):
            break
        paths = more
    for _path, data in summaries.values():
        if isinstance(data.get("job"), dict):
            with contextlib.suppress(TypeError):
                extra = {**data["job"], "job_id": job_id}
                extra["nodes"] = tuple(extra.get("nodes") or ())
                extra["gpus"] = tuple(extra.get("gpus") or ())
                job = _merge_job(job, JobFacts(**extra))
    return job, owner, dbs


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
    summaries = _summaries(cfg, job_id)
    job, owner, dbs = _scan(cfg, job_id, summaries)
    try:
        where = [d.path for d in dbs] or history_paths(cfg) or [f"{cfg.db_path()} (missing)"]
        where.append(os.path.join(_evidence_root(cfg, "*"), job_id))
        if job is None and not summaries and not any(d.nodes for d in dbs):
            raise UsageError(f"no record of job {job_id} in {', '.join(where)}")
        job = job or JobFacts(job_id=job_id)
        if requester_uid is not None:
            check_permission(cfg, job, owner, requester_uid)
        nodes, sources, evidence = _read_nodes(cfg, job, dbs, summaries)
        if not job.nodes:
            job = replace(job, nodes=tuple(n.node for n in nodes))
        facts = Facts(job=job, nodes=tuple(nodes))
        diagnoses, verdict_text = _diagnose(facts)
        timeline = _timeline(facts)
        failure = _failure_ts(timeline, job)
        if window_s is not None and failure is not None:
            timeline = [e for e in timeline if abs(e.ts - failure) <= window_s]
        incidents = _past_incidents(dbs, job_id, facts)
    finally:
        for d in dbs:
            d.conn.close()
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


def _read_nodes(
    cfg: Config,
    job: JobFacts,
    dbs: list[_Db],
    summaries: Mapping[str, tuple[str, dict[str, Any]]],
) -> tuple[list[NodeFacts], list[tuple[str, str, str]], list[NodeEvidence]]:
    """Per node its live history when one holds it, else its summary.json."""
    live: dict[str, _Db] = {}
    for d in dbs:
        for node in d.nodes:
            live.setdefault(node, d)
    chosen: list[tuple[str, str, str, NodeFacts | None]] = []  # node, source, path, facts
    for node in dict.fromkeys([*job.nodes, *sorted(live), *sorted(summaries)]):
        summary = _node_summary(summaries, node)
        if node in live and summary and _unchanged(live[node].conn, job.job_id, node, summary):
            # the epilog's precomputed facts of exactly these history rows
            chosen.append((node, "summary-current", summaries[node][0], summary))
        elif node in live:
            chosen.append((node, "history", live[node].path, None))
        elif summary is not None:
            chosen.append((node, "summary", summaries[node][0], summary))
    # (threads made this slower: each row tuple needs the GIL, so they only convoy)
    nodes, sources, evidence = [], [], []
    for node, source, path, nf in chosen:
        facts = nf if nf is not None else _aggregate(path, job.job_id, node)
        nodes.append(facts)
        sources.append((node, source, path))
        evidence.append(_evidence(cfg, job.job_id, facts, source))
    return nodes, sources, evidence


def _aggregate(path: str, job_id: str, node: str) -> NodeFacts:
    conn = connect(path)  # a connection per thread
    try:
        return node_facts(conn, job_id, node)
    finally:
        conn.close()


def _node_summary(
    summaries: Mapping[str, tuple[str, dict[str, Any]]], node: str
) -> NodeFacts | None:
    try:
        return NodeFacts.from_dict(summaries[node][1]) if node in summaries else None
    except (TypeError, KeyError, ValueError):
        return None


_COUNTS_SQL = " union all ".join(
    f"select count(*) from {t} where job_id = ? and node = ?{extra}"
    for t, extra in (("check_runs", ""), ("findings", ""), ("events", ""), ("drains", ""),
                     ("evidence", ""), ("samples", " and gpu is not null"))
)  # fmt: skip


def _unchanged(conn: sqlite3.Connection, job_id: str, node: str, nf: NodeFacts) -> bool:
    """Whether the summary was built from exactly the rows the history holds now (rows are
    only ever appended), so its aggregates can stand in for a day of samples."""
    mine = (len(nf.runs), len(nf.findings), len(nf.events), len(nf.drains), len(nf.evidence),
            sum(g.samples for g in nf.gpus))  # fmt: skip
    try:
        rows = conn.execute(_COUNTS_SQL, (job_id, node) * 6).fetchall()
    except sqlite3.Error:
        return False
    return tuple(r[0] for r in rows) == mine


def _diagnose(facts: Facts) -> tuple[list[Diagnosis], str]:
    import importlib

    try:
        engine: Any = importlib.import_module("slurmhealth.diagnose.engine")
    except ModuleNotFoundError:
        return [], "no diagnosis (slurmhealth.diagnose.engine is not installed)"
    diagnoses = list(engine.diagnose(facts))
    return diagnoses, str(engine.verdict(diagnoses, facts))


def _evidence(cfg: Config, job_id: str, nf: NodeFacts, source: str) -> NodeEvidence:
    folder = os.path.join(_evidence_root(cfg, nf.node), job_id, nf.node)
    manifest = os.path.join(folder, "manifest.json")
    summary = os.path.join(folder, "summary.json")
    files: dict[str, Mapping[str, Any]] = {}
    for row in nf.evidence:
        if row.get("path"):
            files[str(row["path"])] = _file_entry(row, None)
    data = _read_json(manifest) if os.path.exists(manifest) else None
    entries: Any = data.get("files", data.get("entries")) if isinstance(data, dict) else data
    for item in entries if isinstance(entries, list) else []:
        entry = _file_entry(item if isinstance(item, dict) else {"path": item}, folder)
        files.setdefault(str(entry["path"]), entry)
    bundle = nf.bundle_dir or (folder if os.path.isdir(folder) else None)
    return NodeEvidence(
        node=nf.node,
        source=source,
        bundle_dir=bundle,
        manifest=manifest if os.path.exists(manifest) else None,
        summary=summary if os.path.exists(summary) else None,
        files=tuple(files.values()),
    )


def _file_entry(item: Mapping[str, Any], folder: str | None) -> dict[str, Any]:
    path = str(item.get("path") or item.get("name") or "")
    if folder and path and not os.path.isabs(path):
        path = os.path.join(folder, path)
    return {
        "path": path,
        "kind": item.get("kind"),
        "size": item.get("size"),
        "sha256": item.get("sha256"),
    }


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


def _xids(facts: Facts) -> set[int]:
    found = set()
    for nf in facts.nodes:
        for row in (*nf.findings, *nf.events):
            ev = row.get("evidence")
            if isinstance(ev, dict) and isinstance(ev.get("xid"), int):
                found.add(int(ev["xid"]))
    return found


_INCIDENT_SQL = """
select job_id, ts, node, gpu, {what} as what, message, severity from {table}
where (job_id is null or job_id != ?) and severity not in ('ok')
  and ({pairs} or json_extract(evidence, '$.xid') in ({xids}))
order by ts desc limit 50
"""


def _past_incidents(dbs: list[_Db], job_id: str, facts: Facts) -> list[PastIncident]:
    pairs = {(nf.node, g.gpu) for nf in facts.nodes for g in nf.gpus}
    rows = [(nf.node, r) for nf in facts.nodes for r in (*nf.findings, *nf.events)]
    pairs |= {(n, r["gpu"]) for n, r in rows if r.get("gpu") is not None}
    xids = sorted(_xids(facts))
    if not pairs and not xids:
        return []
    cond = " or ".join(["(node = ? and gpu = ?)"] * len(pairs)) or "0"
    params: list[Any] = [job_id, *(v for p in sorted(pairs) for v in p), *xids]
    found: dict[tuple[Any, ...], PastIncident] = {}
    marks = ", ".join("?" * len(xids))
    for table, what in (("findings", "check_name"), ("events", "kind")):
        sql = _INCIDENT_SQL.format(table=table, what=what, pairs=cond, xids=marks)
        for d in dbs:
            with contextlib.suppress(sqlite3.Error):
                for r in d.conn.execute(sql, params).fetchall():
                    what_text = f"{r['what']}: {r['message']}"
                    inc = PastIncident(r["job_id"], float(r["ts"]), r["node"], r["gpu"],
                                       what_text, str(r["severity"] or "info"))  # fmt: skip
                    key = (inc.job_id, inc.node, inc.gpu, inc.what)
                    if key not in found or found[key].ts < inc.ts:
                        found[key] = inc
    return sorted(found.values(), key=lambda i: i.ts, reverse=True)[:MAX_INCIDENTS]
