"""The spool: batches the database refused, as JSON lines, ingested by the next write.

Appends are one ``O_APPEND`` write each under a shared lock; an ingester claims a spool by
renaming it to ``<spool>.ingesting.<pid>`` (atomic, so no two processes share a file), takes
the exclusive lock to wait for appends that began before the rename, and writes every batch
in one transaction. Lines that are not batches, and batches the database refuses, are kept
in ``<spool>.rejected``; nothing is lost.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable

from slurmhealth.history.batch import Batch, apply, immediate

log = logging.getLogger("slurmhealth.history")
_INGEST_LOCK = threading.Lock()


def append(path: str, data: bytes) -> None:
    """Append ``data`` with one O_APPEND write and fsync; reopen if an ingester took the file."""
    for _ in range(10):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            with contextlib.suppress(FileNotFoundError):  # else renamed since our open: retry
                if os.path.samestat(os.fstat(fd), os.stat(path)):
                    if os.write(fd, data) != len(data):
                        raise OSError(errno.ENOSPC, f"short write to {path}")
                    os.fsync(fd)
                    return
        finally:
            os.close(fd)
    raise OSError(errno.EAGAIN, f"{path} kept being moved")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def ingest_all(
    conn: sqlite3.Connection, spools: tuple[str, ...], db_path: str, counted: Callable[[int], None]
) -> None:
    """Ingest every spool in ``spools`` (and leftovers of dead ingesters) into ``conn``;
    ``counted(n)`` hears of each file's batches once they are in the database."""
    with _INGEST_LOCK:
        for spool in dict.fromkeys(spools):
            folder = os.path.dirname(spool) or "."
            mine = f"{spool}.ingesting.{os.getpid()}"
            prefix = f"{os.path.basename(spool)}.ingesting."
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            stale = []
            for name in names:
                pid = name[len(prefix):]  # fmt: skip
                if name.startswith(prefix) and pid.isdigit() and not _pid_alive(int(pid)):
                    stale.append(os.path.join(folder, name))
            for src in [mine, *stale, spool]:
                counted(_ingest_file(conn, src, spool, mine, db_path))


def _claim(src: str, mine: str) -> bytes | None:
    """Rename ``src`` to ``mine`` and read it once no append is in flight; None if gone."""
    try:
        if src != mine:
            os.rename(src, mine)
        fd = os.open(mine, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # wait for appends that started before the rename
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read()
    finally:
        os.close(fd)


def _ingest_file(conn: sqlite3.Connection, src: str, spool: str, mine: str, db_path: str) -> int:
    data = _claim(src, mine)
    if data is None:
        return 0
    good: list[tuple[bytes, Batch]] = []
    bad: list[bytes] = []
    for line in data.splitlines():
        if line.strip():
            try:
                good.append((line + b"\n", Batch.from_json(line.decode())))
            except (ValueError, UnicodeDecodeError):
                bad.append(line + b"\n")
    rejected = f"{spool}.rejected"
    if bad:
        append(rejected, b"".join(bad))
        log.warning("history %s: %d invalid spool line(s) kept in %s", db_path,
                    len(bad), rejected)  # fmt: skip
    try:
        now, refused = time.time(), list[tuple[bytes, sqlite3.Error]]()
        with immediate(conn):
            for line, batch in good:
                conn.execute("SAVEPOINT batch")
                try:
                    apply(conn, batch, now)
                except (sqlite3.IntegrityError, sqlite3.InterfaceError) as why:
                    conn.execute("ROLLBACK TO batch")
                    refused.append((line, why))
                conn.execute("RELEASE batch")
    except BaseException:
        if good:
            append(spool, b"".join(line for line, _ in good))  # put back: nothing lost
        os.unlink(mine)
        raise
    os.unlink(mine)
    for line, err in refused:
        log.warning("history %s: spooled batch refused (%s), kept in %s", db_path,
                    err, rejected)  # fmt: skip
        try:
            append(rejected, line)
        except OSError:
            log.error("history %s: refused batch lost: %r", db_path, line)
    return len(good) - len(refused)
