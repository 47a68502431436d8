"""The sidecar's own record: an :class:`Event` a detector noticed while the job ran.

``TaskStats`` and ``ExportState`` live in :mod:`slurmhealth.model` (the metrics exposition
reads them too). The job's labels are its :class:`~slurmhealth.model.Job` (the metrics take
it directly).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurmhealth.model import Severity
from slurmhealth.model_records import ExportState, TaskStats

__all__ = ["Event", "ExportState", "TaskStats"]


@dataclass(frozen=True)
class Event:
    """Something a detector noticed while the job ran. ``ts`` is UTC seconds."""

    ts: float
    kind: str  # one of slurmhealth.sidecar.detectors.KINDS
    severity: Severity
    message: str
    gpu: int | None = None
    uuid: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)
