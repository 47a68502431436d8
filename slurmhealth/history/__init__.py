"""The per-node history database (DESIGN.md 5): the only package that knows SQL, ``sqlite3``
and the schema.

- writes: :class:`History` (``write(Batch)``, spool, migrations), row shapes in ``rows``;
- reads: :class:`Reader` (read-only) and the named queries below, which return plain dicts
  with JSON columns decoded once and raise only :class:`~slurmhealth.errors.StoreError`;
- the ``baselines`` table: :func:`add_baselines`, :func:`baseline_rows`.

Imports stay cheap (the prolog imports this before every job): plain ``sqlite3``;
``sqlite_utils`` only to migrate.
"""

from __future__ import annotations

from slurmhealth.errors import StoreError
from slurmhealth.history import rows
from slurmhealth.history.baselines import add_baselines, baseline_rows
from slurmhealth.history.batch import Batch
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
    runs,
)
from slurmhealth.history.reader import Reader, Source, history_paths, open_reader
from slurmhealth.history.samples import gpu_samples, task_metrics
from slurmhealth.history.schema import COLUMNS, migration
from slurmhealth.history.writer import History

__all__ = [
    "COLUMNS",
    "Batch",
    "History",
    "Reader",
    "Source",
    "StoreError",
    "add_baselines",
    "baseline_rows",
    "check_runs",
    "drain_rows",
    "gpu_samples",
    "history_paths",
    "incident_rows",
    "job_had_events",
    "job_node_rows",
    "job_row",
    "job_row_counts",
    "migration",
    "nodes_of_job",
    "open_reader",
    "owner_uid",
    "past_incident_rows",
    "rows",
    "runs",
    "task_metrics",
]
