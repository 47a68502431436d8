"""The history's files are private to root and the admin group, and a job's user cannot
plant, redirect or read them: the spool/symlink attack of issue 11, run as a real
unprivileged user."""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmhealth.history import Batch, History, hold_open
from slurmhealth.history.read import drain_rows, job_row
from tests.support.skips import root_only
from tests.unit.history.helpers import query, run_batch

ADMIN_GID = 12345  # no group of that name needed: root may chown to any gid
DEAD_PID = 4194303  # above the default pid_max: never a live process
root_only = root_only("needs root (chown, runuser)")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@root_only
def test_new_history_files_are_root_admin_and_not_world_readable(tmp_path: Path) -> None:
    folder = tmp_path / "lib" / "slurmhealth"
    db = folder / "history.db"
    history = History(db, admin_group=str(ADMIN_GID))
    assert history.write(run_batch("r1", 1.0))
    locker = sqlite3.connect(db, isolation_level=None)  # the db locked: the batch is spooled
    locker.execute("BEGIN EXCLUSIVE")
    try:
        History(db, admin_group=str(ADMIN_GID), busy_timeout_ms=50).write(run_batch("r2", 2.0))
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    files = [db, Path(f"{db}-wal"), Path(f"{db}-shm"), folder / "history.db.spool.jsonl"]
    assert [(_mode(p), p.stat().st_uid, p.stat().st_gid) for p in files] == [
        (0o640, 0, ADMIN_GID)
    ] * 4
    assert (_mode(folder), folder.stat().st_gid) == (0o750, ADMIN_GID)
    history.close()


