"""gpu-burn (wilicc/gpu-burn) output, every published layout.

A progress line (``\\r``-separated on a terminal) has one column per GPU in three fields::

    60.0%  proc'd: 4812 (43210 Gflop/s) - -1 (0 Gflop/s)   errors: 0 - -1  (DIED!)- 0 ...
       temps: 66 C - -- - 64 C

Columns are separated by ``- `` (``/ `` before version 0.8); a value is ``%d`` and may be
negative (a dead GPU prints ``-1``), a note ``(DIED!)`` / ``(WARNING!)`` follows its value
with no space before the next separator, a missing temperature prints ``--``. Errors are
counted per GPU and reset after each ``Summary at:`` line. The run ends with ``Tested N GPUs:``
and one ``GPU i: OK|FAULTY`` line per GPU. A run with no progress, a CUDA init failure or no
final verdicts raises :class:`BenchmarkFailed`: nothing it printed is a baseline.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from slurmhealth.baseline.model import BenchmarkFailed, Measurement, ParseResult
from slurmhealth.baseline.parse_common import LAUNCHER_PREFIX, NUM, device_model, fail, result

_PROGRESS = re.compile(r"(?:(" + NUM + r")%\s+)?proc'd:(.*)$")
_FIELDS = re.compile(r"(.*?)(?:errors:(.*?))?(?:temps:(.*))?$", re.DOTALL)
_INT = r"(?<![\w.])(-?\d{1,20})"
_PROC_ITEM = re.compile(_INT + r"(?:\s*\(\s*(" + NUM + r")\s*Gflop/s\))?")
_ERR_ITEM = re.compile(_INT + r"(?:\s*\(([^()]{0,40})\))?")
_TEMP_ITEM = re.compile(r"(?<!\S)(?:(-?\d{1,4})\s*C(?!\w)|--(?!\S))")
_SUMMARY = re.compile(r"Summary at:")
_TESTED = re.compile(r"^\s*Tested\s+(\d{1,6})\s+GPUs?:")
_VERDICT = re.compile(r"^\s*GPU\s+(\d{1,6}):\s*(OK|FAULTY)\s*$")
_DEVICE = re.compile(r"^\s*GPU\s+(\d{1,6}):\s*(.+?)\s*\(UUID:")
_INIT_DEVICE = re.compile(r"Initialized device\s+(\d{1,6})\b")
_CUINIT = re.compile(r"cuInit returned\s+(-?\d{1,9})")
_FATAL = re.compile(
    r"(Couldn't init (?:CUDA|a GPU test)|No CUDA devices|No CUDA capable|No clients are alive"
    r"|Not enough devices|Low mem for result)",
    re.IGNORECASE,
)
_MARKER = re.compile(
    r"(Burning for|Using compare file|Initialized device|GPU Burn|gpu[-_]burn|cuInit returned"
    r"|Tested\s+\d+\s+GPUs)",
    re.IGNORECASE,
)
_ERROR_LINE = re.compile(
    r"(Failure during compute|Error\b.*\(|CUDA error|CUBLAS_STATUS_)", re.IGNORECASE
)


@dataclass(frozen=True)
class _Progress:
    lineno: int
    period: int  # 'Summary at:' lines before it: gpu-burn zeroes the error counters there
    percent: float | None
    iters: tuple[int, ...]
    gflops: tuple[float | None, ...]
    errors: tuple[tuple[int, str], ...] | None  # (value, note) per GPU; None: unreadable
    temps: tuple[int | None, ...] | None


def _fields(body: str) -> tuple[str, str | None, str | None]:
    """proc'd, errors and temps fields of a progress line's body (None: field absent)."""
    m = _FIELDS.match(body)
    return (m.group(1), m.group(2), m.group(3)) if m else (body, None, None)


def _progress(lineno: int, period: int, m: re.Match[str]) -> _Progress | None:
    proc, errs, temps = _fields(m.group(2))
    cols = _PROC_ITEM.findall(proc)
    if not cols:
        return None
    n = len(cols)
    err_items = _ERR_ITEM.findall(errs) if errs is not None else []
    temp_items = _TEMP_ITEM.findall(temps) if temps is not None else []
    return _Progress(
        lineno=lineno,
        period=period,
        percent=float(m.group(1)) if m.group(1) else None,
        iters=tuple(int(i) for i, _g in cols),
        gflops=tuple(float(g) if g else None for _i, g in cols),
        errors=tuple((int(v), note.strip()) for v, note in err_items)
        if len(err_items) == n
        else None,
        temps=tuple(int(t) if t else None for t in temp_items) if len(temp_items) == n else None,
    )


@dataclass
class _Scan:
    progress: list[_Progress]
    verdicts: dict[int, str]
    tested: int | None
    models: dict[int, str]
    init_devices: list[int]
    fatal: list[str]
    tool_errors: list[str]


def _is_fatal(line: str) -> bool:
    """A line saying a GPU test never started (cuInit failed, no device, init error)."""
    m = _CUINIT.search(line)
    return bool(m and int(m.group(1)) != 0) or bool(_FATAL.search(line))


def _scan(text: str) -> _Scan:
    scan = _Scan([], {}, None, {}, [], [], [])
    period = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = LAUNCHER_PREFIX.sub("", raw, count=1)
        if (m := _PROGRESS.search(line)) and (p := _progress(lineno, period, m)):
            scan.progress.append(p)
            continue
        if _SUMMARY.search(line):
            period += 1
        elif m := _TESTED.match(line):
            scan.tested = int(m.group(1))
        elif m := _VERDICT.match(line):
            scan.verdicts[int(m.group(1))] = m.group(2)
        elif m := _DEVICE.match(line):
            scan.models[int(m.group(1))] = m.group(2)
        elif m := _INIT_DEVICE.search(line):
            scan.init_devices.append(int(m.group(1)))
        elif _is_fatal(line):
            scan.fatal.append(line.strip()[:200])
        elif _ERROR_LINE.search(line):
            scan.tool_errors.append(line.strip()[:200])
    return scan


def _error_totals(progress: list[_Progress], n: int) -> tuple[list[int], list[str], bool]:
    """Errors per GPU over the whole run: the sum over summary periods of each period's last
    count, signed as printed (a wrapped-around count is negative, and still errors); the
    note each GPU last had; whether every progress line's errors field was readable."""
    final: dict[int, tuple[tuple[int, str], ...]] = {}
    notes = [""] * n
    readable = True
    for p in progress:
        if p.errors is None or len(p.errors) != n:
            readable = False
            continue
        final[p.period] = p.errors
        notes = [note or old for (_v, note), old in zip(p.errors, notes, strict=True)]
    totals = [sum(errs[gpu][0] for errs in final.values()) for gpu in range(n)]
    return totals, notes, readable


