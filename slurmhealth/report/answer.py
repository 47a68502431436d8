"""The top of a report: the answer (verdict, whose fault, what the user and the admins do or
already did) and the diagnoses grouped one line per cause.

Pure: facts and diagnoses in, frozen answers out; every renderer shows them the same way.
Times are UTC seconds.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurmhealth.diagnose.engine import headline
from slurmhealth.diagnose.facts import Diagnosis, Facts
from slurmhealth.diagnose.rules import DRAINED_STATES, as_text

MAX_EVIDENCE = 3  # lines of evidence under the answer (the diagnoses list the rest)
NO_FAULT = "none"  # the fault class of a job nothing went wrong with


@dataclass(frozen=True)
class Answer:
    """What the reader of a report wants first."""

    verdict: str
    fault_class: str  # hardware | system | application | unknown | none
    confidence: float | None  # the headline diagnosis' (0-1); None without one
    evidence: tuple[str, ...]  # the headline's first citations, as text
    user_action: str  # what the job's owner does next
    admin_action: str  # what the admins do next
    admin_done: tuple[str, ...]  # what was already done: drains, requeues


@dataclass(frozen=True)
class DiagnosisGroup:
    """The diagnoses of one rule on one node (or the job), their GPUs and matches merged."""

    rule: str
    title: str
    severity: str
    fault_class: str
    node: str | None
    gpus: tuple[int, ...]
    count: int  # matched rows, samples and log lines over the group
    first_ts: float | None
    last_ts: float | None
    line: str  # "GPU clocks throttled on n2 GPU 3: seen 24 times 10:02Z-13:40Z"
    diagnoses: tuple[Diagnosis, ...]


def gpu_list(gpus: Iterable[int]) -> str:
    """``0-3,5,7``: indices with runs of consecutive ones as ranges."""
    runs: list[list[int]] = []
    for g in sorted(set(gpus)):
        if runs and g == runs[-1][1] + 1:
            runs[-1][1] = g
        else:
            runs.append([g, g])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def where_gpus(node: str | None, gpus: Sequence[int]) -> str:
    """``n2 GPU 3``, ``n2 GPUs 0-7``, ``n2`` or ``the job``."""
    if not gpus:
        return node or "the job"
    label = f"GPU {gpus[0]}" if len(gpus) == 1 else f"GPUs {gpu_list(gpus)}"
    return f"{node} {label}" if node else label


def _clock(ts: float, day: bool) -> str:
    return time.strftime("%Y-%m-%d %H:%MZ" if day else "%H:%MZ", time.gmtime(ts))


def when_text(count: int, first: float | None, last: float | None) -> str:
    """``seen 24 times 10:02Z-13:40Z``, ``once at 10:02Z`` or empty (no time known)."""
    if first is None or last is None:
        return ""
    day = time.gmtime(first)[:3] != time.gmtime(last)[:3]
    if count <= 1 or last - first < 60:
        times = "once" if count <= 1 else f"seen {count} times"
        return f"{times} at {_clock(first, day)}"
    return f"seen {count} times {_clock(first, day)}-{_clock(last, day)}"


def group_diagnoses(diagnoses: Sequence[Diagnosis]) -> list[DiagnosisGroup]:
    """One group per (rule, node), in the diagnoses' order (most severe first)."""
    by_key: dict[tuple[str, str | None], list[Diagnosis]] = {}
    for d in diagnoses:
        by_key.setdefault((d.rule, d.node), []).append(d)
    out = []
    for (rule, node), ds in by_key.items():
        gpus = tuple(sorted({d.gpu for d in ds if d.gpu is not None}))
        count = sum(max(d.count, 1) for d in ds)
        firsts = [d.first_ts for d in ds if d.first_ts is not None]
        lasts = [d.last_ts for d in ds if d.last_ts is not None]
        first, last = min(firsts, default=None), max(lasts, default=None)
        when = when_text(count, first, last)
        line = f"{ds[0].title} on {where_gpus(node, gpus)}" + (f": {when}" if when else "")
        out.append(DiagnosisGroup(rule, ds[0].title, ds[0].severity, ds[0].fault_class, node,
                                  gpus, count, first, last, line, tuple(ds)))  # fmt: skip
    return out


def _drain_text(row: Mapping[str, Any], phases: Mapping[str, str], node: str) -> str:
    who = as_text(row.get("actor")) or "slurmhealth"
    at = _clock(float(row["ts"]), False) if isinstance(row.get("ts"), int | float) else "?"
    state, reason = as_text(row.get("state")).lower(), as_text(row.get("reason"))
    name = as_text(row.get("node")) or node
    if state in DRAINED_STATES:
        text = f"{name} drained by {who} at {at}" + (f" ({reason})" if reason else "")
        if phases.get(as_text(row.get("run_id"))) == "prolog":
            text += "; the prolog failed, so Slurm requeued the job"
        return text
    return f"{name}: drain {state or 'not done'} at {at}" + (f" ({reason})" if reason else "")


