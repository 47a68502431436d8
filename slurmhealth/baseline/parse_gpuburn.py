"""gpu-burn output: progress lines (``proc'd: N (X Gflop/s) - ... errors: ... temps: ...``),
one column per GPU, and the final ``Tested N GPUs:`` block (``GPU 0: OK`` / ``FAULTY``)."""

from __future__ import annotations

import re
from typing import Any

from slurmhealth.baseline.model import Measurement, ParseResult
from slurmhealth.baseline.parse_common import NUM, fail

_PROGRESS = re.compile(r"(?:(" + NUM + r")%\s+)?proc'd:(.*)$")
_COLUMN = re.compile(r"(\d{1,20})\s*\(\s*(" + NUM + r")\s*Gflop/s\)")
_ERRORS = re.compile(r"errors:(.*?)(?:temps:|$)")
_ERR_ITEM = re.compile(r"(\d{1,20})(?:\s*\(([^)]{0,40})\))?")
_TEMPS = re.compile(r"temps:(.*)$")
_TEMP_ITEM = re.compile(r"(\d{1,4}|--)\s*C")
_TESTED = re.compile(r"^\s*Tested\s+(\d{1,6})\s+GPUs?:")
_VERDICT = re.compile(r"^\s*GPU\s+(\d{1,6}):\s*(OK|FAULTY)\b")
_DEVICE = re.compile(r"^\s*GPU\s+(\d{1,6}):\s*(.+?)\s*\(UUID:")


def _columns(segment: str, pattern: re.Pattern[str]) -> list[re.Match[str]]:
    return [m for part in segment.split(" - ") if (m := pattern.search(part))]


def parse_gpuburn(text: str) -> ParseResult:
    """Measurements ``gpuburn.gflops`` per GPU (Gflop/s, ``gpu`` = column index) from the last
    complete progress line; detail holds iterations, errors and temperature (C)."""
    progress: list[tuple[int, str]] = []
    verdicts: dict[int, str] = {}
    tested: int | None = None
    models: dict[int, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if (m := _PROGRESS.search(line)) and _COLUMN.search(m.group(2)):
            progress.append((lineno, line))
        elif m := _TESTED.match(line):
            tested = int(m.group(1))
        elif m := _VERDICT.match(line):
            verdicts[int(m.group(1))] = m.group(2)
        elif m := _DEVICE.match(line):
            models[int(m.group(1))] = m.group(2)
    if not progress and tested is None:
        raise fail(
            "gpuburn", "no progress line ('proc'd: ... Gflop/s') and no 'Tested N GPUs' block"
        )

    problems: list[str] = []
    errors: list[str] = []
    measurements: list[Measurement] = []
    meta: dict[str, Any] = {}
    if progress:
        widths = [len(_COLUMN.findall(line)) for _, line in progress]
        full = max(widths)
        lineno, line = next(
            p for p, w in zip(reversed(progress), reversed(widths), strict=True) if w == full
        )
        if widths[-1] != full:
            problems.append(
                f"last progress line has {widths[-1]} of {full} GPU columns; used line {lineno}"
            )
        m = _PROGRESS.search(line)
        assert m is not None
        meta["percent"] = float(m.group(1)) if m.group(1) else None
        body = m.group(2)
        cols = _COLUMN.findall(body.split("errors:")[0])
        err_m = _ERRORS.search(body)
        errs = _columns(err_m.group(1), _ERR_ITEM) if err_m else []
        temp_m = _TEMPS.search(body)
        temps = _columns(temp_m.group(1), _TEMP_ITEM) if temp_m else []
        if err_m is None:
            problems.append(f"line {lineno}: no 'errors:' field")
        elif len(errs) != len(cols):
            problems.append(f"line {lineno}: {len(errs)} error columns for {len(cols)} GPUs")
        for gpu, (iters, gflops) in enumerate(cols):
            detail: dict[str, Any] = {"iterations": int(iters)}
            if gpu < len(errs):
                detail["errors"] = int(errs[gpu].group(1))
                if errs[gpu].group(2):
                    detail["note"] = errs[gpu].group(2)
                if detail["errors"] > 0 or errs[gpu].group(2):
                    note = f" ({errs[gpu].group(2)})" if errs[gpu].group(2) else ""
                    errors.append(f"GPU {gpu}: {detail['errors']} errors{note}")
            if gpu < len(temps) and temps[gpu].group(1) != "--":
                detail["temp_c"] = int(temps[gpu].group(1))
            measurements.append(
                Measurement("gpuburn.gflops", float(gflops), "Gflop/s", gpu=gpu, detail=detail)
            )
        meta["gpus"] = len(cols)
    else:
        problems.append("no progress line with Gflop/s; only the verdict block was read")
    if tested is None:
        problems.append("no 'Tested N GPUs' block (run may have been cut short)")
    else:
        meta["tested"] = tested
        if len(verdicts) != tested:
            problems.append(f"'Tested {tested} GPUs' but {len(verdicts)} verdict lines")
    for gpu, verdict in sorted(verdicts.items()):
        if verdict == "FAULTY":
            errors.append(f"GPU {gpu}: FAULTY")
    meta["verdicts"] = dict(sorted(verdicts.items()))
    if models:
        meta["device_model"] = (
            sorted(set(models.values()))[0]
            if len(set(models.values())) == 1
            else sorted(set(models.values()))
        )
    return ParseResult(
        kind="gpuburn",
        measurements=tuple(measurements),
        passed=not errors,
        errors=tuple(errors),
        problems=tuple(problems),
        meta=meta,
    )
