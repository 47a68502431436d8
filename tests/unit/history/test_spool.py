"""The spool: what the database refused is kept and ingested later; nothing is lost."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from slurmhealth.history import History
from slurmhealth.history.read import runs
from tests.unit.history.helpers import query, run_batch, spooled_run_ids, start_writers


def test_concurrent_spooling_and_ingesting_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    spool = tmp_path / "spool.jsonl"
    (tmp_path / "broken").write_text("")  # the writers' db cannot be opened, so they spool
    broken = tmp_path / "broken" / "history.db"
    procs = start_writers(broken, ["a", "b"], 300, spool)
    history = History(tmp_path / "history.db", spool_path=spool)
    ingested = 0
    while any(p.poll() is None for p in procs):
        ingested += history.ingest_spool()
    assert [p.communicate(timeout=60)[0].strip() for p in procs] == ["0", "0"]
    ingested += history.ingest_spool()
    assert ingested == 600
    assert query(
        tmp_path / "history.db", "SELECT count(DISTINCT run_id), count(*) FROM check_runs"
    ) == [(600, 600)]
    assert not spool.exists() and not (tmp_path / "spool.jsonl.rejected").exists()


def test_unwritable_db_spools_then_next_write_ingests(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a regular file where the db directory should be")
    db, spool = blocker / "history.db", tmp_path / "spool.jsonl"
    assert History(db, spool_path=spool).write(run_batch("r1", 1.0)) is False
    assert spooled_run_ids(spool) == ["r1"]

    blocker.unlink()
    blocker.mkdir()
    history = History(db, spool_path=spool)
    assert history.write(run_batch("r2", 2.0))
    assert [r["run_id"] for r in runs(history)] == ["r2", "r1"]
    assert all(len(r["findings"]) == 1 for r in runs(history))
    assert not spool.exists()


def test_unwritable_spool_loses_the_record_loudly_and_never_uses_a_temp_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    blocker = tmp_path / "state"
    blocker.write_text("")
    db = blocker / "history.db"  # the default spool next to it cannot be written either
    with caplog.at_level(logging.WARNING, logger="slurmhealth.history"):
        assert History(db).write(run_batch("r1", 1.0)) is False
    [record] = caplog.records
    assert record.levelno == logging.ERROR and "lost" in record.getMessage()
    assert list(shared_tmp.iterdir()) == []
    planted = shared_tmp / f"slurmhealth-spool-{os.getuid()}.jsonl"
    planted.write_text(run_batch("forged", 1.0).to_json() + "\n")  # what a user could leave
    blocker.unlink()
    history = History(db)
    assert history.write(run_batch("r2", 2.0))
    assert [r["run_id"] for r in runs(history)] == ["r2"]


def test_locked_db_spools_and_next_write_ingests(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db, spool = tmp_path / "history.db", tmp_path / "history.db.spool.jsonl"
    History(db).write(run_batch("r0", 0.5))
    locker = sqlite3.connect(db, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        with caplog.at_level(logging.WARNING, logger="slurmhealth.history"):
            history = History(db, busy_timeout_ms=200)
            assert history.write(run_batch("r1", 1.0)) is False
            assert spooled_run_ids(spool) == ["r1"]
            # the failed attempt to ingest r1 puts it back before r1b is spooled
            assert history.write(run_batch("r1b", 1.5)) is False
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.WARNING]
    assert str(db) in caplog.records[0].getMessage()
    assert "locked" in caplog.records[0].getMessage()
    assert spooled_run_ids(spool) == ["r1", "r1b"]

    history = History(db, busy_timeout_ms=200)
    assert history.write(run_batch("r2", 2.0))
    assert [r["run_id"] for r in runs(history)] == ["r2", "r1b", "r1", "r0"]
    assert not spool.exists()


def test_invalid_spool_lines_are_skipped_and_kept(tmp_path: Path) -> None:
    db, spool = tmp_path / "history.db", tmp_path / "history.db.spool.jsonl"
    good = [run_batch(f"r{i}", float(i)).to_json() for i in (1, 2)]
    bad = ['{"inserts": [["check_runs", {"run_id": "trunc', '{"inserts": [["nope", {}]]}']
    spool.write_text("\n".join([good[0], bad[0], bad[1], good[1]]) + "\n")
    history = History(db)
    assert history.ingest_spool() == 2
    assert sorted(r["run_id"] for r in runs(history)) == ["r1", "r2"]
    assert not spool.exists()
    assert (tmp_path / "history.db.spool.jsonl.rejected").read_text().splitlines() == bad


def test_spooled_batch_the_db_refuses_is_kept_aside(tmp_path: Path) -> None:
    db, spool = tmp_path / "history.db", tmp_path / "history.db.spool.jsonl"
    history = History(db)
    assert history.write(run_batch("dup", 1.0))
    spool.write_text(run_batch("dup", 1.0).to_json() + "\n" + run_batch("r2", 2.0).to_json() + "\n")
    assert history.ingest_spool() == 1
    assert sorted(r["run_id"] for r in runs(history)) == ["dup", "r2"]
    assert query(db, "SELECT count(*) FROM findings") == [(2,)]  # refused batch fully undone
    assert spooled_run_ids(tmp_path / "history.db.spool.jsonl.rejected") == ["dup"]


def test_leftover_ingesting_file_of_dead_process_is_picked_up(tmp_path: Path) -> None:
    db, spool = tmp_path / "history.db", tmp_path / "history.db.spool.jsonl"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f"{spool.name}.ingesting.{dead.pid}").write_text(run_batch("r1", 1.0).to_json())
    alive = tmp_path / f"{spool.name}.ingesting.1"  # pid 1 is alive: its owner is still busy
    alive.write_text(run_batch("r2", 2.0).to_json() + "\n")
    history = History(db)
    assert history.write(run_batch("r3", 3.0))
    assert sorted(r["run_id"] for r in runs(history)) == ["r1", "r3"]
    assert sorted(p.name for p in tmp_path.iterdir() if "ingesting" in p.name) == [alive.name]


def test_the_spool_stops_at_its_bound_and_counts_what_it_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db, spool = tmp_path / "history.db", tmp_path / "history.db.spool.jsonl"
    History(db).write(run_batch("r0", 0.5))
    line = len(run_batch("r1", 1.0).to_json()) + 1
    locker = sqlite3.connect(db, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        history = History(db, busy_timeout_ms=20, spool_max_bytes=3 * line + 10)
        with caplog.at_level(logging.ERROR, logger="slurmhealth.history"):
            results = [history.write(run_batch(f"r{i}", float(i))) for i in range(1, 6)]
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert results == [False] * 5
    assert spooled_run_ids(spool) == ["r1", "r2", "r3"]  # r4, r5: over the bound
    dropped = [r.getMessage() for r in caplog.records]
    assert len(dropped) == 2 and all("batch dropped" in m and str(spool) in m for m in dropped)
    with History(db) as history:
        assert history.write(run_batch("r6", 6.0))
        assert history.kv_get("spool_dropped_total") == 2
    assert sorted(r for (r,) in query(db, "SELECT run_id FROM check_runs")) == [
        "r0", "r1", "r2", "r3", "r6"]  # fmt: skip
    assert query(db, "SELECT kind FROM events") == [("spool_dropped",)]
    assert not spool.exists() and not Path(f"{spool}.dropped").exists()


def test_full_disk_keeps_the_record_in_the_run_dir_spool_until_the_db_takes_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The database's disk cannot take the batch nor the spool beside it (here: the folder is
    a file; on a node: ENOSPC on /var/lib): the batch goes to the fallback spool on the run
    dir's filesystem, and the first write that reaches the database ingests it."""
    blocker, run_dir = tmp_path / "state", tmp_path / "run"
    blocker.write_text("a regular file where the db directory should be")
    run_dir.mkdir(mode=0o700)
    db, fallback = blocker / "history.db", str(run_dir / "history.spool.jsonl")
    history = History(db, fallback_spool_path=fallback)
    assert history.write(run_batch("r1", 1.0)) is False  # the database was not written
    assert spooled_run_ids(Path(fallback)) == ["r1"]
    assert "batch kept in" in caplog.text and "record lost" not in caplog.text
    assert history.buffer(run_batch("b1", 1.5))  # a sidecar's crash-safe buffer too
    assert (run_dir / f"history.spool.jsonl.buffer.{os.getpid()}").exists()

    blocker.unlink()
    blocker.mkdir()
    later = History(db, fallback_spool_path=fallback)
    assert later.write(run_batch("r2", 2.0))
    assert [r["run_id"] for r in runs(later)] == ["r2", "b1", "r1"]
    assert sorted(os.listdir(run_dir)) == []


def test_no_fallback_in_the_spools_own_folder(tmp_path: Path) -> None:
    history = History(tmp_path / "history.db", fallback_spool_path=str(tmp_path / "x.jsonl"))
    assert history.fallback is None
