"""Upgrade and rollback: a database newer than this release is refused, never written; an
older one is backed up before it is migrated."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from slurmhealth.errors import SchemaTooNew
from slurmhealth.history import History
from slurmhealth.history.read import Reader, runs
from slurmhealth.history.schema import latest_version
from tests.unit.history.helpers import query, run_batch


def _db_at(path: Path, version: int) -> Path:
    """A history with one run, its ``user_version`` set to ``version`` (999: a future
    release's; 1: before migration 2, whose steps are idempotent)."""
    with History(path) as history:
        assert history.write(run_batch("before", 1.0))
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("DELETE FROM schema_migrations WHERE version > ?", (version,))
        conn.execute(f"PRAGMA user_version = {version}")
    conn.close()
    return path


def test_newer_database_is_refused_naming_both_versions(tmp_path: Path) -> None:
    db = _db_at(tmp_path / "history.db", 999)
    with History(db) as history, pytest.raises(SchemaTooNew) as refused:
        history.refuse_newer()
    message = str(refused.value)
    assert "\n" not in message
    assert "schema version 999" in message and f"({latest_version()})" in message
    assert str(db) in message and refused.value.exit_code == 2


def test_newer_database_is_never_written_the_batch_is_spooled(tmp_path: Path) -> None:
    db = _db_at(tmp_path / "history.db", 999)
    spool = tmp_path / "spool.jsonl"
    with History(db, spool_path=spool) as history:
        assert history.write(run_batch("after", 2.0)) is False
    assert query(db, "SELECT run_id FROM check_runs") == [("before",)]
    assert query(db, "PRAGMA user_version") == [(999,)]
    assert "after" in spool.read_text()  # the newer release ingests it
    assert not list(tmp_path.glob("history.db.bak-*"))


def test_reader_refuses_a_newer_database(tmp_path: Path) -> None:
    db = _db_at(tmp_path / "history.db", 999)
    with Reader(db) as reader, pytest.raises(SchemaTooNew):
        runs(reader)


def test_older_database_is_backed_up_before_migrating(tmp_path: Path) -> None:
    db = _db_at(tmp_path / "history.db", 1)
    with History(db) as history:
        assert history.write(run_batch("after", 2.0))
    assert query(db, "PRAGMA user_version") == [(latest_version(),)]
    backup = tmp_path / "history.db.bak-v1"
    assert query(backup, "PRAGMA user_version") == [(1,)]
    assert query(backup, "SELECT run_id FROM check_runs") == [("before",)]
    assert query(backup, "PRAGMA journal_mode") == [("delete",)]  # one file to copy back
    mode = stat.S_IMODE(backup.stat().st_mode)
    assert mode == stat.S_IMODE(db.stat().st_mode) == 0o640
    assert backup.stat().st_uid == db.stat().st_uid == os.geteuid()
    with History(db) as again:  # migrated once: no second backup
        backup.unlink()
        assert again.write(run_batch("later", 3.0))
    assert not backup.exists()


def test_backup_that_cannot_be_made_stops_the_migration(tmp_path: Path) -> None:
    db = _db_at(tmp_path / "history.db", 1)
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / "history.db.bak-v1").symlink_to(tmp_path / "elsewhere")
    with History(db, spool_path=tmp_path / "spool.jsonl") as history:
        assert history.write(run_batch("after", 2.0)) is False
    assert query(db, "PRAGMA user_version") == [(1,)]
    assert (tmp_path / "elsewhere").read_text() == ""
    assert "after" in (tmp_path / "spool.jsonl").read_text()
