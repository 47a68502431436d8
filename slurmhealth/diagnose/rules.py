"""The rule vocabulary: matchers over a job's :class:`Facts`.

A matcher returns the hits it found (what to cite, placeholder values) or ``None`` when it
does not match. Unknown values never match. :mod:`slurmhealth.diagnose.loader` reads
``rules.toml`` into :class:`Rule` s; :mod:`slurmhealth.diagnose.engine` groups hits into
diagnoses.
"""

from __future__ import annotations

import math
import operator
import re
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from slurmhealth.checks.straggler import PEERS_BUSY_PCT, RATIO, stragglers
from slurmhealth.diagnose.facts import Facts, GpuStats, NodeFacts, TaskFacts
from slurmhealth.diagnose.nccl_log import NcclFacts, read_facts
from slurmhealth.model import Severity
from slurmhealth.model_records import Job

MAX_CITATIONS = 25  # per diagnosis: the earliest matches first, then the cited tails
LOG_TAIL_LINES = 5  # lines cited from a log matched without a pattern
MAX_TEXT = 300  # characters of a cited message or log line
FAULT_CLASSES = frozenset({"hardware", "system", "application", "unknown"})
DRAINED_STATES = frozenset({"drained", "already", "held"})  # drains rows: node left drained
# fmt: off
COMPARE: Mapping[str, Callable[[float, float], bool]] = {
    "above": operator.gt, "below": operator.lt, "at_least": operator.ge, "at_most": operator.le}
AGG: Mapping[str, Callable[[list[float]], float]] = {
    "mean": statistics.fmean, "median": statistics.median, "min": min, "max": max}
# fmt: on
PLACEHOLDER = re.compile(r"\{([A-Za-z_]\w*)\}")
OPTIONAL = re.compile(r"\{\?((?:[^{}]|\{[A-Za-z_]\w*\})*)\}")  # {? text {name} }
_LEVELS = {s.label: int(s) for s in Severity}


class Hit(NamedTuple):
    """What a matcher matched: a :class:`Citation`'s fields (made into one only for the
    citations kept), placeholder values and the matched row's severity (0: unknown)."""

    kind: str
    text: str
    node: str | None = None
    gpu: int | None = None
    ts: float | None = None
    ref: str | None = None
    values: tuple[tuple[str, str], ...] = ()
    severity: int = 0


Matcher = Callable[["Scope"], list[Hit] | None]
Fn = Callable[[Mapping[str, Any], "Scope"], list[Hit] | None]  # a matcher before its options


@dataclass(frozen=True)
class Rule:
    """One ``[[rule]]`` of the rules file, ``when`` and ``cite`` compiled to matchers."""

    name: str
    title: str
    severity: str
    root_cause: str
    verify: str
    fault_class: str  # hardware | system | application | unknown
    user_action: str
    admin_action: str
    confidence: float
    when: Matcher = field(compare=False, repr=False)
    cite: tuple[Matcher, ...] = field(default=(), compare=False, repr=False)
    suppressed_by: str | None = None
    escalate: bool = False
    verdict: str = ""


# -- odd-value tolerant readers -----------------------------------------------------------------


