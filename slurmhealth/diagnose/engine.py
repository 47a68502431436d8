"""Diagnosis: rules as data (``rules.toml``) matched against a job's :class:`Facts`.

Pure: no I/O except reading the rules file; the matcher vocabulary is documented at the top
of ``rules.toml``. A matcher returns the hits it found (what to cite, placeholder values) or
``None`` when it does not match; one :class:`Diagnosis` comes out per rule per (node, GPU).
Unknown values never match and odd values are skipped: :func:`diagnose` does not raise.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurmhealth.diagnose.facts import Citation, Diagnosis, Facts, NodeFacts
from slurmhealth.diagnose.loader import default_rules, load_rules
from slurmhealth.diagnose.rules import (  # re-exported: the engine's public names
    DRAINED_STATES,
    LOG_TAIL_LINES,
    MAX_CITATIONS,
    OPTIONAL,
    PLACEHOLDER,
    Hit,
    Rule,
    Scope,
    as_text,
    level_of,
)
from slurmhealth.model import Severity
from slurmhealth.model_records import Job

__all__ = [
    "LOG_TAIL_LINES", "MAX_CITATIONS", "Rule", "diagnose", "fill", "headline", "load_rules",
    "verdict",
]  # fmt: skip

# -- diagnosis ----------------------------------------------------------------------------------


@dataclass
class _Group:
    rule: Rule
    node: str | None
    gpu: int | None
    hits: list[Hit] = field(default_factory=list)
    cites: list[Hit] = field(default_factory=list)


def _match(facts: Facts, rules: Sequence[Rule]) -> dict[tuple[str, str | None, int | None], _Group]:
    """Group each rule's hits: one group per GPU matched (node-level hits shared), else one
    per node, else (job-level hits only) one for the job."""
    nodes = [n for n in facts.nodes or () if isinstance(n, NodeFacts)]
    scopes = [Scope(facts, n) for n in nodes] or [Scope(facts, NodeFacts(node=""))]
    groups: dict[tuple[str, str | None, int | None], _Group] = {}
    for rule in rules:
        for s in scopes:
            hits = rule.when(s)
            if hits is None:
                continue
            cites = [h for m in rule.cite for h in m(s) or ()]
            by_gpu: dict[int | None, list[Hit]] = {}
            for h in hits:
                by_gpu.setdefault(h.gpu, []).append(h)
            shared = by_gpu.pop(None, [])
            node = s.name if any(h.node is not None for h in hits) else None
            for gpu, own in sorted(by_gpu.items(), key=lambda kv: kv[0] or 0) or [(None, [])]:
                where = node if gpu is None else s.name
                g = groups.setdefault((rule.name, where, gpu), _Group(rule, where, gpu))
                g.hits += own + shared
                g.cites += [h for h in cites if h.gpu in (None, gpu)]
    return groups


def _values(
    node: str | None, gpu: int | None, hits: Iterable[Hit], job: Job
) -> dict[str, str | None]:
    """Placeholder values: node, gpu, job, where, and every value the hits carry."""
    node = node or ", ".join(as_text(n) for n in job.node_names or ()) or None
    found: dict[str, dict[str, None]] = {}
    for h in hits:
        for k, v in h.values:
            found.setdefault(k, {})[v] = None
    where = node if gpu is None else f"GPU {gpu} on {node}"
    return {k: ", ".join(vs) for k, vs in found.items()} | {
        "node": node,
        "gpu": None if gpu is None else str(gpu),
        "job": as_text(job.job_id) or None,
        "where": where or "the job",
    }


def fill(template: str, values: Mapping[str, str | None]) -> str:
    """Fill ``{name}`` placeholders; ``{? ... }`` is kept only when every placeholder in it
    is known; any other unknown placeholder shows as ``<name>``."""

    def optional(m: re.Match[str]) -> str:
        known = all(values.get(n) is not None for n in PLACEHOLDER.findall(m.group(1)))
        return fill(m.group(1), values) if known else ""

    def value(m: re.Match[str]) -> str:
        v = values.get(m.group(1))
        return f"<{m.group(1)}>" if v is None else v

    return PLACEHOLDER.sub(value, OPTIONAL.sub(optional, template))


def _by_ts(c: tuple[Any, ...]) -> tuple[bool, float]:
    return (c[4] is None, c[4] or 0.0)  # Hit.ts; unknown last


def _diagnosis(g: _Group, job: Job) -> Diagnosis:
    rule, values = g.rule, _values(g.node, g.gpu, g.hits + g.cites, job)
    level = level_of(rule.severity)
    if rule.escalate and g.hits:
        level = max(level, *(h.severity for h in g.hits))
    found = dict.fromkeys(sorted(dict.fromkeys(h[:6] for h in g.hits), key=_by_ts))
    cites = [c for c in dict.fromkeys(h[:6] for h in g.cites) if c not in found]
    stamps = [c[4] for c in found if c[4] is not None]
    return Diagnosis(
        rule=rule.name,
        title=rule.title,
        severity=Severity(level).label,
        root_cause=fill(rule.root_cause, values),
        verify=fill(rule.verify, values),
        admin_action=fill(rule.admin_action, values),
        confidence=rule.confidence,
        node=g.node,
        gpu=g.gpu,
        citations=tuple(Citation(*c) for c in [*found, *cites][:MAX_CITATIONS]),
        fault_class=rule.fault_class,
        user_action=fill(rule.user_action, values),
        count=len(found),
        first_ts=min(stamps, default=None),
        last_ts=max(stamps, default=None),
    )


def _order(d: Diagnosis) -> tuple[int, float, str, int, str]:
    gpu = -1 if d.gpu is None else d.gpu
    return (-level_of(d.severity), -d.confidence, d.node or "", gpu, d.rule)


def diagnose(facts: Facts, rules: Sequence[Rule] | None = None) -> list[Diagnosis]:
    """Every rule ``facts`` match, most severe and most confident first. A rule with
    ``suppressed_by`` gives way to any other rule of at least that severity."""
    rules = default_rules() if rules is None else rules
    out = [_diagnosis(g, facts.job) for g in _match(facts, rules).values()]
    floors = {r.name: level_of(r.suppressed_by) for r in rules}

    def kept(d: Diagnosis) -> bool:
        floor = floors[d.rule]
        return not floor or not any(o.rule != d.rule and level_of(o.severity) >= floor for o in out)

    return sorted(filter(kept, out), key=_order)


def _clock(ts: float) -> str:
    try:
        return time.strftime(" at %H:%M:%SZ", time.gmtime(ts))
    except (OverflowError, OSError, ValueError):
        return ""


def headline(
    diagnoses: Sequence[Diagnosis], rules: Sequence[Rule] | None = None
) -> Diagnosis | None:
    """The diagnosis the verdict names: the most severe, except that a rule with
    ``suppressed_by`` that held (nothing that severe matched) comes first."""
    if not diagnoses:
        return None
    by_name = {r.name: r for r in (default_rules() if rules is None else rules)}
    held = [d for d in diagnoses if d.rule in by_name and by_name[d.rule].suppressed_by]
    return min(held or diagnoses, key=_order)


def verdict(
    diagnoses: Sequence[Diagnosis], facts: Facts, rules: Sequence[Rule] | None = None
) -> str:
    """One line for the report header: the headline diagnosis in its rule's ``verdict`` words,
    the nodes left drained, and how many other problems and warnings there are.

    The headline is the most severe diagnosis, except that a rule with ``suppressed_by`` that
    held (nothing that severe matched: the failure is the application's) comes first.
    """
    top = headline(diagnoses, rules)
    if top is None:
        return "no problem found"
    rule = {r.name: r for r in (default_rules() if rules is None else rules)}.get(top.rule)
    group = _match(facts, [rule]).get((top.rule, top.node, top.gpu)) if rule else None
    values = _values(top.node, top.gpu, group.hits + group.cites if group else [], facts.job)
    stamps = [c.ts for c in top.citations if c.ts is not None]
    values |= {"title": top.title, "at": _clock(min(stamps)) if stamps else ""}
    text = fill(rule.verdict if rule and rule.verdict else "{title} ({where}){at}", values)
    drained = _left_drained(facts)
    if drained:
        text += f"; {', '.join(drained)} drained"
    levels = [level_of(d.severity) for d in diagnoses if d is not top]
    severe, warnings = sum(v >= Severity.FAIL for v in levels), levels.count(Severity.WARN)
    text += f"; {severe} more problem{'s' * (severe > 1)}" if severe else ""
    return text + (f"; {warnings} warning{'s' * (warnings > 1)}" if warnings else "")


def _left_drained(facts: Facts) -> list[str]:
    """The nodes the job's drains rows leave drained: each node's newest row decides (a
    drain followed by a resume is not one), rows without a time in the order recorded."""
    last: dict[str, Mapping[str, Any]] = {}
    for n in facts.nodes or ():
        rows = [r for r in n.drains or () if isinstance(r, Mapping)]
        for row in sorted(rows, key=lambda r: _ts_of(r.get("ts"))):
            last[as_text(row.get("node")) or as_text(n.node)] = row
    return sorted(k for k, r in last.items() if as_text(r.get("state")).lower() in DRAINED_STATES)


def _ts_of(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
