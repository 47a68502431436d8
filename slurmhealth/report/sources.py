"""Where ``slurmhealth report`` finds a job: this node's history and those of the job's
nodes (never every ``{node}`` history of a shared path once the node list is known; one
open at a time) and the shared evidence dir's ``<job_id>/<node>/summary.json``, merged per
node (a node's live history wins over its summary unless the summary was built from
exactly the rows it holds now).

Reads go through the history's named queries; nothing here knows SQL. Times are UTC s.
"""

from __future__ import annotations

import contextlib
import glob
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from slurmhealth.access import safe_read, trust
from slurmhealth.config import Config
from slurmhealth.diagnose.facts import Facts, NodeFacts, job_from_dict
from slurmhealth.history import read
from slurmhealth.model_records import Job
from slurmhealth.summary.collect import job_facts, node_facts

MAX_INCIDENTS = 10


class Summary(NamedTuple):
    """One node's ``summary.json``: where it lies, and what it says."""

    path: str
    data: dict[str, Any]


Summaries = Mapping[str, Summary]  # by node


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


@dataclass
class OpenHistory:
    path: str
    db: read.Reader
    nodes: list[str]  # nodes whose rows about the job this history holds


def merge_job(a: Job | None, b: Job) -> Job:
    """Fill what ``a`` lacks from ``b`` (each node knows part: start on one, end on another).

    A requeued job has attempts one after the other (a node whose prolog failed ran its
    epilog before the job started again elsewhere): the later attempt's outcome, exit code
    and nodes are the job's; the earlier attempt's node stays in the story through its own
    rows (its drain)."""
    if a is None:
        return b
    if _after(b, a) or _after(a, b):
        first, last = (a, b) if _after(b, a) else (b, a)
        fill = {k: v for k, v in _missing(last, first).items() if k not in _OUTCOME}
        return replace(last, start_ts=first.start_ts or last.start_ts, **fill)
    merged = replace(a, **_missing(a, b))
    if a.start_ts and b.start_ts and b.start_ts < a.start_ts:
        merged = replace(merged, start_ts=b.start_ts)
    if a.end_ts and b.end_ts and b.end_ts > a.end_ts:
        merged = replace(merged, end_ts=b.end_ts)
    if _state_rank(b.state) > _state_rank(merged.state):  # a node that saw the end wins
        merged = replace(merged, state=b.state)
    if b.exit_code not in (None, "", "0:0") and merged.exit_code in (None, "", "0:0"):
        merged = replace(merged, exit_code=b.exit_code)
    return merged


_OUTCOME = ("state", "exit_code", "end_ts", "node_names", "start_ts")


def _missing(a: Job, b: Job) -> dict[str, Any]:
    """What ``b`` knows that ``a`` does not."""
    return {k: v for k, v in vars(b).items() if v not in (None, "", ()) and not getattr(a, k)}


def _after(later: Job, earlier: Job) -> bool:
    """``later`` started after ``earlier`` had ended: another attempt of a requeued job."""
    return bool(later.start_ts and earlier.end_ts and later.start_ts >= earlier.end_ts)


def _state_rank(state: str) -> int:
    return {"": 0, "running": 1, "completed": 2}.get(state, 3)


def _read_json(path: str) -> Any:
    """A bundle file as JSON (no symlink, FIFO or device followed; capped), else None."""
    return safe_read.read_json_or_none(path, safe_read.MANIFEST_MAX)


def evidence_root(cfg: Config, node: str) -> str:
    return cfg.paths.evidence_dir.replace("{node}", node)