def _gpu_ids(scan: _Scan, n: int) -> list[int]:
    """Column -> device index: ``gpu-burn -i K`` burns one GPU, printed as column 0."""
    if n == 1 and len(set(scan.init_devices)) == 1:
        return [scan.init_devices[0]]
    return list(range(n))


def _check_run(scan: _Scan, text: str) -> None:
    if scan.fatal:
        raise BenchmarkFailed(f"gpuburn: run failed: {scan.fatal[0]}")
    if not scan.progress and not scan.tested and not _MARKER.search(text):
        raise fail("gpuburn", "not gpu-burn output: no progress line ('proc'd: ... Gflop/s')")
    if not scan.progress:
        extra = f" ({scan.tool_errors[0]})" if scan.tool_errors else ""
        raise BenchmarkFailed(f"gpuburn: no progress line ('proc'd: ...'); nothing burned{extra}")
    last = scan.progress[-1]
    where = f"last progress {last.percent:g}%" if last.percent is not None else "no percent"
    if scan.tested is None:
        raise BenchmarkFailed(
            f"gpuburn: run cut short: no final 'Tested N GPUs' verdicts ({where})"
        )
    if len(scan.verdicts) != scan.tested:
        raise BenchmarkFailed(
            f"gpuburn: run cut short: 'Tested {scan.tested} GPUs' but "
            f"{len(scan.verdicts)} verdict lines"
        )
    if len(last.iters) != scan.tested:
        raise BenchmarkFailed(
            f"gpuburn: progress line {last.lineno} has {len(last.iters)} GPU columns for "
            f"{scan.tested} GPUs tested; cannot tell which GPU is which"
        )


