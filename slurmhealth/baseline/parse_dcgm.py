"""``dcgmi diag`` output, text table or ``-j`` JSON. Each test scores 1 (Pass), 0.5 (Warn)
or 0 (Fail); skipped tests give no measurement."""

from __future__ import annotations

import re
from typing import Any

from slurmhealth.baseline.model import Measurement, ParseResult
from slurmhealth.baseline.parse_common import (
    as_dict,
    as_list,
    fail,
    load_json_object,
    result,
    slug,
)

_SCORE = {"pass": 1.0, "warn": 0.5, "fail": 0.0}
_STATUS = r"(Pass|Fail|Warn|Skip|Not Run)"
_SECTION = re.compile(r"^\s*[|+]-{2,}\s+([A-Za-z][\w ]{0,40}?)\s+-{2,}\+")
_VALUE = re.compile(r"^" + _STATUS + r"\b(?:\s*-\s*(.*))?$", re.IGNORECASE)
_PER_GPU = re.compile(r"GPU\s*(\d{1,4})\s*:\s*" + _STATUS, re.IGNORECASE)
_GPU_LIST = re.compile(r"^GPUs?\s*:\s*([\d,\s]{1,400})$", re.IGNORECASE)
_LEVEL = re.compile(r"(?:-r|--run)\s+(\d)\b")
_NOTE_ROWS = {"warning", "info", "error"}
_CATEGORY_LEVEL = {"deployment": 1, "integration": 2, "hardware": 2, "stress": 3}

# (category, test, gpu or None, status lower-case)
_Result = tuple[str, str, int | None, str]


def _status(raw: str) -> str:
    s = raw.strip().lower()
    return "skip" if s in ("skip", "not run", "skipped") else s


def _text_results(text: str) -> tuple[list[_Result], list[str], dict[str, str]]:
    results: list[_Result] = []
    notes: list[str] = []
    metadata: dict[str, str] = {}
    section = ""
    test = ""
    for line in text.splitlines():
        if m := _SECTION.match(line):
            section = m.group(1).strip()
            continue
        stripped = line.strip()
        if not stripped.startswith("|") or stripped.count("|") < 3:
            continue
        cells = [c.strip() for c in stripped.strip("|").split("|")]
        name, value = cells[0], " ".join(cells[1:]).strip()
        if section.lower() == "metadata":
            if name:
                metadata[name] = value
            continue
        if name.lower() in _NOTE_ROWS:
            notes.append(f"{test}: {value}" if test else value)
            continue
        if (g := _PER_GPU.fullmatch(name)) and test:
            results.append((section, test, int(g.group(1)), _status(g.group(2))))
            continue
        if name:
            test = name
        if not test or not section:
            continue
        if g := _PER_GPU.fullmatch(value):
            results.append((section, test, int(g.group(1)), _status(g.group(2))))
            continue
        v = _VALUE.match(value)
        if v is None:
            continue
        status, scope = _status(v.group(1)), (v.group(2) or "").strip()
        gl = _GPU_LIST.match(scope)
        gpus = [int(x) for x in re.findall(r"\d{1,4}", gl.group(1))] if gl else []
        if gpus:
            results.extend((section, test, gpu, status) for gpu in gpus)
        else:
            results.append((section, test, None, status))
    return results, notes, metadata


def _gpu_ids(result: dict[str, Any]) -> list[int | None]:
    for key in ("gpu_id", "entity_id", "gpu_ids"):
        raw = result.get(key)
        if isinstance(raw, bool):
            continue
        if isinstance(raw, int):
            return [raw]
        if isinstance(raw, str) and re.fullmatch(r"\s*\d{1,4}\s*", raw):
            return [int(raw)]
        if isinstance(raw, str | list) and key == "gpu_ids":
            return [None]  # deployment tests cover all GPUs at once
    return [None]


