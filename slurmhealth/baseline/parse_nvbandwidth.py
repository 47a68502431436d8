"""nvbandwidth output: ``Running <testcase>.`` blocks with a GB/s matrix and a
``SUM <testcase> <GB/s>`` line."""

from __future__ import annotations

import re
from typing import Any

from slurmhealth.baseline.model import Measurement, ParseResult
from slurmhealth.baseline.parse_common import NUM, device_model, fail, result

_RUNNING = re.compile(r"^\s*Running\s+(?:benchmark\s+)?(\w{1,100})\.?\s*$")
_TITLE = re.compile(r"bandwidth\s*\(GB/s\)", re.IGNORECASE)
_COLHEAD = re.compile(r"^\s*\d{1,4}(?:\s+\d{1,4})*\s*$")
_ROW = re.compile(r"^\s*(\d{1,4})((?:\s+(?:" + NUM + r"|N/A))+)\s*$")
_SUM = re.compile(r"^\s*SUM\s+(\w{1,100})\s+(" + NUM + r")\s*$")
_DEVICE = re.compile(r"^\s*Device\s+(\d{1,4}):\s*(.+?)(?:\s*\([0-9A-Fa-f:.]{1,40}\))?\s*$")
_WAIVED = re.compile(r"waived|error|fail", re.IGNORECASE)


class _Block:
    def __init__(self, name: str) -> None:
        self.name = name
        self.title = ""
        self.columns: list[int] = []
        self.rows: dict[int, list[float | None]] = {}
        self.total: float | None = None
        self.notes: list[str] = []


def _scan(text: str) -> tuple[list[_Block], dict[int, str]]:
    """The testcase blocks (a SUM line without its block gets one) and the device names."""
    blocks: list[_Block] = []
    devices: dict[int, str] = {}
    sums: dict[str, float] = {}
    current: _Block | None = None
    for line in text.splitlines():
        if m := _RUNNING.match(line):
            current = _Block(m.group(1))
            blocks.append(current)
        elif m := _SUM.match(line):
            sums[m.group(1)] = float(m.group(2))
            if current is not None and current.name == m.group(1):
                current.total = float(m.group(2))
        elif m := _DEVICE.match(line):
            devices[int(m.group(1))] = m.group(2)
        elif current is not None:
            _block_line(current, line)
    for name, value in sums.items():
        if not any(b.name == name for b in blocks):
            blocks.append(_Block(name))
            blocks[-1].total = value
    return blocks, devices


def _block_line(current: _Block, line: str) -> None:
    """A line inside a testcase: its title, the column heading, a matrix row or a note."""
    if _TITLE.search(line):
        current.title = line.strip()
    elif current.title and not current.columns and _COLHEAD.match(line):
        current.columns = [int(c) for c in line.split()]
    elif current.columns and (m := _ROW.match(line)):
        vals = m.group(2).split()
        current.rows[int(m.group(1))] = [None if v == "N/A" else float(v) for v in vals]
    elif line.strip() and _WAIVED.search(line):
        current.notes.append(line.strip()[:200])


def _measure(b: _Block, problems: list[str]) -> list[Measurement]:
    """The block's SUM (or, without one, the matrix summed) and for a one-row matrix each
    GPU column; what does not add up goes to ``problems``."""
    for row, vals in b.rows.items():
        if len(vals) != len(b.columns):
            problems.append(f"{b.name}: row {row} has {len(vals)} of {len(b.columns)} values")
    total = b.total
    detail: dict[str, Any] = {"title": b.title} if b.title else {}
    if total is None:
        cells = [v for vals in b.rows.values() for v in vals if v is not None]
        if not cells:
            problems.append(f"{b.name}: no matrix values and no SUM line")
            return []
        total = round(sum(cells), 2)
        problems.append(f"{b.name}: no SUM line; summed the matrix")
        detail["computed"] = True
    out = [Measurement(f"nvbandwidth.{b.name}", total, "GB/s", detail=detail)]
    if len(b.rows) == 1:
        (vals,) = b.rows.values()
        for col, val in zip(b.columns, vals, strict=False):
            if val is not None:
                out.append(Measurement(f"nvbandwidth.{b.name}", val, "GB/s", gpu=col))
    return out


def parse_nvbandwidth(text: str) -> ParseResult:
    """Measurements ``nvbandwidth.<testcase>`` = the SUM (GB/s, no ``gpu``), and for one-row
    (host <-> GPU) matrices one ``nvbandwidth.<testcase>`` per GPU column (``gpu`` set)."""
    blocks, devices = _scan(text)
    if not blocks:
        raise fail("nvbandwidth", "no 'Running <testcase>' block and no 'SUM <testcase>' line")
    measurements: list[Measurement] = []
    problems: list[str] = []
    errors: list[str] = []
    for b in blocks:
        if b.notes and not b.rows and b.total is None:
            errors.append(f"{b.name}: {b.notes[0]}")
        else:
            measurements += _measure(b, problems)
    if not measurements and not errors:
        raise fail("nvbandwidth", "no bandwidth matrix or SUM value in any testcase")
    meta: dict[str, Any] = {"testcases": [b.name for b in blocks]}
    models = sorted(set(devices.values()))
    if devices:
        meta["gpus"] = len(devices)
        meta["device_model"] = device_model(models)
    return result("nvbandwidth", measurements, errors, problems, meta, models)