def admin_done(facts: Facts) -> tuple[list[str], list[str]]:
    """What was already done about the job's nodes (drains, requeues), and the drained nodes."""
    done, drained = [], []
    for nf in facts.nodes:
        phases = {as_text(r.get("run_id")): as_text(r.get("phase")) for r in nf.runs}
        for row in nf.drains:
            text = _drain_text(row, phases, nf.node)
            if text not in done:  # the prolog's and a retry's row of one drain: once
                done.append(text)
            if as_text(row.get("state")).lower() in DRAINED_STATES:
                drained.append(as_text(row.get("node")) or nf.node)
        done += [_remediation_text(row, nf.node) for row in nf.remediations]
    return done, sorted(set(drained))


def _remediation_text(row: Mapping[str, Any], node: str) -> str:
    """``n2: remediation reset gpu4: ok at 14:01:02``."""
    at = (
        _clock(float(row["started"]), False) if isinstance(row.get("started"), int | float) else "?"
    )
    gpus = row.get("gpus") if isinstance(row.get("gpus"), list) else []
    where = f" gpu{','.join(map(str, gpus))}" if gpus and len(gpus) < 8 else ""
    action, outcome = as_text(row.get("action")), as_text(row.get("outcome"))
    return f"{as_text(row.get('node')) or node}: remediation {action}{where}: {outcome} at {at}"


def drained_by_us(facts: Facts) -> dict[str, Mapping[str, Any]]:
    """node -> the drains row that left it drained by slurmhealth, where the node's newest
    row (a later resume, a refused one) does not say otherwise."""
    out: dict[str, Mapping[str, Any]] = {}
    for nf in facts.nodes:
        rows = [r for r in nf.drains if isinstance(r.get("ts"), int | float)]
        if not rows:
            continue
        last = max(rows, key=lambda r: float(r["ts"]))
        state = as_text(last.get("state")).lower()
        if state in ("drained", "already") and as_text(last.get("actor")).startswith(
            "slurmhealth"
        ):  # "held": drained by someone else, left as is
            out[as_text(last.get("node")) or nf.node] = last
    return out


_DRAIN_CLAUSE = re.compile(r"^(?:drain|drain the node) (?P<node>\S+)$")


def left_to_do(action: str, node: str, row: Mapping[str, Any]) -> str:
    """The admins' next steps for ``node`` that slurmhealth already drained: the rule's
    action without its "drain NODE" (done), then how the node comes back."""
    steps = [c for c in action.split("; ") if not _DRAIN_CLAUSE.match(c.strip())]
    at = _clock(float(row["ts"]), False)
    rest = "; ".join(steps) if steps else "find and fix the cause"
    back = (f"then, on {node}, `slurmhealth validate` and "
            f"`slurmhealth resume {node} --reason \"what was fixed\"`")  # fmt: skip
    return f"{node} is already drained (by slurmhealth at {at}). Left to do: {rest}; {back}"


def _evidence(citations: Sequence[Any]) -> tuple[str, ...]:
    """The headline's first citations as ``HH:MMZ text``, each text once (the prolog and the
    epilog cite the same finding): a repeat is counted, ``(x2)``."""
    seen: dict[str, list[str]] = {}
    for c in citations:
        text = c.text.splitlines()[0] if c.text else ""
        if not text:
            continue
        if text not in seen and len(seen) == MAX_EVIDENCE:
            continue
        seen.setdefault(text, []).append(_clock(c.ts, False) if c.ts is not None else "")
    out = []
    for text, times in seen.items():
        when = f"{times[0]} " if times[0] else ""
        out.append(when + text + (f" (x{len(times)})" if len(times) > 1 else ""))
    return tuple(out)


def answer(verdict: str, diagnoses: Sequence[Diagnosis], facts: Facts) -> Answer:
    """The verdict, whose fault it is and the next steps, from the headline diagnosis."""
    done, drained = admin_done(facts)
    top = headline(diagnoses)
    if top is None:
        return Answer(verdict, NO_FAULT, None, (),
                      "nothing to do: no fault was found on the job's nodes and GPUs",
                      "nothing to do", tuple(done))  # fmt: skip
    user = top.user_action
    if drained and top.fault_class in ("hardware", "system"):
        nodes = ", ".join(drained)
        user += (f". {nodes} {'is' if len(drained) == 1 else 'are'} already drained: "
                 "Slurm gives it to no job until the admins return it")  # fmt: skip
    evidence = _evidence(top.citations)
    admin = top.admin_action
    ours = drained_by_us(facts)
    node = top.node if top.node in ours else (next(iter(ours)) if len(ours) == 1 else None)
    if node is not None and top.fault_class in ("hardware", "system", "unknown"):
        admin = left_to_do(admin, node, ours[node])
    return Answer(verdict, top.fault_class, top.confidence, evidence, user, admin, tuple(done))
