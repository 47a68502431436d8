"""Benchmark results as plain data: what a parser reads and the baselines table stores."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurmhealth.errors import UsageError

KINDS = ("nccl", "gpuburn", "fio", "nvbandwidth", "dcgm")


class BaselineParseError(UsageError):
    """The file holds nothing usable for its kind; the message says what was missing."""


@dataclass(frozen=True)
class Measurement:
    """One number from a benchmark. ``metric`` is stable across runs so results compare:
    e.g. ``all_reduce_perf.busbw_avg`` (GB/s), ``all_reduce_perf.busbw@8589934592``,
    ``gpuburn.gflops`` (per GPU), ``fio.seqread.read_bw`` (MiB/s), ``fio.randread.read_iops``,
    ``fio.randread.read_lat_p99`` (us, lower is better), ``nvbandwidth.<testcase>`` (GB/s),
    ``dcgm.<test>`` (1 pass, 0.5 warn, 0 fail)."""

    metric: str
    value: float
    unit: str
    gpu: int | None = None
    higher_is_better: bool = True
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ParseResult:
    kind: str
    measurements: tuple[Measurement, ...]
    passed: bool  # the tool reported no data errors (nccl #wrong, gpu-burn errors, dcgm fail)
    errors: tuple[str, ...] = ()  # what the tool itself reported as wrong
    problems: tuple[str, ...] = ()  # what the parser could not read (truncated, odd lines)
    meta: Mapping[str, Any] = field(default_factory=dict)  # nodes, ranks, GPUs, sizes...
