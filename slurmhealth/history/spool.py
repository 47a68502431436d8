"""The spool: batches the database refused, as JSON lines, ingested by the next write.

Appends are one ``O_APPEND`` write (and fsync) each under a shared lock; an ingester claims
a spool by renaming it to ``<spool>.ingesting.<pid>`` (atomic, so no two processes share a
file), takes the exclusive lock to wait for appends that began before the rename, and
writes every batch in one transaction. A process may also keep its own crash-safe buffer,
``<spool>.buffer.<pid>`` (the sidecar: one append per interval); the buffers and claims of
dead processes are ingested by the next one. Lines that are not batches, and batches the
database refuses, are kept in ``<spool>.rejected``.

Bounded and private (``history.files``): the spool stops at ``max_bytes`` (a batch beyond
is dropped with an error naming the file, and counted in ``<spool>.dropped``, one byte per
batch, then in the ``kv`` row ``spool_dropped_total``); every file is opened without
following symlinks and must be ours; a folder others may write is never ingested from.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from slurmhealth.history.batch import Batch, apply, immediate
from slurmhealth.history.files import UnsafeFile, check_dir, open_private

log = logging.getLogger("slurmhealth.history")
_INGEST_LOCK = threading.Lock()
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DROPPED_KEY = "spool_dropped_total"
_MAX_DROP_MARKS = 1024 * 1024  # the drop counter file itself stays small


class SpoolFull(OSError):
    """The spool reached its size bound; the batch was not kept."""


class Spool(NamedTuple):  # a tuple: cheaper to define than a frozen dataclass
    """The spool at ``path``: files created with group ``gid``, at most ``max_bytes``
    (0: unbounded)."""

    path: str
    gid: int = -1
    max_bytes: int = DEFAULT_MAX_BYTES

    @property
    def folder(self) -> str:
        return os.path.dirname(self.path) or "."

    def buffer_path(self, pid: int) -> str:
        return f"{self.path}.buffer.{pid}"

    def append(self, data: bytes, path: str | None = None, bounded: bool = True) -> None:
        """Append ``data`` to ``path`` (default: the spool) with one O_APPEND write and
        fsync; reopen if an ingester took the file. Raises :class:`SpoolFull`,
        :class:`~slurmhealth.history.files.UnsafeFile` or another ``OSError``."""
        path = path or self.path
        check_dir(self.folder)
        for _ in range(10):
            fd = open_private(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, self.gid)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                with contextlib.suppress(FileNotFoundError):  # else renamed since our open
                    if os.path.samestat(os.fstat(fd), os.stat(path)):
                        self._write(fd, path, data, bounded)
                        return
            finally:
                os.close(fd)
        raise OSError(errno.EAGAIN, f"{path} kept being moved")

    def _write(self, fd: int, path: str, data: bytes, bounded: bool) -> None:
        size = os.fstat(fd).st_size
        if bounded and self.max_bytes and size + len(data) > self.max_bytes:
            raise SpoolFull(errno.EFBIG, f"{path}: spool full ({size} of {self.max_bytes} bytes)")
        if os.write(fd, data) != len(data):
            raise OSError(errno.ENOSPC, f"short write to {path}")
        os.fsync(fd)

    def count_drop(self) -> None:
        """One more batch dropped at the bound (counted into the database by the next ingest)."""
        marks = f"{self.path}.dropped"
        with contextlib.suppress(OSError):
            fd = open_private(marks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, self.gid)
            try:
                if os.fstat(fd).st_size < _MAX_DROP_MARKS:
                    os.write(fd, b"x")
            finally:
                os.close(fd)

    def ingest(
        self, conn: sqlite3.Connection, db_path: str, counted: Callable[[int], None],
        own: str | None = None,
    ) -> None:  # fmt: skip
        """Ingest the spool, ``own`` buffer and the claims and buffers of dead processes
        into ``conn``; ``counted(n)`` hears of each file's batches once in the database.
        A folder or file that cannot be trusted is refused, loudly, and left alone."""
        with _INGEST_LOCK:
            try:
                check_dir(self.folder)
                names = os.listdir(self.folder)
            except UnsafeFile as exc:
                log.error("history %s: spool not ingested: %s", db_path, exc)
                return
            except OSError:
                return
            mine = f"{self.path}.ingesting.{os.getpid()}"
            sources = [mine, *self._leftovers(names), *([own] if own else []), self.path]
            for src in dict.fromkeys(sources):
                counted(_ingest_file(conn, self, src, mine, db_path))
            _ingest_drops(conn, self, db_path)

    def _leftovers(self, names: list[str]) -> list[str]:
        """Claims and buffers of processes that are gone."""
        base = os.path.basename(self.path)
        out = []
        for name in sorted(names):
            for kind in (".ingesting.", ".buffer."):
                pid = name[len(base + kind):] if name.startswith(base + kind) else ""  # fmt: skip
                if pid.isdigit() and len(pid) < 10 and not _pid_alive(int(pid)):
                    out.append(os.path.join(self.folder, name))
        return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _trusted(path: str, db_path: str) -> bool:
    """Whether ``path`` exists and is a regular file of ours that only we may write;
    anything else is reported (once per run) and never ingested."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    problem = "" if stat.S_ISREG(st.st_mode) else "not a regular file"
    if not problem and (st.st_uid != os.geteuid() or st.st_mode & 0o022):
        problem = f"owned by uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}"
    if problem:
        log.error("history %s: spool file %s ignored, never ingested: %s", db_path, path, problem)
    return not problem


