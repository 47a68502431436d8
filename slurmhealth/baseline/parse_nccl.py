"""nccl-tests output (``all_reduce_perf``, ``all_gather_perf``, ``alltoall_perf``, ...).

Read as nccl-tests prints it (src/util.cu, src/common.cu): ``# Collective test starting: X``,
the ``# nThread`` header, ``#  Rank r Group g Pid p on host device d [bus] <GPU name>`` lines,
the result table (layouts in :mod:`parse_nccl_table`), ``# Out of bounds values : N OK``,
``# Avg bus bandwidth : X [OK|FAILED]`` and ``# Collective test concluded: X``. Several tests
concatenated in one file are read one after the other.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from slurmhealth.baseline.model import BenchmarkFailed, Measurement, ParseResult
from slurmhealth.baseline.parse_common import LAUNCHER_PREFIX, NUM, device_model, fail, result
from slurmhealth.baseline.parse_nccl_table import Row, is_row, parse_row

# the binary's name as 2.17+ prints it; an MPI build's "_mpi" dropped, as _TEST_NAME does for
# a command line, so one test keeps one name across nccl-tests versions and builds
_COLLECTIVE = re.compile(
    r"#\s*Collective test (?:starting|concluded):\s*(?:\S*[/\\])?(\w{1,60}?)(?:_mpi)?(?!\w)"
)
_TEST_NAME = re.compile(r"(?:^|[\s/\\])(\w{1,60}_perf)(?:_mpi)?(?:\.exe)?(?=\s|$)")
_RANK = re.compile(
    r"#\s*Rank\s+(\d{1,9})\s+(?:Group\s+\d{1,9}\s+)?(?:Pid\s+(\d{1,12})\s+)?on\s+(\S+)\s+device\s+"
    r"(\d{1,9})\s+\[[^\]]*\](?:\s+(.*?))?\s*$"
)
_HEADER = re.compile(r"(?:^|#)\s*nThread\s+(\d{1,9})\s+nGpus\s+(\d{1,9})")
_ITERS = re.compile(r"(?<!warmup )iters:?\s+(\d{1,9})")
_VALIDATION = re.compile(r"validation:\s*(\d{1,9})")
_OOB = re.compile(r"#?\s*Out of bounds values\s*:\s*(\d{1,20})\s+(\w+)")
_AVG = re.compile(r"#?\s*Avg bus bandwidth\s*:\s*(" + NUM + r"|nan|inf)\s*(\w+)?", re.IGNORECASE)
# printed at the very end of every run since 2.17 when NCCL kept an error string; after a
# complete, checked table it can be a stale warning, so it is only a reason, never a verdict
_LAST_ERROR = re.compile(r"^\s*#\s*error:\s*(.*)$")
_FAILURE = re.compile(
    r"(NCCL failure|Test failure|NCCL error|CUDA failure|Test timeout)",
    re.IGNORECASE,
)


@dataclass
class _Section:
    name: str | None = None
    header: bool = False
    per_iter: bool = False
    rows: list[Row] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    ranks: int = 0
    avg: tuple[float, str | None] | None = None
    oob: tuple[int, str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _new_section(sections: list[_Section], line: str) -> bool:
    cur = sections[-1]
    done = bool(cur.rows) or cur.avg is not None
    if _COLLECTIVE.search(line) and "starting" in line:
        return done or cur.header or cur.name is not None
    if _HEADER.search(line):
        return done or cur.header
    command = not line.lstrip().startswith("#") and not is_row(line)
    # a command line naming a test ends a run that has a table, or one that was named and
    # started (its header, or its failure) but died before a table: the next run's own
    started = (cur.header or bool(cur.errors)) and cur.name is not None
    return (done or started) and command and bool(_TEST_NAME.search(line))


def _read_line(sec: _Section, lineno: int, line: str) -> None:
    if m := _COLLECTIVE.search(line):
        sec.name = sec.name or m.group(1)
    elif m := _HEADER.search(line):
        sec.header = True
        sec.meta["nthread"], sec.meta["ngpus_per_thread"] = int(m.group(1)), int(m.group(2))
        if it := _ITERS.search(line):
            sec.meta["iters"] = int(it.group(1))
        if v := _VALIDATION.search(line):
            sec.meta["validation"] = int(v.group(1))
    elif m := _RANK.search(line):
        sec.ranks += 1
        if m.group(3) not in sec.hosts:
            sec.hosts.append(m.group(3))
        if m.group(5) and m.group(5) not in sec.models:
            sec.models.append(m.group(5))
    elif m := _OOB.search(line):
        sec.oob = (int(m.group(1)), m.group(2))
    elif m := _AVG.search(line):
        sec.avg = (float(m.group(1)), m.group(2))
    elif line.lstrip().startswith("#") and "i_min" in line:
        sec.per_iter = True
    elif is_row(line):
        row = parse_row(line, sec.per_iter)
        if row is None:
            sec.problems.append(f"line {lineno}: unreadable table row {line.strip()[:80]!r}")
        else:
            sec.rows.append(row)
    elif _FAILURE.search(line):
        sec.errors.append(f"line {lineno}: {line.strip()[:200]}")
    elif m := _LAST_ERROR.match(line):
        sec.problems.append(f"nccl reported: {m.group(1).strip()[:200]}")
    elif sec.name is None and not line.lstrip().startswith("#"):
        if m := _TEST_NAME.search(line):
            sec.name = m.group(1)
    elif sec.rows and line.strip() and not line.lstrip().startswith("#"):
        sec.problems.append(f"line {lineno}: unreadable table row {line.strip()[:80]!r}")


def _sections(text: str) -> list[_Section]:
    sections = [_Section()]
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = LAUNCHER_PREFIX.sub("", raw, count=1)
        if _new_section(sections, line):
            sections.append(_Section())
        _read_line(sections[-1], lineno, line)
    return [s for s in sections if s.rows or s.avg is not None or s.header or s.errors]


def _infer_name(sec: _Section) -> str | None:
    """all_reduce / reduce_scatter / reduce / broadcast from the busbw/algbw factor the
    nccl-tests docs give (doc/PERFORMANCE.md) and the redop/root columns; None if unsure."""
    n = sec.ranks
    big = max((r for r in sec.rows if r.inp.algbw > 0), key=lambda r: r.size, default=None)
    if n < 3 or big is None or big.redop is None or big.root is None:
        return None
    ratio = big.inp.busbw / big.inp.algbw
    reducing = big.redop != "none"
    candidates = {
        "all_reduce_perf": reducing and big.root < 0 and abs(ratio - 2 * (n - 1) / n) < 0.03,
        "reduce_scatter_perf": reducing and big.root < 0 and abs(ratio - (n - 1) / n) < 0.03,
        "reduce_perf": reducing and big.root >= 0,
        "broadcast_perf": not reducing and big.root >= 0 and abs(ratio - 1) < 0.03,
    }
    found = [name for name, ok in candidates.items() if ok]
    return found[0] if len(found) == 1 else None


def _name(sec: _Section, hint: str | None) -> str:
    if sec.name:
        return sec.name
    if hint:
        return hint
    inferred = _infer_name(sec)
    if inferred:
        sec.problems.append(f"test name not in the output; {inferred} inferred from the table")
        return inferred
    sec.problems.append("test name not in the output (no 'Collective test' or '*_perf' line)")
    return "nccl"


def _check(sec: _Section) -> None:
    for r in sec.rows:
        for label, half in (("out-of-place", r.out), ("in-place", r.inp)):
            if half is not None and half.wrong is not None and half.wrong >= 1:
                sec.errors.append(f"size {r.size} ({r.dtype}): {label} #wrong {half.wrong:g}")
    if sec.oob is None:
        sec.problems.append("no '# Out of bounds values' line (output may be truncated)")
    elif sec.oob[0] != 0 or sec.oob[1] != "OK":
        sec.errors.append(f"out of bounds values: {sec.oob[0]} {sec.oob[1]}")
    if sec.avg is not None and (sec.avg[1] or "").upper() == "FAILED":
        sec.errors.append(f"avg bus bandwidth {sec.avg[0]:g} GB/s below NCCL_TESTS_MIN_BW")


def _size_measurements(name: str, rows: list[Row]) -> list[Measurement]:
    """Every size, out-of-place and in-place; ``.type.redop[.rootN]`` appended when the run
    covered several types/ops/roots (``-d all``). Zero values (below the printed 0.01 GB/s
    precision) are not measurements."""
    multi = len({r.combo for r in rows}) > 1
    roots = len({r.root for r in rows}) > 1
    found: dict[str, Measurement] = {}
    for r in rows:
        tail = f".{r.dtype}.{r.redop or 'none'}" if multi else ""
        tail += f".root{r.root}" if multi and roots else ""
        for suffix, half in (("", r.out), ("_inplace", r.inp)):
            if half is None:
                continue
            detail = {"time_us": half.time_us, "count": r.count, "type": r.dtype}
            for field_, value in (("busbw", half.busbw), ("algbw", half.algbw)):
                if value > 0:
                    metric = f"{name}.{field_}{suffix}@{r.size}{tail}"
                    found[metric] = Measurement(metric, value, "GB/s", detail=detail)
    return list(found.values())


def _section_result(sec: _Section, hint: str | None) -> tuple[str, list[Measurement]]:
    name = _name(sec, hint)
    _check(sec)
    out: list[Measurement] = []
    if sec.avg is not None and 0 < sec.avg[0] < math.inf:
        out.append(Measurement(f"{name}.busbw_avg", sec.avg[0], "GB/s"))
    elif sec.avg is None and sec.rows:
        # an average over part of the table compares with nothing: the sizes stand alone
        sec.problems.append(
            f"no '# Avg bus bandwidth' line (cut short after {len(sec.rows)} rows?);"
            " busbw_avg not recorded"
        )
    return name, out + _size_measurements(name, sec.rows)


def _is_nccl_output(text: str) -> bool:
    return bool(_HEADER.search(text) or _RANK.search(text) or _COLLECTIVE.search(text))


def parse_nccl(text: str, *, test: str | None = None) -> ParseResult:
    """Measurements ``<test>.busbw_avg`` and, for every message size, ``<test>.busbw@<bytes>``,
    ``<test>.algbw@<bytes>`` (out-of-place), ``<test>.busbw_inplace@<bytes>`` and
    ``<test>.algbw_inplace@<bytes>``; all GB/s, detail ``time_us``. ``test`` names the test
    when the output does not."""
    sections = _sections(text)
    measurements: list[Measurement] = []
    errors: list[str] = []
    problems: list[str] = []
    names: list[str] = []
    for sec in sections:
        name, found = _section_result(sec, test)
        names.append(name)
        measurements += found
        errors += sec.errors
        problems += sec.problems
    if not measurements:
        what = "no nccl-tests result rows and no '# Avg bus bandwidth' line found"
        said = errors + [p for p in problems if p.startswith("nccl reported:")]
        if said:
            raise BenchmarkFailed(f"nccl: {what}: {said[0]}")
        if _is_nccl_output(text):
            raise BenchmarkFailed(f"nccl: {what}")
        raise fail("nccl", what)
    models = _models(sections)
    return result("nccl", measurements, errors, problems, _meta(sections, names), models)


def _models(sections: list[_Section]) -> list[str]:
    """The distinct GPU models the ranks print, first seen first."""
    return list(dict.fromkeys(m for s in sections for m in s.models))


def _meta(sections: list[_Section], names: list[str]) -> dict[str, Any]:
    first = sections[0]
    rows = [r for s in sections for r in s.rows]
    hosts = list(dict.fromkeys(h for s in sections for h in s.hosts))
    meta: dict[str, Any] = {**first.meta, "test": names[0], "tests": names}
    meta["ranks"] = meta["gpus"] = first.ranks
    meta["nodes"] = hosts
    meta["device_model"] = device_model(_models(sections))
    meta["sizes"] = sorted({r.size for r in rows})
    meta["max_bytes"] = max(meta["sizes"], default=None)
    meta["checked"] = any(
        h is not None and h.wrong is not None for r in rows for h in (r.out, r.inp)
    )
    return meta
