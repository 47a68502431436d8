"""The history's read side in one place: handles and every named query.

``from slurmhealth.history import read`` then ``read.job_row(db, job_id)``; see
``history.queries``, ``history.samples`` and ``history.baselines`` for what each returns.
"""

from __future__ import annotations

from slurmhealth.errors import StoreError
from slurmhealth.history.baselines import baseline_rows
from slurmhealth.history.queries import (
    check_runs,
    drain_rows,
    incident_rows,
    job_had_events,
    job_node_rows,
    job_row,
    job_row_counts,
    nodes_of_job,
    owner_uid,
    past_incident_rows,
    remediation_rows,
    runs,
)
from slurmhealth.history.reader import Reader, Source, history_paths, open_reader
from slurmhealth.history.samples import GpuRollup, Series, gpu_rollups, task_metrics

__all__ = [
    "GpuRollup",
    "Reader",
    "Series",
    "Source",
    "StoreError",
    "baseline_rows",
    "check_runs",
    "drain_rows",
    "gpu_rollups",
    "history_paths",
    "incident_rows",
    "job_had_events",
    "job_node_rows",
    "job_row",
    "job_row_counts",
    "nodes_of_job",
    "open_reader",
    "owner_uid",
    "past_incident_rows",
    "remediation_rows",
    "runs",
    "task_metrics",
]
