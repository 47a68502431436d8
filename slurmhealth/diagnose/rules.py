"""The rule vocabulary: matchers over a job's :class:`Facts`, and reading ``rules.toml``.

A matcher returns the hits it found (what to cite, placeholder values) or ``None`` when it
does not match. Unknown values never match. A malformed rules file raises ConfigError
naming the rule and key. :mod:`slurmhealth.diagnose.engine` groups hits into diagnoses.
"""

from __future__ import annotations

import math
import operator
import re
import statistics
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from functools import lru_cache
from importlib import resources
from os import PathLike
from pathlib import Path
from typing import Any, NamedTuple

from slurmhealth.checks.straggler import PEERS_BUSY_PCT, RATIO, stragglers
from slurmhealth.diagnose.facts import (
    Facts,
    GpuStats,
    JobFacts,
    NodeFacts,
    TaskFacts,
)
from slurmhealth.errors import ConfigError
from slurmhealth.model import Severity

MAX_CITATIONS = 25  # per diagnosis: the earliest matches first, then the cited tails
LOG_TAIL_LINES = 5  # lines cited from a log matched without a pattern
MAX_TEXT = 300  # characters of a cited message or log line
DRAINED_STATES = frozenset({"drained", "already", "held"})  # drains rows: node left drained
# fmt: off
_COMPARE: Mapping[str, Callable[[float, float], bool]] = {
    "above": operator.gt, "below": operator.lt, "at_least": operator.ge, "at_most": operator.le}
_AGG: Mapping[str, Callable[[list[float]], float]] = {
    "mean": statistics.fmean, "median": statistics.median, "min": min, "max": max}
# fmt: on
_CHOICES: Mapping[str, frozenset[str]] = {
    "gpu_field": frozenset(f.name for f in fields(GpuStats)) - {"gpu", "uuid", "series"},
    "task_field": frozenset(f.name for f in fields(TaskFacts)) | {"throughput_ratio"},
    "agg": frozenset(_AGG),
}
_CMP = {k: "num" for k in _COMPARE}
# fmt: off
# Options of each matcher and of a rule: name -> kind ("!": required); see _convert.
_SCHEMA: Mapping[str, Mapping[str, str]] = {
    "event": {"kind!": "names", "min_severity": "sev"},
    "finding": {"check!": "names", "min_severity": "sev"},
    "xid": {"code!": "ints", "min_severity": "sev"},
    "gpu_stat": {"field!": "gpu_field", **_CMP, "below_peer_ratio": "num",
                 "peers_at_least": "num", "straggler": "true", "agg": "agg"},
    "task": {"field!": "task_field", **_CMP},
    "job": {"state": "names", "exit_nonzero": "bool", "signal": "ints", "nodes_at_most": "num"},
    "log": {"source!": "text", "pattern": "regex"},
    "rule": {"name!": "name", "title!": "text", "severity!": "sev", "root_cause!": "text",
             "verify!": "text", "action!": "text", "confidence!": "ratio", "when!": "matcher",
             "cite": "matchers", "suppressed_by": "sev", "escalate": "bool", "verdict": "text"},
}
_NEEDS_ONE = {"gpu_stat": (*_COMPARE, "below_peer_ratio", "straggler"), "task": tuple(_COMPARE),
              "job": tuple(_SCHEMA["job"])}
# fmt: on
_PEER_KEYS = ("below_peer_ratio", "peers_at_least", "straggler")
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
_Fn = Callable[[Mapping[str, Any], "Scope"], list[Hit] | None]  # a matcher before its options


@dataclass(frozen=True)
class Rule:
    """One ``[[rule]]`` of the rules file, ``when`` and ``cite`` compiled to matchers."""

    name: str
    title: str
    severity: str
    root_cause: str
    verify: str
    action: str
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


def _xid_of(row: Mapping[str, Any]) -> int | None:
    ev = row.get("evidence")
    return _int(ev.get("xid")) if type(ev) is dict or isinstance(ev, Mapping) else None


# -- one node as the matchers see it ------------------------------------------------------------

_KEYS = {"event": ("kind", "kind"), "finding": ("check_name", "check")}  # column, placeholder


