"""Typed rows: what code outside ``history/`` hands the history instead of ``(table, dict)``
tuples. Each table has its constructor here (:func:`check_run`, :func:`drain`, ...), so no
caller spells a table name; :func:`batch` and :func:`add` turn rows into a :class:`Batch`'s
inserts, and an upserting row (``jobs`` always; ``check_runs`` and ``remediations`` when
asked) into an upsert by its table's primary key (``schema.PRIMARY_KEYS``).

A row's values are the table's columns (``history.rows`` builds most of them); the batch
checks them against the schema before it writes (:meth:`Batch.validate`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from slurmhealth.history.batch import Batch
from slurmhealth.history.schema import PRIMARY_KEYS


class Row(NamedTuple):
    """One row of one table: inserted, or upserted by the table's primary key. (Immutable;
    a NamedTuple, not a frozen dataclass: the prolog imports this before every job, and a
    dataclass costs ~7x more to create at import.)"""

    table: str
    values: dict[str, Any]
    upsert: bool = False


def check_run(values: dict[str, Any], *, upsert: bool = False) -> Row:
    """A ``check_runs`` row; ``upsert``: completes the run of the same ``run_id``."""
    return Row("check_runs", values, upsert)


def finding(values: dict[str, Any]) -> Row:
    return Row("findings", values)


def job(values: dict[str, Any]) -> Row:
    """The job's ``jobs`` row, upserted by ``job_id`` (``None`` keeps a stored value)."""
    return Row("jobs", values, upsert=True)


def sample(values: dict[str, Any]) -> Row:
    return Row("samples", values)


def event(values: dict[str, Any]) -> Row:
    return Row("events", values)


def drain(values: dict[str, Any]) -> Row:
    return Row("drains", values)


def remediation(values: dict[str, Any], *, upsert: bool = False) -> Row:
    """A ``remediations`` row; ``upsert``: ends the step of the same ``id``."""
    return Row("remediations", values, upsert)


def evidence(values: dict[str, Any]) -> Row:
    return Row("evidence", values)


def add(into: Batch, rows: Iterable[Row]) -> Batch:
    """``rows`` appended to ``into`` (inserts and upserts, each in the order given)."""
    for row in rows:
        if row.upsert:
            into.upserts.append((row.table, row.values, PRIMARY_KEYS.get(row.table, "id")))
        else:
            into.inserts.append((row.table, row.values))
    return into


def batch(rows: Iterable[Row], kv: dict[str, object] | None = None) -> Batch:
    """One transaction of ``rows`` (and ``kv``'s keys)."""
    return add(Batch(kv={} if kv is None else kv), rows)