def test_an_old_world_readable_db_is_made_private(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    History(db).write(run_batch("r1", 1.0))
    db.chmod(0o644)
    with History(db) as history:
        assert history.write(run_batch("r2", 2.0))
    assert _mode(db) == 0o640


def _as(user: str, script: str) -> None:
    subprocess.run(["runuser", "-u", user, "--", "/bin/sh", "-ec", script], check=True, cwd="/")


FORGED = Batch(
    inserts=[("drains", {"ts": 1.0, "node": "n1", "state": "drained", "reason": "forged",
                         "actor": "slurmhealth"})],
    upserts=[("jobs", {"job_id": "42", "user": "mallory", "uid": 1001}, "job_id")],
).to_json()  # fmt: skip


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A world-writable sticky folder like /tmp, which a job's user can reach."""
    folder = Path(tempfile.mkdtemp(prefix="slurmhealth-test-"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder)


def _secret(tmp_path: Path) -> Path:
    secret = tmp_path / "root-only"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    return secret


def _forged_nothing(history: History) -> None:
    assert drain_rows(history) == []
    assert job_row(history, "42") is None


def test_a_spool_planted_by_a_user_in_a_shared_folder_is_never_ingested_nor_followed(
    tmp_path: Path, shared_tmp: Path, user: str, caplog: pytest.LogCaptureFixture
) -> None:
    secret = _secret(tmp_path)
    spool = shared_tmp / "slurmhealth-spool-0.jsonl"
    _as(user, f"""
        printf '%s\\n' '{FORGED}' > {spool}
        printf '%s\\n' '{FORGED}' > {spool}.buffer.{DEAD_PID}
        ln -s {secret} {spool}.rejected
        ln -s {secret} {spool}.ingesting.{DEAD_PID}
        printf 'not json\\n' > {spool}.ingesting.{DEAD_PID + 1}
    """)  # fmt: skip
    planted = sorted((p.name, p.lstat().st_mode, p.lstat().st_size) for p in shared_tmp.iterdir())
    history = History(tmp_path / "history.db", spool_path=spool)
    with caplog.at_level(logging.WARNING, logger="slurmhealth.history"):
        assert history.write(run_batch("r1", 1.0))  # the db is fine: only the spool is refused
        assert history.ingest_spool() == 0
    _forged_nothing(history)
    assert secret.read_text() == "root only\n" and _mode(secret) == 0o600
    assert sorted((p.name, p.lstat().st_mode, p.lstat().st_size)
                  for p in shared_tmp.iterdir()) == planted  # fmt: skip
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and all(str(shared_tmp) in e and "refused" in e for e in errors)

    locker = sqlite3.connect(tmp_path / "history.db", isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")  # now root must spool: never into the user's file
    try:
        assert (
            History(tmp_path / "history.db", spool_path=spool, busy_timeout_ms=50).write(
                run_batch("r2", 2.0)
            )
            is False
        )
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert spool.read_text() == FORGED + "\n"
    history.close()


@root_only
def test_a_foreign_or_symlinked_spool_in_roots_folder_is_ignored_loudly(
    tmp_path: Path, user: str, caplog: pytest.LogCaptureFixture
) -> None:
    secret = _secret(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    spool = state / "history.db.spool.jsonl"
    spool.write_text(FORGED + "\n")  # left by someone else: a restore, a wrong chown
    os.chown(spool, pwd.getpwnam(user).pw_uid, -1)
    (state / f"history.db.spool.jsonl.buffer.{DEAD_PID}").symlink_to(secret)
    fifo = state / f"history.db.spool.jsonl.ingesting.{DEAD_PID}"
    os.mkfifo(fifo)
    (state / "history.db.spool.jsonl.rejected").symlink_to(secret)
    history = History(state / "history.db")
    with caplog.at_level(logging.WARNING, logger="slurmhealth.history"):
        assert history.write(run_batch("r1", 1.0))
    _forged_nothing(history)
    assert secret.read_text() == "root only\n"
    errors = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    for planted in (spool, fifo, state / f"history.db.spool.jsonl.buffer.{DEAD_PID}"):
        assert f"{planted} ignored, never ingested" in errors
    assert spool.read_text() == FORGED + "\n" and stat.S_ISFIFO(fifo.lstat().st_mode)
    assert query(state / "history.db", "SELECT count(*) FROM check_runs") == [(1,)]
    history.close()


def test_invalid_lines_are_never_appended_through_a_symlinked_rejected_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = _secret(tmp_path)
    spool = tmp_path / "history.db.spool.jsonl"
    spool.write_text("not a batch\n")
    spool.chmod(0o640)
    Path(f"{spool}.rejected").symlink_to(secret)
    history = History(tmp_path / "history.db")
    with caplog.at_level(logging.ERROR, logger="slurmhealth.history"):
        assert history.ingest_spool() == 0
    history.close()
    assert secret.read_text() == "root only\n"
    assert f"{spool}.rejected: a symlink; refused" in caplog.text


# SQLite's "DMS" byte of the -shm (unix VFS: 120 + SQLITE_SHM_NLOCK): every process with
# the history open holds it shared; one that gets it exclusive takes itself for the first
# user and truncates the -shm under the others' mappings
_DMS_PROBE = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 128)
except OSError:
    sys.exit(0)
sys.exit(1)
"""


def _shm_in_use(db: Path) -> bool:
    """Whether another process holds SQLite's shared lock on ``db``'s -shm."""
    probe = subprocess.run([sys.executable, "-c", _DMS_PROBE, f"{db}-shm"], check=False)
    return probe.returncode == 0


def test_a_second_history_in_one_process_leaves_the_first_ones_locks(tmp_path: Path) -> None:
    """The node agent holds the history open while its hooks open and close it: checking
    the files must not close a descriptor of them, which drops every POSIX lock the
    process holds there (seen: the next hook process truncated the -shm, SIGBUS)."""
    db = tmp_path / "history.db"
    History(db).write(run_batch("r1", 1.0))
    held = hold_open(str(db))
    assert held is not None
    try:
        assert _shm_in_use(db)
        db.chmod(0o644)  # something to fix, as an older version left it
        with History(db) as again:
            assert again.write(run_batch("r2", 2.0))
        assert _mode(db) == 0o640
        assert _shm_in_use(db), "the held connection lost its lock on the -shm"
        assert held.execute("select count(*) from check_runs").fetchone() == (2,)
    finally:
        held.close()


def test_the_history_refuses_a_symlinked_or_fifo_wal(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    History(db).write(run_batch("r1", 1.0))
    for suffix, plant in (("-wal", lambda p: p.symlink_to(tmp_path / "elsewhere")),
                          ("-shm", os.mkfifo)):  # fmt: skip
        for leftover in tmp_path.glob("history.db-*"):
            leftover.unlink()
        plant(Path(f"{db}{suffix}"))
        with pytest.raises(OSError, match="refused"):
            History(db).connection()
