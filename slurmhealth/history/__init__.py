"""The per-node history database (DESIGN.md 5): the only package that knows SQL, ``sqlite3``
and the schema.

- write side (here, cheap to import: the prolog loads it before every job; plain ``sqlite3``,
  ``sqlite_utils`` only to migrate): :class:`History` writes a :class:`Batch` or spools it;
  ``history.rows`` builds the rows of each table;
- read side (``history.read``): a read-only :class:`~slurmhealth.history.reader.Reader` and
  named queries that return plain dicts, JSON columns decoded once, and raise only
  :class:`StoreError`;
- the ``baselines`` table: ``history.baselines``.
"""

from __future__ import annotations

from slurmhealth.errors import StoreError
from slurmhealth.history.batch import Batch
from slurmhealth.history.schema import COLUMNS, migration
from slurmhealth.history.writer import History, hold_open

__all__ = ["COLUMNS", "Batch", "History", "StoreError", "hold_open", "migration"]
