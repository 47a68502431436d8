"""One result row of an nccl-tests table, in every layout nccl-tests has printed.

``size count type [redop] [root]`` then an out-of-place and an in-place half of
``time algbw busbw #wrong`` (``#wrong`` is ``N/A`` under ``-c 0``; before 2.13 it was a max
delta like ``0e+00``), each followed by ``i_min i_max i_p99 i_cv%`` under ``-I 1``, then an
optional ``-S 1`` timestamp. Trace replay prints the in-place half only. Before 2.13 the
columns depended on the test (``all_gather``: no redop, no root; ``broadcast``: root only).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurmhealth.baseline.parse_common import NUM

_START = re.compile(r"^\s*(\d{1,20})\s+(\d{1,20})\s+([A-Za-z]\w{0,15})(?:\s|$)")
_WORD = re.compile(r"[A-Za-z]\w{0,15}")
_VALUE = re.compile(r"-?" + NUM)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIME = re.compile(r"\d{2}:\d{2}:\d{2}")


@dataclass(frozen=True)
class Half:
    time_us: float
    algbw: float
    busbw: float
    wrong: float | None  # None: not checked (N/A)


@dataclass(frozen=True)
class Row:
    size: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    out: Half | None  # None: in-place only (trace replay)
    inp: Half

    @property
    def combo(self) -> tuple[str, str | None, int | None]:
        return (self.dtype, self.redop, self.root)


def _value(token: str) -> float | None:
    return float(token) if _VALUE.fullmatch(token) else None


def _half(tokens: list[str]) -> Half | None:
    t, a, b = (_value(x) for x in tokens[:3])
    if t is None or a is None or b is None:
        return None
    if tokens[3] == "N/A":
        return Half(t, a, b, None)
    wrong = _value(tokens[3])
    return None if wrong is None else Half(t, a, b, wrong)


def is_row(line: str) -> bool:
    """The line starts like a result row (size, count, type)."""
    return bool(_START.match(line))


def parse_row(line: str, per_iter: bool) -> Row | None:
    """The row, or None when the line does not fit any layout."""
    m = _START.match(line)
    if not m:
        return None
    rest = line[m.end() :].split()
    redop = rest.pop(0) if rest and rest[0] != "N/A" and _WORD.fullmatch(rest[0]) else None
    if len(rest) >= 2 and _DATE.fullmatch(rest[-2]) and _TIME.fullmatch(rest[-1]):
        rest = rest[:-2]
    half = 8 if per_iter or len(rest) in (16, 17) else 4
    root: int | None = None
    if len(rest) % half == 1:
        if not re.fullmatch(r"-?\d{1,9}", rest[0]):
            return None
        root = int(rest.pop(0))
    if len(rest) == 2 * half:
        out, inp = _half(rest[:4]), _half(rest[half : half + 4])
        if out is None:
            return None
    elif len(rest) == half:
        out, inp = None, _half(rest[:4])
    else:
        return None
    if inp is None:
        return None
    return Row(int(m.group(1)), int(m.group(2)), m.group(3), redop, root, out, inp)
