"""Fuzzing the benchmark-output parsers: 2,000 mutated outputs of each kind (nccl-tests,
gpu-burn, fio JSON, nvbandwidth, dcgmi diag text and JSON, perftest), 12,000 in all,
built from the real-looking outputs in tests/fixtures/baseline: cut short, lines dropped,
repeated or swapped, columns swapped, numbers made huge, negative, nan, inf or non-ASCII
digits, unicode inserted, JSON values replaced. ``parse`` documents one error type,
:class:`BaselineParseError` (with its subclass :class:`BenchmarkFailed`), in one line; a
result always holds finite measurements."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path
from typing import Any

import pytest

from slurmhealth.baseline.model import KINDS
from slurmhealth.baseline.parsers import BaselineParseError, BenchmarkFailed, parse

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "baseline"
PER_KIND = 2_000  # at least 10,000 in all: 12,000 with the six kinds
N = PER_KIND * len(KINDS)
ODD = ["nan", "NaN", "inf", "-inf", "1e400", "-1e400", "1e-400", "9" * 400, "-0", "-1", "0",
       "0.0", "N/A", "٣٣", "１２", "1e", "1.2.3", "0x10", "18446744073709551616", ""]  # fmt: skip
JUNK = ["é", "\x00", "\ufffd", "\u2028", "\t", "  ", "|", "#", "[", "{", "}", ":", ",", "\r"]
NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


def _fixtures(kind: str) -> list[str]:
    prefix = {"gpuburn": "gpuburn", "nccl": "nccl", "fio": "fio", "nvbandwidth": "nvband"}
    names = sorted(FIXTURES.glob(prefix.get(kind, kind) + "*"))
    assert names, kind
    return [p.read_text() for p in names]


def _mutate_line(line: str, rng: random.Random) -> str:
    roll = rng.random()
    numbers = list(NUMBER.finditer(line))
    if roll < 0.5 and numbers:  # one number made odd
        m = rng.choice(numbers)
        return line[: m.start()] + rng.choice(ODD) + line[m.end() :]
    tokens = re.split(r"(\s+)", line)
    words = [i for i, t in enumerate(tokens) if t and not t.isspace()]
    if roll < 0.75 and len(words) >= 2:  # two columns swapped
        i, j = rng.sample(words, 2)
        tokens[i], tokens[j] = tokens[j], tokens[i]
        return "".join(tokens)
    at = rng.randrange(len(line) + 1)
    return line[:at] + rng.choice(JUNK + ODD) + line[at + rng.randint(0, 3) :]


def mutate_text(text: str, rng: random.Random) -> str:
    lines = text.splitlines()
    if rng.random() < 0.3:  # a window of the output (a log cut at both ends)
        a = rng.randrange(len(lines))
        lines = lines[a : a + rng.randint(1, len(lines))]
    for _ in range(rng.choice([1, 1, 2, 3, 6])):
        if not lines:
            break
        i = rng.randrange(len(lines))
        op = rng.random()
        if op < 0.55:
            lines[i] = _mutate_line(lines[i], rng)
        elif op < 0.7:
            del lines[i]
        elif op < 0.85:
            lines.insert(i, lines[rng.randrange(len(lines))])
        else:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
    out = "\n".join(lines)
    if rng.random() < 0.1:
        out = out[: rng.randrange(len(out) + 1)]  # cut short mid-line
    return out


def _odd_json(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if roll < 0.35:
        return rng.choice([math.nan, math.inf, -math.inf, 10**400, -(2**63), 0, -1, 1e308, 0.5])
    if roll < 0.6:
        return rng.choice(ODD + JUNK + [None, True, False])
    if roll < 0.8 and depth < 2:
        return [_odd_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if depth < 2:
        return {rng.choice(["jobs", "read", "bw", "x"]): _odd_json(rng, depth + 1)}
    return "x"


def _pick(doc: Any, rng: random.Random) -> Any:
    """A table or array somewhere in ``doc``: a random walk down from the top."""
    while True:
        children = [c for c in (doc.values() if isinstance(doc, dict) else doc) if c and
                    isinstance(c, dict | list)]  # fmt: skip
        if not children or rng.random() < 0.25:
            return doc
        doc = rng.choice(children)


def mutate_json(text: str, rng: random.Random) -> str:
    """Replace, delete or add values anywhere in the first JSON object of ``text``."""
    start = text.index("{")
    doc = json.loads(text[start:])
    for _ in range(rng.randint(1, 4)):
        target = _pick(doc, rng)
        if isinstance(target, list):
            if target:
                target[rng.randrange(len(target))] = _odd_json(rng)
        elif target:
            key = rng.choice(list(target))
            if rng.random() < 0.3:
                del target[key]
            else:
                target[key] = _odd_json(rng)
    return text[:start] + json.dumps(doc)


def check(kind: str, text: str) -> str:
    try:
        result = parse(kind, text)
    except BenchmarkFailed as exc:
        assert "\n" not in str(exc)
        return "failed"
    except BaselineParseError as exc:
        assert "\n" not in str(exc)
        return "unreadable"
    assert result.kind == kind and result.measurements
    for m in result.measurements:
        assert m.metric and math.isfinite(m.value), m
    return "parsed"


@pytest.mark.parametrize("kind", KINDS)
def test_parser_fuzz_two_thousand_outputs_of_each_kind(kind: str) -> None:
    rng = random.Random(f"baseline-{kind}")
    bases = _fixtures(kind)
    outcomes = {"parsed": 0, "failed": 0, "unreadable": 0}
    for _ in range(PER_KIND):
        base = rng.choice(bases)
        if "\n{" in "\n" + base and rng.random() < 0.6:  # JSON output: mutate its values
            text = mutate_json(base, rng)
        else:
            text = mutate_text(base, rng)
        outcomes[check(kind, text)] += 1
    assert outcomes["parsed"] > PER_KIND // 10, outcomes  # mutants that still parse
    assert outcomes["failed"] + outcomes["unreadable"] > PER_KIND // 50, outcomes