class Scope:
    """One node's facts (and the job's): rows indexed once, made hits when a rule matches."""

    def __init__(self, facts: Facts, node: NodeFacts) -> None:
        self.job: JobFacts = facts.job
        self.n_nodes = len(facts.job.nodes or ()) or len(facts.nodes)
        self.node, self.name = node, as_text(node.node)
        self.rows: dict[str, dict[str, list[Mapping[str, Any]]]] = {}
        self.xids: dict[int, list[tuple[str, Mapping[str, Any]]]] = {}
        for label, rows in (("event", node.events), ("finding", node.findings)):
            table = self.rows[label] = {}
            for row in rows or ():
                if type(row) is dict or isinstance(row, Mapping):
                    table.setdefault(as_text(row.get(_KEYS[label][0])), []).append(row)
            for row in table.get("xid", ()):
                if (code := _xid_of(row)) is not None:
                    self.xids.setdefault(code, []).append((label, row))
        self._hits: dict[tuple[str, int], Hit] = {}
        self._lines: dict[str, list[str]] = {}

    def hit(self, label: str, row: Mapping[str, Any]) -> Hit:
        key = (label, id(row))
        if key not in self._hits:
            column, name = _KEYS[label]
            what, xid, rid = as_text(row.get(column)), _xid_of(row), row.get("id")
            self._hits[key] = Hit(
                label,
                f"{what}: {as_text(row.get('message'))}"[:MAX_TEXT],
                self.name,
                _int(row.get("gpu")),
                _float(row.get("ts")),
                None if rid is None else f"{label}s/{as_text(rid)}",
                ((name, what),) + ((("xid", str(xid)),) if xid is not None else ()),
                level_of(row.get("severity")) or level_of(row.get("severity_value")),
            )
        return self._hits[key]

    def lines(self, source: str) -> list[str]:
        if source not in self._lines:
            logs = self.node.logs if isinstance(self.node.logs, Mapping) else {}
            self._lines[source] = [x for x in as_text(logs.get(source)).splitlines() if x.strip()]
        return self._lines[source]


# -- matchers: (options, scope) -> hits or None -------------------------------------------------


def _severe(o: Mapping[str, Any], hits: list[Hit]) -> list[Hit] | None:
    return [h for h in hits if h.severity >= o.get("min_severity", 0)] or None


def _rows(label: str, key: str) -> _Fn:
    def run(o: Mapping[str, Any], s: Scope) -> list[Hit] | None:
        return _severe(o, [s.hit(label, r) for n in o[key] for r in s.rows[label].get(n, ())])

    return run


def _xid(o: Mapping[str, Any], s: Scope) -> list[Hit] | None:
    return _severe(o, [s.hit(label, r) for c in o["code"] for label, r in s.xids.get(c, ())])


def _ok(o: Mapping[str, Any], v: float) -> bool:
    return all(op(v, o[k]) for k, op in _COMPARE.items() if k in o)


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
        if not values or not _ok(o, v := float(_AGG[agg](list(values.values())))):
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


_MATCHERS: Mapping[str, _Fn] = {
    "event": _rows("event", "kind"),
    "finding": _rows("finding", "check"),
    "xid": _xid,
    "gpu_stat": _gpu_stat,
    "task": _task,
    "job": _job,
    "log": _log,
}
_KNOWN = ", ".join([*_MATCHERS, "all", "any", "not"])


def _join(parts: Sequence[Matcher], every: bool) -> Matcher:
    """``all`` (every) or ``any`` of ``parts``: the hits of every part that matched."""

    def run(s: Scope) -> list[Hit] | None:
        out: list[Hit] = []
        matched = False
        for part in parts:
            if (hits := part(s)) is not None:
                matched = True
                out += hits
            elif every:
                return None
        return out if matched else None

    return run


def _negate(inner: Matcher) -> Matcher:
    return lambda s: [] if inner(s) is None else None


def _bind(fn: _Fn, o: Mapping[str, Any]) -> Matcher:
    return lambda s: fn(o, s)


def matcher(spec: Any, at: str, src: str) -> Matcher:
    """Compile one matcher table; errors name the key, e.g. ``rule[3].when.any[1].xid``."""
    if not isinstance(spec, Mapping) or not spec:
        raise ConfigError(src, at, f"must be a table with one of: {_KNOWN}")
    parts: list[Matcher] = []
    for key, arg in spec.items():
        here = f"{at}.{key}"
        if key in ("all", "any"):
            parts.append(_join(_convert("matchers", arg, here, src), key == "all"))
        elif key == "not":
            parts.append(_negate(matcher(arg, here, src)))
        elif key in _MATCHERS:
            o = _options(arg, here, src, _SCHEMA[key])
            if key in _NEEDS_ONE and not any(k in o for k in _NEEDS_ONE[key]):
                raise ConfigError(src, here, f"needs one of: {', '.join(_NEEDS_ONE[key])}")
            if "agg" in o and any(k in o for k in _PEER_KEYS):
                raise ConfigError(src, f"{here}.agg", "does not go with the peer keys")
            parts.append(_bind(_MATCHERS[key], o))
        else:
            raise ConfigError(src, here, f"unknown matcher; known: {_KNOWN}")
    return parts[0] if len(parts) == 1 else _join(parts, every=True)


