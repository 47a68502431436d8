"""The fault knowledge base: what an operator learned from a job's failure, searchable.

Incidents are JSON files in ``<evidence_dir>/incidents/`` (the shared evidence directory, so
every node's ``report`` sees them; one file per incident, written atomically, no database
locking on a parallel filesystem). Each carries the job's context (nodes, GPUs, Xids,
checks) so the report can show linked incidents (same job) and similar ones (same node and
GPU, same Xid or same check).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from slurmhealth.config import Config
from slurmhealth.errors import UsageError


@dataclass(frozen=True)
class Incident:
    id: str
    ts: float
    job_id: str
    symptom: str
    root_cause: str
    fix: str = ""
    prevention: str = ""
    author: str = ""
    nodes: tuple[str, ...] = ()
    gpus: tuple[str, ...] = ()  # "node:gpu"
    xids: tuple[int, ...] = ()
    checks: tuple[str, ...] = ()  # finding checks and event kinds seen in the job
    tags: tuple[str, ...] = field(default_factory=tuple)

    def text(self) -> str:
        return " ".join(
            [self.symptom, self.root_cause, self.fix, self.prevention, *self.tags, *self.checks]
            + [f"xid {x}" for x in self.xids]
            + list(self.nodes)
        ).lower()


def incidents_dir(cfg: Config) -> str:
    return os.path.join(cfg.expand(cfg.paths.evidence_dir), "incidents")


def context_of(rows: Iterable[Mapping[str, Any]], node: str) -> dict[str, set[Any]]:
    """Nodes, GPUs, Xids and checks in a node's findings/events rows of the job."""
    ctx: dict[str, set[Any]] = {"nodes": {node}, "gpus": set(), "xids": set(), "checks": set()}
    for r in rows:
        name = r.get("check_name") or r.get("kind")
        if name:
            ctx["checks"].add(str(name))
        if r.get("gpu") is not None:
            ctx["gpus"].add(f"{node}:{r['gpu']}")
        evidence = r.get("evidence")
        if isinstance(evidence, Mapping) and isinstance(evidence.get("xid"), int):
            ctx["xids"].add(int(evidence["xid"]))
    return ctx


def add(
    cfg: Config,
    job_id: str,
    *,
    symptom: str,
    root_cause: str,
    fix: str = "",
    prevention: str = "",
    author: str = "",
    context: Mapping[str, set[Any]] | None = None,
    tags: Sequence[str] = (),
    now: float | None = None,
) -> Incident:
    if not symptom.strip() or not root_cause.strip():
        raise UsageError("an incident needs --symptom and --root-cause")
    ctx = context or {}
    ts = time.time() if now is None else now
    incident = Incident(
        id=f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime(ts))}-{job_id}-{os.urandom(2).hex()}",
        ts=ts,
        job_id=job_id,
        symptom=symptom.strip(),
        root_cause=root_cause.strip(),
        fix=fix.strip(),
        prevention=prevention.strip(),
        author=author,
        nodes=tuple(sorted(ctx.get("nodes", ()))),
        gpus=tuple(sorted(ctx.get("gpus", ()))),
        xids=tuple(sorted(ctx.get("xids", ()))),
        checks=tuple(sorted(ctx.get("checks", ()))),
        tags=tuple(tags),
    )
    folder = incidents_dir(cfg)
    os.makedirs(folder, mode=0o755, exist_ok=True)
    path = os.path.join(folder, f"{incident.id}.json")
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(asdict(incident), fh, indent=1)
    os.replace(tmp, path)
    return incident


def load_all(cfg: Config) -> list[Incident]:
    folder = incidents_dir(cfg)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    out = []
    for name in names:
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                data = json.load(fh)
            out.append(
                Incident(
                    **{
                        **data,
                        **{k: tuple(data.get(k, ())) for k in ("nodes", "gpus", "xids", "checks")},
                        "tags": tuple(data.get("tags", ())),
                    }
                )
            )
        except (OSError, ValueError, TypeError):
            continue  # a half-copied or foreign file is not an incident
    return out


def search(cfg: Config, words: str, limit: int = 20) -> list[tuple[float, Incident]]:
    """Incidents ranked by how many of ``words`` they contain (all words weigh the same;
    newer first on ties)."""
    terms = [t for t in re.split(r"\W+", words.lower()) if t]
    if not terms:
        raise UsageError("incident search needs at least one word")
    scored = []
    for inc in load_all(cfg):
        text = inc.text()
        score = sum(1 for t in terms if t in text) / len(terms)
        if score > 0:
            scored.append((score, inc))
    scored.sort(key=lambda s: (-s[0], -s[1].ts))
    return scored[:limit]


def related(
    cfg: Config, job_id: str, context: Mapping[str, set[Any]], limit: int = 10
) -> list[tuple[str, Incident]]:
    """(why, incident) for incidents of this job ("linked") and similar ones: the same
    node+GPU, the same Xid, or the same check on the same node."""
    out = []
    for inc in load_all(cfg):
        if inc.job_id == job_id:
            out.append(("linked", inc))
            continue
        why = []
        if set(inc.gpus) & set(context.get("gpus", ())):
            why.append("same GPU")
        if set(inc.xids) & set(context.get("xids", ())):
            why.append("same Xid")
        same_node = set(inc.nodes) & set(context.get("nodes", ()))
        if same_node and set(inc.checks) & set(context.get("checks", ())):
            why.append("same node and check")
        if why:
            out.append((", ".join(why), inc))
    out.sort(key=lambda w: (w[0] != "linked", -w[1].ts))
    return out[:limit]
