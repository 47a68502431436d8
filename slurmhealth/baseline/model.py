"""Benchmark results as plain data: what a parser reads and the baselines table stores."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurmhealth.errors import UsageError

KINDS = ("nccl", "gpuburn", "fio", "nvbandwidth", "dcgm", "perftest")


class BaselineParseError(UsageError):
    """The file holds nothing usable for its kind; the message says what was missing."""


class BenchmarkFailed(BaselineParseError):
    """The output is the tool's, but the run measured nothing trustworthy: it never started
    (CUDA init error, no progress), was cut short before its verdict, or measured nothing.
    Nothing is stored; ``baseline ingest`` exits 1 and ``validate`` fails the benchmark."""

    exit_code = 1


@dataclass(frozen=True)
class Measurement:
    """One number from a benchmark. ``metric`` is stable across runs so results compare:
    e.g. ``all_reduce_perf.busbw_avg`` (GB/s), ``all_reduce_perf.busbw@8589934592`` (one per
    message size), ``gpuburn.gflops`` (per GPU, never 0), ``fio.seq_1m.read_bw`` (MiB/s),
    ``fio.rand_4k.read_iops``, ``fio.rand_4k.read_lat_p99`` (us, lower is better),
    ``nvbandwidth.<testcase>`` (GB/s), ``dcgm.<test>`` (1 pass, 0.5 warn, 0 fail),
    ``ib_write_bw.bw_avg`` (Gb/s, perftest; ``printed``: ``"46742.18 MiB/sec"``),
    ``ib_send_lat.lat_typical_us`` (us, lower is better)."""

    metric: str
    value: float
    unit: str
    gpu: int | None = None
    higher_is_better: bool = True
    detail: Mapping[str, Any] = field(default_factory=dict)
    printed: str | None = None  # the value as the tool printed it, with its unit


@dataclass(frozen=True)
class ParseResult:
    kind: str
    measurements: tuple[Measurement, ...]
    passed: bool  # the tool reported no data errors (nccl #wrong, gpu-burn errors, dcgm fail)
    errors: tuple[str, ...] = ()  # what the tool itself reported as wrong
    problems: tuple[str, ...] = ()  # what the parser could not read (truncated, odd lines)
    meta: Mapping[str, Any] = field(default_factory=dict)  # nodes, ranks, GPUs, sizes...
    gpu_model: str | None = None  # as the output names it ("NVIDIA H100 80GB HBM3"), if it does