# -- the rules file -----------------------------------------------------------------------------


def _list_of(t: type) -> Callable[[Any], tuple[Any, ...] | None]:
    return lambda v: (
        tuple(v) if isinstance(v, list) and v and all(type(x) is t for x in v) else None
    )


def _one_of(choices: frozenset[str]) -> Callable[[Any], str | None]:
    return lambda v: v if v in choices else None


def _regex(v: Any) -> re.Pattern[str] | None:
    try:
        return re.compile(v, re.IGNORECASE) if isinstance(v, str) else None
    except re.error:
        return None


def _number(low: float = -math.inf, high: float = math.inf) -> Callable[[Any], float | None]:
    return lambda v: float(v) if type(v) in (int, float) and low <= v <= high else None


# Option kinds: a function giving the value in usable form (None: invalid), what is valid.
_KINDS: Mapping[str, tuple[Callable[[Any], Any], str]] = {
    "names": (_list_of(str), "a non-empty list of strings"),
    "ints": (_list_of(int), "a non-empty list of integers"),
    "num": (_number(), "a number"),
    "ratio": (_number(0, 1), "a number from 0 to 1"),
    "bool": (lambda v: v if isinstance(v, bool) else None, "true or false"),
    "true": (lambda v: v if v is True else None, "true (or left out)"),
    "text": (lambda v: v if isinstance(v, str) and v.strip() else None, "a non-empty string"),
    "name": (lambda v: v if re.fullmatch(r"[a-z]\w*", as_text(v)) else None, "a snake_case name"),
    "sev": (lambda v: level_of(v) or None, "one of info, warn, fail, critical"),
    "regex": (_regex, "a valid regular expression"),
    **{k: (_one_of(c), f"one of: {', '.join(sorted(c))}") for k, c in _CHOICES.items()},
}


def _convert(kind: str, v: Any, at: str, src: str) -> Any:
    """Check one option value of ``kind`` (see ``_SCHEMA``) and return it in usable form."""
    if kind == "matcher":
        return matcher(v, at, src)
    if kind == "matchers":
        if not isinstance(v, list) or not v:
            raise ConfigError(src, at, "must be a non-empty list of matchers")
        return tuple(matcher(m, f"{at}[{i}]", src) for i, m in enumerate(v))
    convert, valid = _KINDS[kind]
    if (out := convert(v)) is None:
        raise ConfigError(src, at, f"must be {valid}")
    return out


def _options(arg: Any, at: str, src: str, schema: Mapping[str, str]) -> dict[str, Any]:
    if not isinstance(arg, Mapping):
        raise ConfigError(src, at, "must be a table")
    names = {k.rstrip("!"): k for k in schema}
    for key in arg:
        if key not in names:
            raise ConfigError(src, f"{at}.{key}", f"unknown key; known: {', '.join(names)}")
    out = {}
    for key, spec in names.items():
        if key in arg:
            out[key] = _convert(schema[spec], arg[key], f"{at}.{key}", src)
        elif spec.endswith("!"):
            raise ConfigError(src, f"{at}.{key}", "missing")
    return out


def load_rules(path: str | PathLike[str] | None = None) -> list[Rule]:
    """Read and check a rules file (default: the packaged ``rules.toml``). A bad file raises
    :class:`ConfigError` naming it and the key, e.g. ``rule[3].when.any[1].foo`` (from 0)."""
    src = "slurmhealth/diagnose/rules.toml" if path is None else str(path)
    try:
        if path is None:
            text = resources.files("slurmhealth.diagnose").joinpath("rules.toml").read_text()
        else:
            text = Path(path).read_text(encoding="utf-8")
        data = tomllib.loads(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(src, None, f"cannot read the rules file: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(src, None, f"not valid TOML: {exc}") from None
    if set(data) != {"rule"} or not isinstance(data["rule"], list):
        raise ConfigError(src, None, "a rules file holds [[rule]] tables and nothing else")
    rules: list[Rule] = []
    for i, spec in enumerate(data["rule"]):
        o = _options(spec, f"rule[{i}]", src, _SCHEMA["rule"])
        if any(r.name == o["name"] for r in rules):
            raise ConfigError(src, f"rule[{i}].name", f"duplicate rule name {o['name']!r}")
        sup = o.pop("suppressed_by", None)
        o["severity"] = Severity(o["severity"]).label
        rules.append(Rule(**o, suppressed_by=None if sup is None else Severity(sup).label))
    return rules


@lru_cache(maxsize=1)
def default_rules() -> tuple[Rule, ...]:
    """The packaged rules, read once."""
    return tuple(load_rules())