def summaries(
    cfg: Config, job_id: str, tampered: dict[str, str] | None = None
) -> dict[str, Summary]:
    """Every node's ``summary.json`` of the job in the shared evidence dir, by node: only
    those their bundle's root-written manifest vouches for (:mod:`slurmhealth.access.trust`);
    the others go to ``tampered`` (path -> why) and are not used."""
    out = {}
    pattern = os.path.join(evidence_root(cfg, "*"), job_id, "*", "summary.json")
    for path in sorted(glob.glob(pattern)):
        data, why = trust.check_summary(path)
        if why is not None and tampered is not None:
            tampered[path] = why
        if isinstance(data, dict) and data.get("node"):
            out[str(data["node"])] = Summary(path, data)
    return out


def _owner(db: read.Reader, job_id: str) -> int | None:
    try:
        return read.owner_uid(db, job_id)
    except read.StoreError:
        return None


def _summary_job(job_id: str, found: Summaries) -> Job | None:
    job = None
    for _path, data in found.values():
        if isinstance(data.get("job"), dict):
            with contextlib.suppress(TypeError):
                extra = {**data["job"], "job_id": job_id}
                extra["nodes"] = tuple(extra.get("nodes") or ())
                extra["gpus"] = tuple(extra.get("gpus") or ())
                job = merge_job(job, job_from_dict(extra))
    return job


@dataclass
class _Scan:
    job_id: str
    job: Job | None = None
    owner: int | None = None
    dbs: list[OpenHistory] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)

    def visit(self, path: str) -> None:
        """Read what ``path`` knows of the job, then close it: one history open at a time."""
        if path in self.seen:
            return
        self.seen.add(path)
        with read.Reader(path) as db:
            try:
                nodes, row = read.nodes_of_job(db, self.job_id), job_facts(db, self.job_id)
            except read.StoreError as exc:
                self.unreadable[path] = str(exc.__cause__ or exc)
                return
            owner = _owner(db, self.job_id) if self.owner is None else self.owner
        self.dbs.append(OpenHistory(path, db, nodes))
        self.job = self.job if row is None else merge_job(self.job, row)
        self.owner = owner

    def nodes(self, extra: Job | None) -> tuple[str, ...]:
        return (*(self.job.node_names if self.job else ()), *(extra.node_names if extra else ()))


def scan(
    cfg: Config, job_id: str, found: Summaries
) -> tuple[Job | None, int | None, list[OpenHistory], dict[str, str]]:
    """The job row and owner from the histories of this node and of the job's nodes (its
    node list from a history or a summary), which nodes each one holds, and the histories
    that could not be read (path -> why: corrupt, not a history, no access). Every other
    ``{node}`` history is looked into, one at a time, only while the job's node list is
    unknown. Each history is closed after reading (``OpenHistory.db`` reopens on use)."""
    summary_job = _summary_job(job_id, found)
    state = _Scan(job_id)
    for path in read.history_paths(cfg, (*found, *state.nodes(summary_job)), discover=False):
        state.visit(path)
    for path in read.history_paths(cfg, state.nodes(summary_job), discover=False):
        state.visit(path)
    if not state.nodes(summary_job):
        for path in read.history_paths(cfg):
            state.visit(path)
            if state.nodes(None):
                break
        for path in read.history_paths(cfg, state.nodes(None), discover=False):
            state.visit(path)
    job = state.job if summary_job is None else merge_job(state.job, summary_job)
    return job, state.owner, state.dbs, state.unreadable


def read_nodes(
    cfg: Config, job: Job, dbs: list[OpenHistory], found: Summaries
) -> tuple[list[NodeFacts], list[tuple[str, str, str]], list[NodeEvidence]]:
    """Per node its live history when one holds it, else its summary.json."""
    live: dict[str, OpenHistory] = {}
    for d in dbs:
        for node in d.nodes:
            live.setdefault(node, d)
    chosen: list[tuple[str, str, str, NodeFacts | None]] = []  # node, source, path, facts
    for node in dict.fromkeys([*job.node_names, *sorted(live), *sorted(found)]):
        summary = _node_summary(found, node)
        if node in live and summary and _unchanged(live[node].path, job.job_id, node, summary):
            # the epilog's precomputed facts of exactly these history rows
            chosen.append((node, "summary-current", found[node][0], summary))
        elif node in live:
            chosen.append((node, "history", live[node].path, None))
        elif summary is not None:
            chosen.append((node, "summary", found[node][0], summary))
    # (threads made this slower: each row tuple needs the GIL, so they only convoy)
    nodes, sources, evidence = [], [], []
    for node, source, path, nf in chosen:
        if nf is None:
            with read.Reader(path) as db:
                nf = node_facts(db, job.job_id, node)
        nodes.append(nf)
        sources.append((node, source, path))
        evidence.append(node_evidence(cfg, job.job_id, nf, source))
    return nodes, sources, evidence


