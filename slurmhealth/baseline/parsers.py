"""Read benchmark output (nccl-tests, gpu-burn, fio JSON, nvbandwidth, dcgmi diag, perftest) into
:class:`ParseResult`. Each parser is strict: a file with nothing usable raises
:class:`BaselineParseError` with one line naming what was missing; a partly readable file
returns what was read plus ``problems``; output of a run that measured nothing (it never
started, was cut short before its verdict, every value was zero) raises
:class:`BenchmarkFailed` (exit 1, nothing stored). No parser raises anything else on any
text, and :func:`parse` never returns a result without measurements."""

from __future__ import annotations

from slurmhealth.baseline.model import KINDS, BaselineParseError, BenchmarkFailed, ParseResult
from slurmhealth.baseline.parse_dcgm import parse_dcgm
from slurmhealth.baseline.parse_fio import parse_fio
from slurmhealth.baseline.parse_gpuburn import parse_gpuburn
from slurmhealth.baseline.parse_nccl import parse_nccl
from slurmhealth.baseline.parse_nvbandwidth import parse_nvbandwidth
from slurmhealth.baseline.parse_perftest import parse_perftest

__all__ = [
    "BaselineParseError",
    "BenchmarkFailed",
    "parse",
    "parse_dcgm",
    "parse_fio",
    "parse_gpuburn",
    "parse_nccl",
    "parse_nvbandwidth",
    "parse_perftest",
]


def parse(
    kind: str,
    text: str,
    *,
    test: str | None = None,
    output: str | None = None,
    unit: str | None = None,
) -> ParseResult:
    """Parse ``text`` as the output of benchmark ``kind`` (one of :data:`KINDS`).

    ``test`` names the nccl-tests binary (``all_reduce_perf``) or the perftest tool
    (``ib_write_bw``) when the output does not; ``output`` and ``unit``: perftest's
    ``--output=bandwidth|message_rate|latency`` one-number runs and their unit.
    Raises :class:`BenchmarkFailed` when the run measured nothing, so a configured benchmark
    that measured nothing can never pass ``validate`` or be stored as a baseline."""
    if kind == "perftest":
        result = parse_perftest(text, test=test, output=output, unit=unit)
    else:
        result = _dispatch(kind, text, test)
    if not result.measurements:
        why = "; ".join(result.errors or result.problems) or "no values in the output"
        raise BenchmarkFailed(f"{kind}: measured nothing ({why[:300]})")
    return result


def _dispatch(kind: str, text: str, test: str | None) -> ParseResult:
    if kind == "nccl":
        return parse_nccl(text, test=test)
    if kind == "gpuburn":
        return parse_gpuburn(text)
    if kind == "fio":
        return parse_fio(text)
    if kind == "nvbandwidth":
        return parse_nvbandwidth(text)
    if kind == "dcgm":
        return parse_dcgm(text)
    raise BaselineParseError(
        f"unknown benchmark kind {kind!r}; expected one of: {', '.join(KINDS)}"
    )
