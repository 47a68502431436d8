"""Typed rows (``history.records``): what callers hand the history instead of ``(table,
dict)`` tuples, and the batch the history makes of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmhealth.history import History, records
from tests.unit.history.helpers import query


def test_rows_become_inserts_and_upserts_by_the_tables_primary_key() -> None:
    run = {"run_id": "r1", "ts": 1.0, "node": "n1", "phase": "prolog", "status": "ok"}
    batch = records.batch(
        [
            records.check_run(run),
            records.job({"job_id": "7", "node": "n1", "user": "alice"}),
            records.drain({"ts": 2.0, "node": "n1", "state": "drained", "reason": "x"}),
            records.check_run({"run_id": "r1", "status": "fail"}, upsert=True),
            records.remediation({"id": 3, "outcome": "validated"}, upsert=True),
        ],
        kv={"k": 1},
    )
    assert [t for t, _ in batch.inserts] == ["check_runs", "drains"]
    assert [(t, pk) for t, _, pk in batch.upserts] == [
        ("jobs", "job_id"), ("check_runs", "run_id"), ("remediations", "id"),
    ]  # fmt: skip
    assert batch.inserts[0][1] is run  # the caller's row, not a copy
    assert batch.kv == {"k": 1}
    batch.validate()


def test_an_unknown_column_is_still_refused_before_any_write() -> None:
    with pytest.raises(ValueError, match="unknown or no columns"):
        records.batch([records.drain({"ts": 1.0, "no_such_column": 1})]).validate()


def test_added_rows_land_after_the_batchs_own(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    first = {"run_id": "a", "ts": 1.0, "node": "n1", "phase": "prolog", "status": "ok"}
    batch = records.batch([records.check_run(first)])
    records.add(batch, [records.check_run({**first, "run_id": "b", "ts": 2.0}),
                        records.job({"job_id": "7", "node": "n1", "user": "alice"})])  # fmt: skip
    with History(db) as history:
        assert history.write(batch)
    assert query(db, "SELECT run_id FROM check_runs ORDER BY rowid") == [("a",), ("b",)]
    assert query(db, "SELECT job_id, user FROM jobs") == [("7", "alice")]
