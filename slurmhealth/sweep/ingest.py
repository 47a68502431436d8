"""A sweep job's output as :class:`Result` values, through the baseline parsers
(``baseline.parsers``: nccl-tests, perftest) and back as ``baselines`` rows.

The job script (``data/sweep.sbatch``) heads each test's output with
``### slurmhealth-sweep test=nccl nodes=...`` (``test=ib hca=mlx5_0`` per HCA) and closes it
with ``### slurmhealth-sweep end ... rc=N``. The headline of nccl-tests is the out-of-place
busbw of the largest message size (the plateau; nccl-tests' ``Avg bus bandwidth`` averages
in the latency-bound small sizes), of perftest the average bandwidth, the slowest HCA's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from slurmhealth.baseline.model import BaselineParseError, Measurement, ParseResult
from slurmhealth.baseline.parsers import parse
from slurmhealth.sweep.model import Planned, Result

_MARK = re.compile(r"^### slurmhealth-sweep (end )?test=(\w+)(?: hca=([\w.-]{1,40}))?(.*)$")
_RC = re.compile(r"\brc=(\d{1,3})\b")
_BUSBW = re.compile(r"^(\w+)\.busbw@(\d+)$")
KIND = {"nccl": "nccl", "ib": "perftest"}


def sections(text: str) -> dict[tuple[str, str], tuple[str, int | None]]:
    """``{(test, hca): (output, exit code or None when the end marker is missing)}``."""
    out: dict[tuple[str, str], tuple[str, int | None]] = {}
    key: tuple[str, str] | None = None
    lines: list[str] = []
    for line in text.splitlines():
        m = _MARK.match(line)
        if m is None:
            if key is not None:
                lines.append(line)
            continue
        if m[1] and key == (m[2], m[3] or ""):
            rc = _RC.search(m[4])
            out[key] = ("\n".join(lines), int(rc[1]) if rc else None)
            key = None
        elif not m[1]:
            key, lines = (m[2], m[3] or ""), []
            out[key] = ("", None)
    if key is not None:
        out[key] = ("\n".join(lines), None)
    return out


def headline(test: str, result: ParseResult) -> Measurement | None:
    """The one number a unit is judged by (see the module doc)."""
    ms = result.measurements
    if test == "nccl":
        sized = [(int(m_[2]), m) for m in ms if (m_ := _BUSBW.match(m.metric))]
        if sized:
            return max(sized, key=lambda s: s[0])[1]
        return next((m for m in ms if m.metric.endswith(".busbw_avg")), None)
    return next((m for m in ms if m.metric.endswith(".bw_avg")), None)


def results_of(
    test: Planned, job_id: str, state: str, text: str, error: str, ts: float
) -> list[Result]:
    """One result per test the job ran; a test that measured nothing has ``value`` None and
    says why (the job's state, the tool's own words, the parser's)."""
    found = sections(text)
    out = []
    for name in test.tests:
        if name == "ib" and len(test.nodes) != 2:
            continue
        parts = {hca: body for (t, hca), body in found.items() if t == name}
        value, metric, hcas, why = _measure(name, parts)
        if value is None:
            why = error or why or f"job {job_id or '-'} {state}: no {name} output"
        out.append(Result(name, test.nodes, test.round, test.attempt, value, metric, job_id,
                          "" if value is not None else why[:300], hcas, ts))  # fmt: skip
    return out


def _measure(
    name: str, parts: dict[str, tuple[str, int | None]]
) -> tuple[float | None, str, dict[str, float], str]:
    values: dict[str, float] = {}
    metric, why = "", ""
    for hca, (body, rc) in sorted(parts.items()):
        try:
            result = parse(KIND[name], body)
        except BaselineParseError as exc:
            why = f"{name}{' ' + hca if hca else ''}: {exc} (exit {rc})"
            continue
        m = headline(name, result)
        if not result.passed or m is None:
            why = f"{name}: the tool reported errors: {'; '.join(result.errors)[:200]}"
            continue
        values[hca], metric = m.value, m.metric
    if not values or len(values) < len(parts):
        return None, metric, values if name == "ib" else {}, why
    return min(values.values()), metric, values if name == "ib" else {}, ""


def baseline_rows(
    results: Sequence[Result], sweep_id: str, source: str = ""
) -> list[dict[str, Any]]:
    """``baselines`` rows of the results that measured something: node ``n1`` alone, or
    ``n1,n3`` for a pair (as nccl-tests-multinode.sbatch stores a node list), label
    ``sweep:<id>``, one row per HCA for ib."""
    rows = []
    for r in results:
        if r.value is None:
            continue
        per = r.hcas.items() if r.hcas else [("", r.value)]
        where = f"{source}job {r.job_id}"
        for hca, value in per:
            rows.append({"ts": r.ts, "node": ",".join(r.nodes), "kind": KIND[r.test],
                         "metric": r.metric, "value": float(value), "unit": r.unit,
                         "gpu_model": None, "gpu": None, "label": f"sweep:{sweep_id}",
                         "source": where + (f" {hca}" if hca else "")})  # fmt: skip
    return rows