def _gpu(
    last: _Progress, col: int, gpu: int, total: int, note: str
) -> tuple[list[Measurement], list[str]]:
    """GPU ``gpu`` (column ``col``): its measurement, unless it died or did not compute, and
    what went wrong with it. A dead GPU prints ``-1`` iterations and ``(DIED!)``."""
    value = last.errors[col][0] if last.errors is not None else None
    detail: dict[str, Any] = {"iterations": last.iters[col], "errors": total}
    if note:
        detail["note"] = note
    if last.temps is not None and last.temps[col] is not None:
        detail["temp_c"] = last.temps[col]
    errors: list[str] = []
    dead = last.iters[col] < 0 or "DIED" in note.upper()
    if dead:
        errors.append(f"GPU {gpu}: died (proc'd {last.iters[col]}, errors {value})")
    elif total or note:
        errors.append(f"GPU {gpu}: {total} errors" + (f" ({note})" if note else ""))
    gflops = last.gflops[col]
    if dead or gflops is None or gflops <= 0:
        if not dead and gflops is not None:
            errors.append(f"GPU {gpu}: {gflops:g} Gflop/s (not computing)")
        return [], errors
    return [Measurement("gpuburn.gflops", gflops, "Gflop/s", gpu=gpu, detail=detail)], errors


def parse_gpuburn(text: str) -> ParseResult:
    """Measurements ``gpuburn.gflops`` per GPU (Gflop/s, ``gpu`` = device index) from the last
    progress line; only GPUs that were computing (a positive rate, not dead) get one. Detail
    holds iterations, errors over the whole run and temperature (C)."""
    scan = _scan(text)
    _check_run(scan, text)
    last = scan.progress[-1]
    n = len(last.iters)
    ids = _gpu_ids(scan, n)
    totals, notes, readable = _error_totals(scan.progress, n)
    errors: list[str] = []
    problems: list[str] = []
    measurements: list[Measurement] = []
    if not readable:
        problems.append(f"a progress line did not have {n} readable GPU columns; it was skipped")
    for col, gpu in enumerate(ids):
        measured, said = _gpu(last, col, gpu, totals[col], notes[col])
        errors += said
        measurements += measured
    for col, verdict in sorted(scan.verdicts.items()):
        if verdict == "FAULTY" and 0 <= col < n:
            errors.append(f"GPU {ids[col]}: FAULTY")
    errors += [f"tool: {e}" for e in scan.tool_errors]
    if all(g is None for g in last.gflops):
        raise BenchmarkFailed("gpuburn: no Gflop/s in the progress lines (gpu-burn before 0.7)")
    if not measurements:
        why = f" ({'; '.join(errors)[:300]})" if errors else ""
        raise BenchmarkFailed(f"gpuburn: no GPU measured a positive Gflop/s rate{why}")
    models = sorted(set(scan.models.values()))
    meta: dict[str, Any] = {
        "percent": last.percent,
        "gpus": n,
        "tested": scan.tested,
        "verdicts": {ids[c]: v for c, v in sorted(scan.verdicts.items()) if 0 <= c < n},
        "device_model": device_model(models),
    }
    return result("gpuburn", measurements, errors, problems, meta, models)
