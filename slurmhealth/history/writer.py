"""The node's history database, written: sqlite in WAL mode plus a spool (DESIGN.md 5).

Writes never raise on database trouble: a batch that cannot be written is appended to a
JSON-lines spool and ingested by the next successful write. Timestamps are UTC unix seconds.
Plain ``sqlite3``: ``sqlite_utils`` (150 ms to import) only migrates a stale database.

The files are private to root and the admin group (``history.files``). A database sqlite
calls corrupt ("file is not a database", "database disk image is malformed") when opened
or written is moved aside to ``<db>.corrupt-<UTC time>`` and a fresh one created; the
fresh one counts it in the ``kv`` row ``history_corrupt_total`` and a ``history_corrupt``
event. A locked, busy or full database is never taken for a corrupt one.

Schema versions: a database older than this release is copied to ``<db>.bak-v<old>`` (the
sqlite backup API, same owner and mode as the database) and then migrated; one newer than
this release (a rolled-back binary) is never written: :meth:`History.refuse_newer` raises
:class:`SchemaTooNew` for the commands that must refuse, and :meth:`History.write` spools
the batch for the newer release to ingest, so a hook still never fails on its history.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
import sqlite3
import time
from typing import TYPE_CHECKING, Any

from slurmhealth.errors import SchemaTooNew, StoreError
from slurmhealth.history.batch import Batch, apply, immediate
from slurmhealth.history.files import (
    admin_gid,
    folder_lock,
    move_aside,
    open_private,
    prepare_db,
)
from slurmhealth.history.schema import MIGRATIONS, check_version, latest_version
from slurmhealth.history.spool import DEFAULT_MAX_BYTES, Spool, SpoolFull

if TYPE_CHECKING:
    from slurmhealth.config import Config
    from slurmhealth.history.retention import PruneResult, Retention

log = logging.getLogger("slurmhealth.history")
CORRUPT_KEY = "history_corrupt_total"
_LEFT_OPEN: list[sqlite3.Connection] = []  # History.close_at_exit
_CORRUPT_CODES = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def is_corrupt(exc: BaseException) -> bool:
    """Whether sqlite said the file is not a database or is malformed (never "locked",
    "busy", "disk full" or "cannot open")."""
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _CORRUPT_CODES
    text = str(exc)
    return isinstance(exc, sqlite3.DatabaseError) and (
        "file is not a database" in text or "database disk image is malformed" in text
    )


class MigrationDeferred(sqlite3.OperationalError):
    """The database needs a migration that a hook leaves to the admin (see
    :attr:`History.defer_migrations`): what the hook would write is spooled meanwhile."""


class History:
    """The node's history database. ``busy_timeout_ms`` bounds waits on other writers;
    files are created with group ``admin_group``; the spool holds at most
    ``spool_max_bytes`` (0: unbounded)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        spool_path: str | os.PathLike[str] | None = None,
        busy_timeout_ms: int = 5000,
        admin_group: str = "",
        spool_max_bytes: int = DEFAULT_MAX_BYTES,
        fallback_spool_path: str | None = None,
    ) -> None:
        # plain str paths: pathlib costs the prolog ~7 ms of imports
        self.path = os.fspath(path)
        self.spool_path = os.fspath(spool_path) if spool_path else f"{self.path}.spool.jsonl"
        self.busy_timeout_ms = int(busy_timeout_ms)
        self._group = admin_group
        self._max_bytes = spool_max_bytes
        self._spool: Spool | None = None
        # on another filesystem (the node's run dir, a tmpfs): where a batch goes when the
        # database's disk is full or read-only and the spool beside it cannot be written
        self.fallback_spool_path = fallback_spool_path
        self._fallback: Spool | None = None
        self._conn: sqlite3.Connection | None = None
        self._inode = -1  # of the file our connection opened
        self._buffer: str | None = None  # this process's own crash-safe buffer, once used
        self._ingested = 0  # batches ingested from spools by this object, ever

    @classmethod
    def for_node(cls, cfg: Config, node: str | None = None, busy_timeout_ms: int = 5000) -> History:
        """The history of ``node`` as ``cfg`` places it (paths, admin group, spool bound)."""
        fallback = os.path.join(cfg.expand(cfg.paths.run_dir, node), "history.spool.jsonl")
        return cls(cfg.db_path(node), cfg.spool_path(node) or None, busy_timeout_ms,
                   cfg.evidence.admin_group, cfg.paths.spool_max_bytes, fallback)  # fmt: skip

    @property
    def spool(self) -> Spool:
        if self._spool is None:  # the group looked up once, only when a file is made
            self._spool = Spool(self.spool_path, admin_gid(self._group), self._max_bytes)
        return self._spool

    @property
    def fallback(self) -> Spool | None:
        """The spool of last resort, or None when there is none or it is the spool's folder."""
        fb = self.fallback_spool_path
        if not fb or os.path.dirname(fb) == self.spool.folder:
            return None
        if self._fallback is None:
            self._fallback = Spool(fb, self.spool.gid, self._max_bytes)
        return self._fallback

    # -- connection and schema ------------------------------------------------------------

    def connection(self) -> sqlite3.Connection:
        """The read-write connection, opened (created, migrated) on first use; a corrupt
        file is moved aside and a fresh one created."""
        if self._conn is not None:
            return self._conn
        try:
            self._conn = self._open()
        except sqlite3.DatabaseError as exc:
            if not is_corrupt(exc):
                raise
            self._recover(exc)
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    def _open(self) -> sqlite3.Connection:
        prepare_db(self.path, self.spool.gid)
        self._inode = os.stat(self.path).st_ino
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout_ms / 1000, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
            self._set_wal(conn)
            conn.execute("PRAGMA synchronous = NORMAL")
            version = _user_version(conn)
            check_version(self.path, version)
            if version < latest_version():
                self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _recover(self, exc: BaseException) -> None:
        """Move the corrupt file aside (unless another process already did), open a fresh
        one and count the event there."""
        self.close()
        with folder_lock(os.path.dirname(self.path) or "."):
            if os.stat(self.path).st_ino != self._inode:
                return  # replaced by another process since we opened it
            moved = move_aside(self.path)
        log.error("history %s is corrupt (%s): moved aside to %s, a fresh one is created",
                  self.path, exc, moved)  # fmt: skip
        conn = self._conn = self._open()
        with immediate(conn):
            row = conn.execute("SELECT value FROM kv WHERE key = ?", (CORRUPT_KEY,)).fetchone()
            batch = Batch(kv={CORRUPT_KEY: 1 + (int(row[0]) if row else 0)})
            batch.inserts.append(("events", {
                "ts": time.time(), "kind": "history_corrupt", "severity": "warn",
                "message": f"corrupt history moved aside to {moved}: {exc}"}))  # fmt: skip
            apply(conn, batch, time.time())

    def _set_wal(self, conn: sqlite3.Connection) -> None:
        # Switching a fresh file to WAL can fail with SQLITE_BUSY without waiting on the
        # busy handler when another process does the same, so wait here ourselves.
        deadline = time.monotonic() + self.busy_timeout_ms / 1000
        while True:
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                busy = exc.sqlite_errorcode & 0xFF == sqlite3.SQLITE_BUSY
                if not busy or time.monotonic() > deadline:
                    raise
            time.sleep(0.005)

    def refuse_newer(self) -> None:
        """Raise :class:`SchemaTooNew` when the database was written by a newer release.
        Any other trouble opening it is left to :meth:`write` (which spools)."""
        with contextlib.suppress(sqlite3.Error, OSError):
            self.connection()

    defer_migrations = False
    """Set by the hooks (prolog, epilog, sidecar, health check): an existing database is
    never backed up and migrated inside a hook, whose timeout would kill a long migration
    (and roll it back) at every job; its records are spooled until an admin command
    (``slurmhealth history prune``, any command that writes the history) migrates it."""

    def _migrate(self, conn: sqlite3.Connection) -> None:
        # one process at a time: the backup must be of the old version, not a half-migrated one
        with folder_lock(os.path.dirname(self.path) or "."):
            old = _user_version(conn)
            check_version(self.path, old)
            if old >= latest_version():
                return  # another process migrated it while we waited
            if old > 0 and self.defer_migrations:
                raise MigrationDeferred(
                    f"schema version {old} needs migrating to {latest_version()}: run "
                    f"`slurmhealth history prune --all` as root once (records are spooled)"
                )
            if old > 0:
                self._backup(conn, old)
            self._apply_migrations(conn)

    def _backup(self, conn: sqlite3.Connection, version: int) -> str:
        """Copy the database, before migrating it, to ``<db>.bak-v<version>`` (one file,
        private like the database); an error stops the migration."""
        target = f"{self.path}.bak-v{version}"
        os.close(open_private(target, os.O_RDWR | os.O_CREAT | os.O_TRUNC, self.spool.gid))
        dest = sqlite3.connect(target)
        try:
            conn.backup(dest)
            dest.execute("PRAGMA journal_mode = DELETE")  # a self-contained copy
        finally:
            dest.close()
        log.warning("history %s: schema version %d -> %d; the old one is kept in %s",
                    self.path, version, latest_version(), target)  # fmt: skip
        return target

    def _apply_migrations(self, conn: sqlite3.Connection) -> None:
        import sqlite_utils

        db = sqlite_utils.Database(conn, recursive_triggers=False, execute_plugins=False)
        for version in sorted(MIGRATIONS):
            name, fn = MIGRATIONS[version]
            with immediate(conn):
                if _user_version(conn) >= version:
                    continue  # another process got here first
                db.table("schema_migrations").create(
                    {"version": int, "name": str, "applied_at": float},
                    pk="version",
                    if_not_exists=True,
                )
                fn(db)
                conn.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                    (version, name, time.time()),
                )
                conn.execute(f"PRAGMA user_version = {int(version)}")

    close_at_exit = False
    """Set by a hook process that ends with ``os._exit`` (hooks.entry.end_process): its
    connections are left open to the process's end instead of closed, so the last one's
    checkpoint (SQLite's on close, with an fsync of the database) is not on the job's path.
    What was committed is in the WAL; the next checkpoint moves it."""

    def close(self) -> None:
        if self._conn is not None:
            if self.close_at_exit:
                _LEFT_OPEN.append(self._conn)  # not collected (that would close it)
            else:
                self._conn.close()
        self._conn = None

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writes -------------------------------------------------------------------------

    def write(self, batch: Batch) -> bool:
        """Write ``batch`` in one transaction; on database trouble spool it and return False.

        Raises ``ValueError`` only for a malformed batch (unknown table or column).
        """
        batch.validate()
        for attempt in (1, 2):
            try:
                conn = self.connection()
                self._ingest(conn)
                with immediate(conn):
                    apply(conn, batch, time.time())
                return True
            except SchemaTooNew as exc:
                log.error("%s", exc)  # kept for the newer release, which ingests the spool
                problem = "schema newer than this release"
                break
            except (sqlite3.Error, OSError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
                if attempt == 2 or not is_corrupt(exc):
                    break
                self._recover(exc)  # malformed at write: move aside, write to a fresh one
        self._spool_batch(batch, problem)
        return False

    def _spool_batch(self, batch: Batch, problem: str, path: str | None = None) -> bool:
        # no fallback in a shared temp dir: a job's user could plant or read it there
        path = path or self.spool_path
        try:
            self.spool.append((batch.to_json() + "\n").encode(), path)
        except SpoolFull as exc:
            self.spool.count_drop()
            log.error("history %s not written (%s); batch dropped: %s", self.path, problem, exc)
            return False
        except OSError as exc:
            if self.fallback is not None:
                return self._to_fallback(batch, f"{problem}; spool {path}: {exc}", path)
            log.error("history %s not written (%s; spool %s: %s); record lost", self.path,
                      problem, path, exc)  # fmt: skip
            return False
        if path == self.spool_path:
            log.warning("history %s not written (%s); batch spooled to %s", self.path, problem,
                        path)  # fmt: skip
        return True

    def _to_fallback(self, batch: Batch, problem: str, path: str) -> bool:
        """Append ``batch`` to the fallback spool (a buffer there for a buffer here);
        False, logged with every place tried, when that fails too."""
        fb = self.fallback
        if fb is None:
            return False
        target = fb.buffer_path(os.getpid()) if path != self.spool_path else fb.path
        try:
            fb.append((batch.to_json() + "\n").encode(), target)
        except OSError as exc:
            log.error("history %s not written (%s; fallback %s: %s); record lost", self.path,
                      problem, target, exc)  # fmt: skip
            return False
        log.warning("history %s not written (%s); batch kept in %s", self.path, problem, target)
        return True

    def buffer(self, batch: Batch) -> bool:
        """Append ``batch`` to this process's crash-safe buffer (one write and fsync; the
        next :meth:`write` or :meth:`ingest_spool` of any process moves it into the
        database); True when it is on disk. A process that is killed loses nothing
        buffered: its buffer is ingested by the next one."""
        batch.validate()
        self._buffer = self.spool.buffer_path(os.getpid())
        return self._spool_batch(batch, "buffered", self._buffer)

    def ingest_spool(self) -> int:
        """Ingest pending spool files (and our buffer) now; return how many batches went
        into the database. On database trouble they stay in the spool."""
        before = self._ingested
        for attempt in (1, 2):
            try:
                self._ingest(self.connection())
                break
            except (sqlite3.Error, OSError, SchemaTooNew) as exc:
                if attempt == 1 and is_corrupt(exc):
                    self._recover(exc)
                    continue
                log.warning("history %s: spool not ingested (%s: %s)", self.path,
                            type(exc).__name__, exc)  # fmt: skip
        return self._ingested - before

    def _ingest(self, conn: sqlite3.Connection) -> None:
        def counted(n: int) -> None:
            self._ingested += n

        self.spool.ingest(conn, self.path, counted, self._buffer)
        fb = self.fallback
        if fb is not None and os.path.exists(fb.folder):
            fb.ingest(conn, self.path, counted, fb.buffer_path(os.getpid()))

    def prune(self, policy: Retention, now: float | None = None) -> PruneResult:
        """Delete what ``policy`` no longer keeps, a bounded amount (``history.retention``).
        Raises :class:`StoreError` (:class:`SchemaTooNew` included) when it cannot."""
        from slurmhealth.history.retention import prune

        try:
            return prune(self.connection(), policy, now)
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"{self.path}: {exc}") from exc

    def vacuum(self) -> None:
        """Rebuild the file without its free pages (after a large prune). Raises
        :class:`StoreError`."""
        try:
            self.connection().execute("VACUUM")
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"{self.path}: {exc}") from exc

    # -- node state and health ------------------------------------------------------------

    def kv_get(self, key: str, default: Any = None) -> Any:
        """The JSON-decoded value stored under ``key``, or ``default``."""
        try:
            row = self.connection().execute("SELECT value FROM kv WHERE key = ?", (key,))
            found = row.fetchone()
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"{self.path}: {exc}") from exc
        return default if found is None else json.loads(found[0])

    def integrity_check(self) -> str:
        """``"ok"``, or what ``PRAGMA integrity_check`` (or opening the file) reported."""
        try:
            rows = self.connection().execute("PRAGMA integrity_check").fetchall()
        except (sqlite3.Error, OSError, SchemaTooNew) as exc:
            return f"{type(exc).__name__}: {exc}"
        return "\n".join(str(row[0]) for row in rows)


def hold_open(path: str) -> sqlite3.Connection | None:
    """An idle connection to the existing history ``path`` (none is created), for a
    daemon to keep while hooks come and go: a hook's connection is then never the last
    one, whose close checkpoints the WAL into the database with an fsync. It holds no
    transaction, so it never holds a checkpoint back; None when it cannot be opened."""
    if not os.path.isfile(path):
        return None
    try:
        held = sqlite3.connect(f"{pathlib.Path(path).as_uri()}?mode=rw", uri=True,
                               check_same_thread=False)  # fmt: skip
        held.execute("SELECT count(*) FROM sqlite_master").fetchall()  # joins the WAL
    except sqlite3.Error as exc:
        log.warning("history %s not held open: %s", path, exc)
        return None
    return held