def _node_summary(found: Summaries, node: str) -> NodeFacts | None:
    try:
        return NodeFacts.from_dict(found[node][1]) if node in found else None
    except (TypeError, KeyError, ValueError):
        return None


def _unchanged(path: str, job_id: str, node: str, nf: NodeFacts) -> bool:
    """Whether the summary was built from exactly the rows the history holds now (rows are
    only ever appended), so its aggregates can stand in for a day of samples."""
    mine = {"check_runs": len(nf.runs), "findings": len(nf.findings), "events": len(nf.events),
            "drains": len(nf.drains), "evidence": len(nf.evidence),
            "samples": sum(g.samples for g in nf.gpus)}  # fmt: skip
    try:
        with read.Reader(path) as db:
            return read.job_row_counts(db, job_id, node) == mine
    except read.StoreError:
        return False


def node_evidence(cfg: Config, job_id: str, nf: NodeFacts, source: str) -> NodeEvidence:
    """The node's bundle files: its history's ``evidence`` rows and its manifest."""
    folder = os.path.join(evidence_root(cfg, nf.node), job_id, nf.node)
    manifest = os.path.join(folder, "manifest.json")
    summary = os.path.join(folder, "summary.json")
    files: dict[str, Mapping[str, Any]] = {}
    for row in nf.evidence:
        if row.get("path"):
            files[str(row["path"])] = _file_entry(row, None)
    data = _read_json(manifest) if os.path.exists(manifest) else None
    entries: Any = data.get("files", data.get("entries")) if isinstance(data, dict) else data
    for item in entries if isinstance(entries, list) else []:
        if isinstance(item, dict) and item.get("name") == "summary.json":
            continue  # listed for its sha256; shown as the node's summary
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


def past_incidents(dbs: list[OpenHistory], job_id: str, facts: Facts) -> list[PastIncident]:
    """Other jobs' findings and events on this job's GPUs (the node and GPU pairs it
    sampled or that its own rows name) from before its end, newest first; only the
    histories of the job's nodes are read, one at a time."""
    pairs = {(nf.node, g.gpu) for nf in facts.nodes for g in nf.gpus}
    rows = [(nf.node, r) for nf in facts.nodes for r in (*nf.findings, *nf.events)]
    pairs |= {(n, r["gpu"]) for n, r in rows if r.get("gpu") is not None}
    before = facts.job.end_ts or time.time()
    found: dict[tuple[Any, ...], PastIncident] = {}
    for d in dbs:
        mine = {p for p in pairs if p[0] in d.nodes}
        if not mine:
            continue
        with contextlib.suppress(read.StoreError), read.Reader(d.path) as db:
            for r in read.past_incident_rows(db, job_id, mine, before):
                inc = PastIncident(r["job_id"], float(r["ts"]), r["node"], r["gpu"],
                                   f"{r['what']}: {r['message']}",
                                   str(r["severity"] or "info"))  # fmt: skip
                key = (inc.job_id, inc.node, inc.gpu, inc.what)
                if key not in found or found[key].ts < inc.ts:
                    found[key] = inc
    return sorted(found.values(), key=lambda i: i.ts, reverse=True)[:MAX_INCIDENTS]
