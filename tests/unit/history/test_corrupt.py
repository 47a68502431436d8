"""A corrupt history is moved aside (kept for forensics), a fresh one takes the writes,
and the event is logged and counted; a locked or full one is never taken for corrupt."""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

import pytest

from slurmhealth.history import Batch, History
from slurmhealth.history.read import runs
from slurmhealth.history.writer import CORRUPT_KEY, is_corrupt
from tests.unit.history.helpers import query, run_batch


def _moved(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if ".corrupt-" in p.name and "-wal" not in p.name
                  and "-shm" not in p.name)  # fmt: skip


def _corrupt_event(db: Path) -> tuple[object, ...]:
    [row] = query(db, "SELECT kind, message FROM events WHERE kind = 'history_corrupt'")
    return row


def test_a_file_that_is_not_a_database_is_moved_aside_and_replaced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "history.db"
    garbage = os.urandom(8192)
    db.write_bytes(garbage)
    with caplog.at_level(logging.WARNING, logger="slurmhealth.history"):
        history = History(db)
        assert history.write(run_batch("r1", 1.0)) is True
    [moved] = _moved(tmp_path)
    assert moved.name.startswith("history.db.corrupt-2") and moved.read_bytes() == garbage
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert str(db) in record.getMessage() and str(moved) in record.getMessage()
    assert [r["run_id"] for r in runs(history)] == ["r1"]
    assert history.kv_get(CORRUPT_KEY) == 1
    _, message = _corrupt_event(db)
    assert str(moved) in str(message)
    assert not (tmp_path / "history.db.spool.jsonl").exists()


def _filled(db: Path) -> None:
    rows = [("samples", {"ts": float(i), "node": "n1", "job_id": "7", "gpu": i % 8,
                         "util_pct": 50.0}) for i in range(5000)]  # fmt: skip
    with History(db) as history:
        assert history.write(Batch(inserts=rows))


def test_a_database_malformed_at_write_is_moved_aside_and_the_batch_kept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "history.db"
    _filled(db)
    size = db.stat().st_size
    with open(db, "r+b") as fh:  # the schema pages (first) survive, the last samples do not
        fh.seek(size // 2)
        fh.write(b"\xff" * (size - size // 2))
    history = History(db)
    history.connection()  # it opens: the damage shows only when a write touches it
    assert _moved(tmp_path) == []
    batch = run_batch("r1", 1.0)
    batch.inserts.append(("samples", {"ts": 1.0, "node": "n1", "job_id": "8", "gpu": 0}))
    with caplog.at_level(logging.ERROR, logger="slurmhealth.history"):
        assert history.write(batch) is True  # the samples' last pages are damaged
    [moved] = _moved(tmp_path)
    assert "malformed" in caplog.text and str(moved) in caplog.text
    assert [r["run_id"] for r in runs(history)] == ["r1"]
    assert history.kv_get(CORRUPT_KEY) == 1


def test_each_corruption_keeps_its_own_copy(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    db.write_bytes(b"x" * 4096)
    with History(db) as history:
        history.write(run_batch("r1", 1.0))
    wal = Path(f"{db}-wal")
    for path in (db, wal, Path(f"{db}-shm")):  # what a crash with a bad disk leaves
        if path.exists():
            path.write_bytes(b"y" * 8192)
    with History(db) as history:
        assert history.write(run_batch("r2", 2.0))
        assert history.kv_get(CORRUPT_KEY) == 1  # a fresh file: it cannot know the old count
    assert len(_moved(tmp_path)) == 2


def test_a_locked_database_is_not_corrupt(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    History(db).write(run_batch("r0", 0.5))
    locker = sqlite3.connect(db, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        assert History(db, busy_timeout_ms=100).write(run_batch("r1", 1.0)) is False
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert _moved(tmp_path) == []
    assert (tmp_path / "history.db.spool.jsonl").exists()


@pytest.mark.parametrize(
    ("code", "text", "corrupt"),
    [
        (sqlite3.SQLITE_CORRUPT, "database disk image is malformed", True),
        (sqlite3.SQLITE_NOTADB, "file is not a database", True),
        (sqlite3.SQLITE_BUSY, "database is locked", False),
        (sqlite3.SQLITE_LOCKED, "database table is locked", False),
        (sqlite3.SQLITE_FULL, "database or disk is full", False),
        (sqlite3.SQLITE_IOERR, "disk I/O error", False),
        (sqlite3.SQLITE_CANTOPEN, "unable to open database file", False),
    ],
)
def test_only_sqlites_corruption_codes_count_as_corrupt(
    code: int, text: str, corrupt: bool
) -> None:
    exc = sqlite3.DatabaseError(text)
    exc.sqlite_errorcode = code
    assert is_corrupt(exc) is corrupt
    assert is_corrupt(OSError(28, "No space left on device")) is False