def _json_results(diag: dict[str, Any]) -> tuple[list[_Result], list[str], list[str]]:
    results: list[_Result] = []
    notes: list[str] = []
    problems: list[str] = []
    for cat in as_list(diag.get("test_categories")):
        cat_d = as_dict(cat)
        category = cat_d.get("category")
        category = category if isinstance(category, str) else "unknown"
        for t in as_list(cat_d.get("tests")):
            t_d = as_dict(t)
            name = t_d.get("name")
            if not isinstance(name, str):
                problems.append(f"{category}: a test without a name")
                continue
            res = as_list(t_d.get("results"))
            if not res:
                problems.append(f"{name}: no results")
            for r in res:
                r_d = as_dict(r)
                status = r_d.get("status")
                if not isinstance(status, str) or _status(status) not in (*_SCORE, "skip"):
                    problems.append(f"{name}: result without a known status")
                    continue
                for gpu in _gpu_ids(r_d):
                    results.append((category, name, gpu, _status(status)))
                for w in as_list(r_d.get("warnings")):
                    msg = as_dict(w).get("warning") if isinstance(w, dict) else w
                    if isinstance(msg, str):
                        notes.append(f"{name}: {msg}")
    return results, notes, problems


def _results(text: str) -> tuple[list[_Result], list[str], list[str], dict[str, Any]]:
    """Results, notes, problems and meta from the ``-j`` JSON or, without it, the table."""
    doc = load_json_object(text)
    diag = as_dict(doc.get("DCGM GPU Diagnostic")) if doc else {}
    problems: list[str] = []
    meta: dict[str, Any] = {}
    if diag:
        meta["format"] = "json"
        results, notes, problems = _json_results(diag)
        for key in ("version", "Driver Version Detected"):
            if isinstance(doc and doc.get(key), str):
                meta[slug(key)] = doc[key] if doc else None
        runtime = doc.get("runtime_error") if doc else None
        if isinstance(runtime, str) and runtime:
            notes.append(f"runtime error: {runtime}")
    else:
        meta["format"] = "text"
        results, notes, metadata = _text_results(text)
        for key, value in metadata.items():
            meta[slug(key)] = value
    return results, notes, problems, meta


def _scores(results: list[_Result], notes: list[str]) -> tuple[list[Measurement], list[str]]:
    """One score per test (and GPU) that ran; the errors: failed tests, then the notes that
    explain them (a runtime error alone stands for all)."""
    measurements: list[Measurement] = []
    errors: list[str] = []
    for category, test, gpu, status in results:
        where = f" GPU {gpu}" if gpu is not None else ""
        if status == "fail":
            errors.append(f"{test}{where}: Fail")
        if status in _SCORE:
            measurements.append(
                Measurement(
                    f"dcgm.{slug(test)}",
                    _SCORE[status],
                    "score",
                    gpu=gpu,
                    detail={"category": category, "status": status},
                )
            )
    if any(n.startswith("runtime error") for n in notes):
        errors.extend(n for n in notes if n.startswith("runtime error"))
    elif errors:
        errors.extend(notes)
    return measurements, errors


def _level(text: str, results: list[_Result]) -> dict[str, Any]:
    """``level`` from ``-r N`` on the command line, else the deepest category present."""
    if m := _LEVEL.search(text):
        return {"level": int(m.group(1)), "level_source": "command"}
    levels = [_CATEGORY_LEVEL.get(c.strip().lower(), 0) for c, _, _, _ in results]
    if max(levels, default=0):
        return {"level": max(levels), "level_source": "inferred"}
    return {}


def parse_dcgm(text: str) -> ParseResult:
    """Measurements ``dcgm.<test>`` (test name lower-cased, ``_``-joined): 1 pass, 0.5 warn,
    0 fail, per GPU when the output names GPUs; ``meta['level']`` from ``-r N`` or guessed
    from the categories present (``level_source``)."""
    results, notes, problems, meta = _results(text)
    if not results:
        err = next((ln.strip() for ln in text.splitlines() if ln.strip().startswith("Error")), "")
        raise fail("dcgm", f"no diagnostic results (no test rows or test_categories) {err[:160]}")
    measurements, errors = _scores(results, notes)
    meta["warnings"] = notes
    meta.update(_level(text, results))
    gpus = sorted({g for _, _, g, _ in results if g is not None})
    if gpus:
        meta["gpus"] = gpus
    return result("dcgm", measurements, errors, problems, meta)  # a failed test is an error
