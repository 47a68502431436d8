"""Plain data shared by the sidecar loop, its detectors and its Prometheus collector."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurmhealth.model import NodeSnapshot, Severity


@dataclass(frozen=True)
class JobLabels:
    """The labels every per-GPU series carries (besides node, gpu, uuid, model)."""

    job_id: str
    user: str = ""
    account: str = ""
    partition: str = ""
    qos: str = ""
    priority: str = ""  # a label value: Slurm's integer priority as text
    node: str = ""


@dataclass(frozen=True)
class Event:
    """Something a detector noticed while the job ran. ``ts`` is UTC seconds."""

    ts: float
    kind: str  # xid | nvlink_down | nvlink_errors | throttle | ecc | row_remap | gpu_lost |
    #            hang | straggler | throughput_drop | step_stall
    severity: Severity
    message: str
    gpu: int | None = None
    uuid: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskStats:
    """What the training loop reported through :mod:`slurmhealth.job` (latest window)."""

    steps_total: int
    step_seconds: float | None = None  # median over the recent window
    samples_per_second: float | None = None
    tokens_per_second: float | None = None
    mfu_ratio: float | None = None  # model FLOPs utilisation, 0-1
    comm_ratio: float | None = None  # share of step time in communication, 0-1
    data_wait_ratio: float | None = None  # share of step time waiting for data, 0-1
    last_step_ts: float | None = None


@dataclass(frozen=True)
class ExportState:
    """A consistent view for one scrape; the sidecar swaps in a new one each interval."""

    labels: JobLabels
    snapshot: NodeSnapshot | None = None
    xid_counts: Mapping[tuple[int, int], int] = field(default_factory=dict)  # (gpu, xid) -> n
    event_counts: Mapping[tuple[str, int | None], int] = field(default_factory=dict)
    task: TaskStats | None = None
    drains_suppressed_total: int = 0
    samples_total: int = 0
    started_ts: float = 0.0
