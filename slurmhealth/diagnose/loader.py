"""Reading ``rules.toml``: each rule's options checked, its matchers compiled.

A malformed rules file raises :class:`ConfigError` naming the rule and key, e.g.
``rule[3].when.any[1].xid`` (rules counted from 0). The matchers themselves are in
:mod:`slurmhealth.diagnose.rules`.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from functools import lru_cache
from importlib import resources
from os import PathLike
from pathlib import Path
from typing import Any

from slurmhealth.diagnose.facts import GpuStats, TaskFacts
from slurmhealth.diagnose.rules import (
    AGG,
    COMPARE,
    FAULT_CLASSES,
    MATCHERS,
    Fn,
    Hit,
    Matcher,
    Rule,
    Scope,
    as_text,
    level_of,
)
from slurmhealth.errors import ConfigError
from slurmhealth.model import Severity

_CHOICES: Mapping[str, frozenset[str]] = {
    "gpu_field": frozenset(f.name for f in fields(GpuStats)) - {"gpu", "uuid", "series"},
    "task_field": frozenset(f.name for f in fields(TaskFacts)) | {"throughput_ratio"},
    "agg": frozenset(AGG),
    "fault": FAULT_CLASSES,
}
_CMP = {k: "num" for k in COMPARE}
# fmt: off
# Options of each matcher and of a rule: name -> kind ("!": required); see _convert.
_SCHEMA: Mapping[str, Mapping[str, str]] = {
    "event": {"kind!": "names", "min_severity": "sev"},
    "finding": {"check!": "names", "kind": "names", "level": "names", "min_severity": "sev"},
    "xid": {"code!": "ints", "min_severity": "sev"},
    "gpu_stat": {"field!": "gpu_field", **_CMP, "below_peer_ratio": "num",
                 "peers_at_least": "num", "straggler": "true", "agg": "agg"},
    "task": {"field!": "task_field", **_CMP},
    "job": {"state": "names", "exit_nonzero": "bool", "signal": "ints", "nodes_at_most": "num"},
    "log": {"source!": "text", "pattern": "regex"},
    "nccl": {"inter_node_transport": "names", "intra_node_left_nvlink": "bool",
             "user_choice": "bool", "intra_choice": "bool"},
    "rule": {"name!": "name", "title!": "text", "severity!": "sev", "root_cause!": "text",
             "verify!": "text", "fault_class!": "fault", "user_action!": "text",
             "admin_action": "text", "action": "text", "confidence!": "ratio", "when!": "matcher",
             "cite": "matchers", "suppressed_by": "sev", "escalate": "bool", "verdict": "text"},
}
_NEEDS_ONE = {"gpu_stat": (*COMPARE, "below_peer_ratio", "straggler"), "task": tuple(COMPARE),
              "job": tuple(_SCHEMA["job"]), "nccl": tuple(_SCHEMA["nccl"])}
# fmt: on
_KNOWN = ", ".join([*MATCHERS, "all", "any", "not"])
_PEER_KEYS = ("below_peer_ratio", "peers_at_least", "straggler")


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


def _bind(fn: Fn, o: Mapping[str, Any]) -> Matcher:
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
        elif key in MATCHERS:
            o = _options(arg, here, src, _SCHEMA[key])
            if key in _NEEDS_ONE and not any(k in o for k in _NEEDS_ONE[key]):
                raise ConfigError(src, here, f"needs one of: {', '.join(_NEEDS_ONE[key])}")
            if "agg" in o and any(k in o for k in _PEER_KEYS):
                raise ConfigError(src, f"{here}.agg", "does not go with the peer keys")
            parts.append(_bind(MATCHERS[key], o))
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
        if ("admin_action" in o) == ("action" in o):  # `action`: the older name
            raise ConfigError(src, f"rule[{i}].admin_action", "needs one of admin_action, action")
        o["admin_action"] = o.pop("admin_action", None) or o.pop("action")
        sup = o.pop("suppressed_by", None)
        o["severity"] = Severity(o["severity"]).label
        rules.append(Rule(**o, suppressed_by=None if sup is None else Severity(sup).label))
    return rules


@lru_cache(maxsize=1)
def default_rules() -> tuple[Rule, ...]:
    """The packaged rules, read once."""
    return tuple(load_rules())
