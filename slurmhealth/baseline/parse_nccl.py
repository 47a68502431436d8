"""nccl-tests output (``all_reduce_perf``, ``all_gather_perf``, ...): header, rank lines,
the size table, ``# Out of bounds values`` and ``# Avg bus bandwidth`` (GB/s)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from slurmhealth.baseline.model import Measurement, ParseResult
from slurmhealth.baseline.parse_common import NUM, fail

_TEST_NAME = re.compile(r"(?:^|[\s/])(\w{1,60}_perf)(?:_mpi)?(?=\s|$)")
_RANK = re.compile(
    r"#\s*Rank\s+(\d{1,9})\s+(?:Group\s+\d{1,9}\s+)?Pid\s+(\d{1,12})\s+on\s+(\S+)\s+device\s+"
    r"(\d{1,9})\s+\[[^\]]*\]\s+(.*?)\s*$"
)
_HEADER = re.compile(r"#\s*nThread\s+(\d{1,9})\s+nGpus\s+(\d{1,9})")
_ITERS = re.compile(r"(?<!warmup )iters:?\s+(\d{1,9})")
_OOB = re.compile(r"#\s*Out of bounds values\s*:\s*(\d{1,20})\s+(\w+)")
_AVG = re.compile(r"#\s*Avg bus bandwidth\s*:\s*(" + NUM + r")")
_WRONG = r"(\d{1,20}|N/A)"
_HALF = rf"\s+({NUM})\s+({NUM})\s+({NUM})\s+{_WRONG}"
_ROW = re.compile(
    rf"^\s*(\d{{1,20}})\s+(\d{{1,20}})\s+([A-Za-z]\w{{0,15}})(?:\s+(\w{{1,10}}))?"
    rf"(?:\s+(-?\d{{1,9}}))?{_HALF}{_HALF}\s*$"
)
_FAILURE = re.compile(r"(NCCL failure|Test failure|NCCL error|CUDA failure)", re.IGNORECASE)


@dataclass(frozen=True)
class _Half:
    time_us: float
    algbw: float
    busbw: float
    wrong: int | None  # None for N/A


@dataclass(frozen=True)
class _Row:
    size: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    out: _Half
    inp: _Half


def _half(groups: tuple[str | Any, ...]) -> _Half:
    t, a, b, w = groups
    return _Half(float(t), float(a), float(b), None if w == "N/A" else int(w))


def _test_name(lines: list[str], hint: str | None) -> str:
    if hint:
        return hint
    for line in lines:
        m = _TEST_NAME.search(line)
        if m and not line.lstrip().startswith("#"):
            return m.group(1)
    for line in lines:
        m = _TEST_NAME.search(line)
        if m:
            return m.group(1)
    return "nccl"


def parse_nccl(text: str, *, test: str | None = None) -> ParseResult:
    """Measurements ``<test>.busbw_avg`` and, for the largest size, ``<test>.busbw@<bytes>``,
    ``<test>.algbw@<bytes>`` (out-of-place) and ``<test>.busbw_inplace@<bytes>``,
    ``<test>.algbw_inplace@<bytes>``; all GB/s, detail ``time_us``."""
    lines = text.splitlines()
    name = _test_name(lines, test)
    rows: list[_Row] = []
    problems: list[str] = []
    errors: list[str] = []
    meta: dict[str, Any] = {"test": name}
    hosts: list[str] = []
    models: list[str] = []
    rank_count = 0
    avg: float | None = None
    oob: tuple[int, str] | None = None
    in_table = False
    for lineno, line in enumerate(lines, 1):
        if m := _HEADER.search(line):
            meta["nthread"], meta["ngpus_per_thread"] = int(m.group(1)), int(m.group(2))
            if it := _ITERS.search(line):
                meta["iters"] = int(it.group(1))
        elif m := _RANK.search(line):
            rank_count += 1
            if m.group(3) not in hosts:
                hosts.append(m.group(3))
            if m.group(5) and m.group(5) not in models:
                models.append(m.group(5))
        elif m := _OOB.search(line):
            oob = (int(m.group(1)), m.group(2))
        elif m := _AVG.search(line):
            avg = float(m.group(1))
        elif m := _ROW.match(line):
            in_table = True
            g = m.groups()
            rows.append(
                _Row(
                    size=int(g[0]),
                    count=int(g[1]),
                    dtype=g[2],
                    redop=g[3],
                    root=int(g[4]) if g[4] is not None else None,
                    out=_half(g[5:9]),
                    inp=_half(g[9:13]),
                )
            )
        elif _FAILURE.search(line):
            errors.append(f"line {lineno}: {line.strip()[:200]}")
        elif in_table and line.strip() and not line.lstrip().startswith("#"):
            problems.append(f"line {lineno}: unreadable table row {line.strip()[:80]!r}")
    if not rows and avg is None:
        raise fail("nccl", "no nccl-tests result rows and no '# Avg bus bandwidth' line found")

    measurements: list[Measurement] = []
    if avg is None:
        values = [r.out.busbw for r in rows] + [r.inp.busbw for r in rows]
        avg = round(sum(values) / len(values), 3)
        problems.append(f"no '# Avg bus bandwidth' line; busbw_avg computed from {len(rows)} rows")
        measurements.append(
            Measurement(f"{name}.busbw_avg", avg, "GB/s", detail={"computed": True})
        )
    else:
        measurements.append(Measurement(f"{name}.busbw_avg", avg, "GB/s"))
    if oob is None:
        problems.append("no '# Out of bounds values' line (output may be truncated)")

    passed = True
    for r in rows:
        for label, half in (("out-of-place", r.out), ("in-place", r.inp)):
            if half.wrong:
                passed = False
                errors.append(f"size {r.size} ({r.dtype}): {label} #wrong {half.wrong}")
    if oob is not None and (oob[0] != 0 or oob[1] != "OK"):
        passed = False
        errors.append(f"out of bounds values: {oob[0]} {oob[1]}")
    if errors:
        passed = False

    if rows:
        big = max(rows, key=lambda r: r.size)
        for suffix, half in (("", big.out), ("_inplace", big.inp)):
            detail = {"time_us": half.time_us, "count": big.count, "type": big.dtype}
            measurements.append(
                Measurement(f"{name}.busbw{suffix}@{big.size}", half.busbw, "GB/s", detail=detail)
            )
            measurements.append(
                Measurement(f"{name}.algbw{suffix}@{big.size}", half.algbw, "GB/s", detail=detail)
            )
        meta["sizes"] = [r.size for r in rows]
        meta["max_bytes"] = big.size
    meta["ranks"] = rank_count
    meta["gpus"] = rank_count
    meta["nodes"] = hosts
    meta["device_model"] = models[0] if len(models) == 1 else (models or None)
    return ParseResult(
        kind="nccl",
        measurements=tuple(measurements),
        passed=passed,
        errors=tuple(errors),
        problems=tuple(problems),
        meta=meta,
    )
