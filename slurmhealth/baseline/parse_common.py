"""Small helpers shared by the benchmark-output parsers (no parsing policy lives here):
numbers and JSON as the tools print them, metric names, and the result every parser returns."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from slurmhealth.baseline.model import BaselineParseError, Measurement, ParseResult

# Numbers as the tools print them; bounded so int()/float() never see absurd inputs: at most
# 20 digits and a two-digit exponent (printf's %e), so every match is a finite float (< 1e120)
NUM = r"\d{1,20}(?:\.\d{1,20})?(?:[eE][+-]?\d{1,2})?"

# What a launcher writes before each line of a tool's output: Open MPI ``--tag-output``
# (``[1,0]<stdout>:``) and ``srun --label`` (``0: ``); strip it before reading the line.
LAUNCHER_PREFIX = re.compile(r"^(?:\[\d{1,9},\d{1,9}\]<std(?:out|err)>:|\s{0,8}\d{1,9}: )")


def fail(kind: str, message: str) -> BaselineParseError:
    """One-line parse error naming the kind and what was missing."""
    first = " ".join(message.split())
    return BaselineParseError(f"{kind}: {first}")


def slug(name: str) -> str:
    """``"Memory Bandwidth"`` -> ``"memory_bandwidth"``: stable metric-name fragments."""
    out = re.sub(r"[^a-z0-9]+", "_", name.strip().lower()).strip("_")
    return out or "unnamed"


def load_json_object(text: str) -> dict[str, Any] | None:
    """The first JSON object in ``text`` that starts a line, skipping warning preambles.

    Returns None when no line starts a decodable object."""
    decoder = json.JSONDecoder()
    pos = 0
    for line in text.splitlines(keepends=True):
        stripped = line.lstrip()
        if stripped.startswith("{"):
            start = pos + (len(line) - len(stripped))
            try:
                obj, _end = decoder.raw_decode(text, start)
            except (ValueError, RecursionError):
                pos += len(line)
                continue
            if isinstance(obj, dict):
                return obj
        pos += len(line)
    return None


def as_float(value: Any) -> float | None:
    """A finite JSON number (or numeric string) as float; None for anything else, bools,
    NaN and infinities included."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:  # a JSON integer beyond float range
            return None
        return number if math.isfinite(number) else None
    if isinstance(value, str) and re.fullmatch(r"-?" + NUM, value.strip()):
        return float(value.strip())
    return None


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def device_model(models: Sequence[str]) -> str | list[str] | None:
    """``meta["device_model"]``: the one GPU model the output names, all the (distinct)
    models it names when several, None when it names none."""
    return models[0] if len(models) == 1 else (list(models) or None)


def result(
    kind: str,
    measurements: Iterable[Measurement],
    errors: Sequence[str],
    problems: Sequence[str],
    meta: Mapping[str, Any],
    models: Sequence[str] = (),
) -> ParseResult:
    """What a parser returns: ``passed`` when the tool reported no error; ``gpu_model`` when
    the output names exactly one model (``models``: the distinct names it prints)."""
    return ParseResult(
        kind=kind,
        measurements=tuple(measurements),
        passed=not errors,
        errors=tuple(errors),
        problems=tuple(problems),
        meta=meta,
        gpu_model=models[0] if len(models) == 1 else None,
    )