def _claim(src: str, mine: str, db_path: str) -> bytes | None:
    """Rename ``src`` to ``mine`` and read it once no append is in flight; None if gone."""
    if not _trusted(src, db_path):
        return None
    try:
        if src != mine:
            os.rename(src, mine)
        fd = open_private(mine, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except UnsafeFile as exc:  # swapped between the check and the rename
        log.error("history %s: spool file ignored, never ingested: %s", db_path, exc)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # wait for appends that started before the rename
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read()
    finally:
        os.close(fd)


def _keep_rejected(spool: Spool, lines: list[bytes], db_path: str, why: str) -> None:
    rejected = f"{spool.path}.rejected"
    try:
        spool.append(b"".join(lines), rejected)
        log.warning("history %s: %d %s spool line(s) kept in %s", db_path, len(lines), why,
                    rejected)  # fmt: skip
    except OSError as exc:
        log.error("history %s: %d %s spool line(s) lost (%s)", db_path, len(lines), why, exc)


def _parse(data: bytes) -> tuple[list[tuple[bytes, Batch]], list[bytes]]:
    good: list[tuple[bytes, Batch]] = []
    bad: list[bytes] = []
    for line in data.splitlines():
        if line.strip():
            try:
                good.append((line + b"\n", Batch.from_json(line.decode())))
            except (ValueError, UnicodeDecodeError):
                bad.append(line + b"\n")
    return good, bad


def _ingest_file(conn: sqlite3.Connection, spool: Spool, src: str, mine: str, db_path: str) -> int:
    data = _claim(src, mine, db_path)
    if data is None:
        return 0
    good, bad = _parse(data)
    if bad:
        _keep_rejected(spool, bad, db_path, "invalid")
    refused: list[bytes] = []
    try:
        now = time.time()
        with immediate(conn):
            for line, batch in good:
                conn.execute("SAVEPOINT batch")
                try:
                    apply(conn, batch, now)
                except (sqlite3.IntegrityError, sqlite3.InterfaceError):
                    conn.execute("ROLLBACK TO batch")
                    refused.append(line)
                conn.execute("RELEASE batch")
    except BaseException:
        if good:
            try:  # put back: nothing lost
                spool.append(b"".join(line for line, _ in good))
            except OSError as exc:  # the claim stays, for the next ingest: nothing lost
                log.warning("history %s: %s kept (spool: %s)", db_path, mine, exc)
                raise
        os.unlink(mine)
        raise
    os.unlink(mine)
    if refused:
        _keep_rejected(spool, refused, db_path, "refused")
    return len(good) - len(refused)


def _ingest_drops(conn: sqlite3.Connection, spool: Spool, db_path: str) -> None:
    """Batches dropped at the bound since the last ingest, added to ``spool_dropped_total``
    (the count a metric can export) and recorded as one ``spool_dropped`` event."""
    marks = f"{spool.path}.dropped"
    claimed = f"{marks}.{os.getpid()}"
    if not _trusted(marks, db_path):
        return
    os.rename(marks, claimed)
    n = os.path.getsize(claimed)
    try:
        with immediate(conn):
            row = conn.execute("SELECT value FROM kv WHERE key = ?", (DROPPED_KEY,)).fetchone()
            total = n + (int(row[0]) if row and str(row[0]).isdigit() else 0)
            batch = Batch(kv={DROPPED_KEY: total})
            batch.inserts.append(("events", {
                "ts": time.time(), "kind": "spool_dropped", "severity": "warn",
                "message": f"{n} batch(es) dropped: spool {spool.path} was full"}))  # fmt: skip
            apply(conn, batch, time.time())
    except BaseException:
        with contextlib.suppress(OSError):  # put the count back for the next ingest
            spool.append(b"x" * n, marks, bounded=False)
        raise
    finally:
        os.unlink(claimed)