def _float(v: Any) -> float | None:
    if type(v) is float:
        return v if math.isfinite(v) else None
    if type(v) is not int and type(v) is not str:  # bool, None, containers: unknown
        return None
    try:
        f = float(v)
    except (ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


def _int(v: Any) -> int | None:
    if type(v) is int:
        return v
    f = _float(v)
    return int(f) if f is not None and f.is_integer() else None


def as_text(v: Any) -> str:
    return v if isinstance(v, str) else "" if v is None else str(v)


def level_of(label: Any) -> int:
    """Severity value of a label ("fail") or of a stored value (30); 0 when unknown."""
    if isinstance(label, str):
        return _LEVELS.get(label.strip().lower(), 0)
    return label if type(label) is int and label in _LEVELS.values() else 0


def _exit(code: Any) -> tuple[int | None, int | None]:
    """``"3:0"`` -> (3, 0); ``"3"`` -> (3, 0); anything else -> (None, None)."""
    parts = as_text(code).split(":")
    exit_, sig = _int(parts[0].strip()), _int(parts[1].strip()) if len(parts) > 1 else 0
    return (exit_, sig) if exit_ is not None and sig is not None else (None, None)


def _evidence(row: Mapping[str, Any]) -> Mapping[str, Any]:
    ev = row.get("evidence")
    return ev if isinstance(ev, Mapping) else {}


def _xid_of(row: Mapping[str, Any]) -> int | None:
    return _int(_evidence(row).get("xid"))


def _one_line(text: Any) -> str:
    return " ".join(as_text(text).split())[:MAX_TEXT]


# -- one node as the matchers see it ------------------------------------------------------------

_KEYS = {"event": ("kind", "kind"), "finding": ("check_name", "check")}  # column, placeholder
# a finding's evidence -> placeholder: what a kernel-log finding says ({kind}, {bus}, ...)
# and what a network finding or event says of its port: {hca}, {port}, {gpus} (the GPUs behind
# the HCA, "2,3"), {counters} (the error counters that failed, "symbol_error")
_NETWORK = (("hca", "hca"), ("port", "port"), ("gpus", "gpus"), ("failing", "counters"))
_EVIDENCE = (
    ("kind", "kind"), ("level", "level"), ("pci_bus_id", "bus"), ("code", "code"), *_NETWORK,
)  # fmt: skip
_EVENT_EVIDENCE = (("rank", "rank"), ("cause", "cause"), ("check", "check"), *_NETWORK)


def _placeholder(value: Any) -> str | None:
    """An evidence value as a placeholder's text: a list joined with commas; None (unknown)
    for None and an empty list."""
    if isinstance(value, list | tuple):
        return ",".join(as_text(v) for v in value) or None
    return None if value is None else as_text(value)


KERNEL_SLACK_S = 5.0
"""A kernel line stamped this long before the job started is the node's past, not the job's
(the bundle's kernel log is the log's tail: a previous job's Xid would be blamed). The
job's own faults are judged from the kernel reader's events and the checks' findings too,
which this does not touch; the prolog's view of earlier ones is in its findings."""


def _since(lines: list[str], start_ts: float | None) -> list[str]:
    """The kernel-log lines not stamped before ``start_ts`` - :data:`KERNEL_SLACK_S` (lines
    without a wall-clock time are kept: nothing says they are old)."""
    if start_ts is None:
        return lines
    from slurmhealth.kernel_log.parse import split_line

    cut = start_ts - KERNEL_SLACK_S
    out = []
    for line in lines:
        wall = split_line(line, now=start_ts).wall
        if wall is None or wall >= cut:
            out.append(line)
    return out


class Scope:
    """One node's facts (and the job's): rows indexed once, made hits when a rule matches."""

    def __init__(self, facts: Facts, node: NodeFacts) -> None:
        self.job: Job = facts.job
        self.n_nodes = len(facts.job.node_names or ()) or len(facts.nodes)
        self.node, self.name = node, as_text(node.node)
        self.rows: dict[str, dict[str, list[Mapping[str, Any]]]] = {}
        self.xids: dict[int, list[tuple[str, Mapping[str, Any]]]] = {}
        for label, rows in (("event", node.events), ("finding", node.findings)):
            table = self.rows[label] = {}
            for row in rows or ():
                # a fault logged before a rebuilt kernel-log position is not the job's
                if isinstance(row, Mapping) and not _evidence(row).get("predates_position"):
                    table.setdefault(as_text(row.get(_KEYS[label][0])), []).append(row)
            for row in table.get("xid", ()):
                if (code := _xid_of(row)) is not None:
                    self.xids.setdefault(code, []).append((label, row))
        self._hits: dict[tuple[str, int], Hit] = {}
        self._lines: dict[str, list[str]] = {}
        self._nccl: list[NcclFacts | None] = []

    def hit(self, label: str, row: Mapping[str, Any]) -> Hit:
        key = (label, id(row))
        if key not in self._hits:
            column, name = _KEYS[label]
            what, xid, rid = as_text(row.get(column)), _xid_of(row), row.get("id")
            ev = _evidence(row)
            line = _one_line(ev.get("line"))  # the kernel line an Xid/kernel_log finding cites
            values = ((name, what),) + ((("xid", str(xid)),) if xid is not None else ())
            pairs = _EVIDENCE if label == "finding" else _EVENT_EVIDENCE
            values += tuple((p, t) for k, p in pairs if (t := _placeholder(ev.get(k))) is not None)
            self._hits[key] = Hit(
                label,
                f"{what}: {as_text(row.get('message'))}"[:MAX_TEXT]
                + (f"; kernel: {line}" if line else ""),
                self.name,
                _int(row.get("gpu")),
                _float(row.get("ts")),
                None if rid is None else f"{label}s/{as_text(rid)}",
                values,
                level_of(row.get("severity")) or level_of(row.get("severity_value")),
            )
        return self._hits[key]

    def lines(self, source: str) -> list[str]:
        if source not in self._lines:
            logs = self.node.logs if isinstance(self.node.logs, Mapping) else {}
            kept = [x for x in as_text(logs.get(source)).splitlines() if x.strip()]
            if source == "kernel":
                kept = _since(kept, self.job.start_ts)
            self._lines[source] = kept
        return self._lines[source]

    def nccl(self) -> NcclFacts | None:
        """The NCCL reader's facts: the summary's (read from the whole files), else read
        from the log tail; None without NCCL lines."""
        if not self._nccl:
            known = self.node.nccl if isinstance(self.node.nccl, Mapping) else {}
            lines = self.lines("nccl")
            self._nccl.append(NcclFacts.from_dict(dict(known)) if known else
                              read_facts(lines) if lines else None)  # fmt: skip
        return self._nccl[0]


# -- matchers: (options, scope) -> hits or None -------------------------------------------------


def _severe(o: Mapping[str, Any], hits: list[Hit]) -> list[Hit] | None:
    return [h for h in hits if h.severity >= o.get("min_severity", 0)] or None


def _rows(label: str, key: str) -> Fn:
    def run(o: Mapping[str, Any], s: Scope) -> list[Hit] | None:
        return _severe(o, [s.hit(label, r) for n in o[key] for r in s.rows[label].get(n, ())])

    return run


def _finding(o: Mapping[str, Any], s: Scope) -> list[Hit] | None:
    rows = [r for n in o["check"] for r in s.rows["finding"].get(n, ())]
    for key in ("kind", "level"):  # what a kernel-log finding's evidence says
        if key in o:
            rows = [r for r in rows if as_text(_evidence(r).get(key)) in o[key]]
    return _severe(o, [s.hit("finding", r) for r in rows])


def _xid(o: Mapping[str, Any], s: Scope) -> list[Hit] | None:
    return _severe(o, [s.hit(label, r) for c in o["code"] for label, r in s.xids.get(c, ())])


def _ok(o: Mapping[str, Any], v: float) -> bool:
    return all(op(v, o[k]) for k, op in COMPARE.items() if k in o)


def _gpu_value(g: GpuStats, name: str) -> float | None:
    v = getattr(g, name, None)
    if name != "throttle_seconds":
        return _float(v)
    return math.fsum(x for x in map(_float, v.values()) if x) if isinstance(v, Mapping) else None


def _gpu_stat(o: Mapping[str, Any], s: Scope) -> list[Hit] | None:
    name, agg = o["field"], o.get("agg")
    values: dict[int, float] = {}
    for g in s.node.gpus or ():
        idx, v = _int(getattr(g, "gpu", None)), _gpu_value(g, name)
        if idx is not None and v is not None:
            values[idx] = v
    tag = (("field", name),)
    if agg is not None:
        if not values or not _ok(o, v := float(AGG[agg](list(values.values())))):
            return None
        text = f"{name} {agg} over {len(values)} GPU(s): {v:.4g}"
        return [Hit("sample", text, s.name, values=tag)]
    texts = {idx: f"GPU {idx} {name} {v:.4g}" for idx, v in values.items()}
    ratio, peers = _peer_rule(o)
    if ratio is not None:  # the straggler rule of the sidecar and the report
        slow = stragglers(values, ratio, peers)
        texts = {x.gpu: f"{texts[x.gpu]} < {ratio:g} x the peers' median {x.peers_median:.4g}"
                 for x in slow}  # fmt: skip
    hits = [Hit("sample", t, s.name, i, values=tag) for i, t in texts.items() if _ok(o, values[i])]
    return hits or None


def _peer_rule(o: Mapping[str, Any]) -> tuple[float | None, float]:
    """(ratio, the peers' floor) of a peer comparison: ``straggler = true`` is the straggler
    rule's own (:data:`~slurmhealth.checks.straggler.RATIO`, peers busy); explicit keys win."""
    rule = "straggler" in o
    ratio = o.get("below_peer_ratio", RATIO if rule else None)
    return ratio, o.get("peers_at_least", PEERS_BUSY_PCT if rule else -math.inf)


def _task(o: Mapping[str, Any], s: Scope) -> list[Hit] | None:
    t, name = s.node.task, o["field"]
    if not isinstance(t, TaskFacts):
        return None
    if name == "throughput_ratio":
        first, last = _float(t.samples_per_second_first), _float(t.samples_per_second_last)
        v = last / first if first and last is not None else None
    else:
        v = _float(getattr(t, name, None))
    if v is None or not _ok(o, v):
        return None
    return [Hit("sample", f"task {name} {v:.4g}", s.name, values=(("field", name),))]


def _job(o: Mapping[str, Any], s: Scope) -> list[Hit] | None:
    j = s.job
    state, (code, sig) = as_text(j.state).strip().lower(), _exit(j.exit_code)
    if "state" in o and state not in {x.lower() for x in o["state"]}:
        return None
    nonzero = o.get("exit_nonzero")
    if nonzero is not None and (code is None or bool(code or sig) != nonzero):
        return None
    if "signal" in o and sig not in o["signal"]:
        return None
    if "nodes_at_most" in o and not 0 < s.n_nodes <= o["nodes_at_most"]:
        return None
    text = f"job {as_text(j.job_id)}: state {state or '?'}, exit {as_text(j.exit_code) or '?'}"
    return [Hit("job", text, ts=_float(j.end_ts))]


def _log(o: Mapping[str, Any], s: Scope) -> list[Hit] | None:
    source, pattern = o["source"], o.get("pattern")
    lines, ref, tag = s.lines(source), f"logs/{source}", (("source", source),)
    if pattern is None:
        tail = "\n".join(x[:MAX_TEXT] for x in lines[-LOG_TAIL_LINES:])
        return [Hit("log", tail, s.name, ref=ref, values=tag)] if lines else None
    hits = []
    for line in lines:
        if m := pattern.search(line):
            groups = tuple((k, v) for k, v in m.groupdict().items() if v is not None)
            hits.append(Hit("log", line.strip()[:MAX_TEXT], s.name, ref=ref, values=tag + groups))
    return hits or None


def _nccl(o: Mapping[str, Any], s: Scope) -> list[Hit] | None:
    f = s.nccl()
    if f is None or ("inter_node_transport" in o and f.inter_node_transport not in o[
            "inter_node_transport"]):  # fmt: skip
        return None
    for key in ("intra_node_left_nvlink", "user_choice", "intra_choice"):
        if key in o and bool(getattr(f, key)) != o[key]:
            return None
    pairs = (("transport", f.inter_node_transport), ("choice", f.user_choice or f.intra_choice),
             ("version", f.version), ("hosts", str(len(f.hosts)) if f.hosts else None))  # fmt: skip
    tag = tuple((k, v) for k, v in pairs if v)
    texts = f.evidence or (f"NCCL: inter-node {f.inter_node_transport or 'unknown'}",)
    return [Hit("log", t[:MAX_TEXT], s.name, ref="logs/nccl", values=tag) for t in texts]


MATCHERS: Mapping[str, Fn] = {
    "event": _rows("event", "kind"),
    "finding": _finding,
    "xid": _xid,
    "gpu_stat": _gpu_stat,
    "task": _task,
    "job": _job,
    "log": _log,
    "nccl": _nccl,
}
