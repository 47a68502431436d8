"""The node's history database, written: sqlite in WAL mode plus a spool (DESIGN.md 5).

Writes never raise on database trouble: a batch that cannot be written is appended to a
JSON-lines spool and ingested by the next successful write. Timestamps are UTC unix seconds.
Plain ``sqlite3``: ``sqlite_utils`` (150 ms to import) only migrates a stale database.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from typing import Any

from slurmhealth.errors import StoreError
from slurmhealth.history.batch import Batch, apply, immediate
from slurmhealth.history.schema import MIGRATIONS, latest_version
from slurmhealth.history.spool import append, ingest_all

log = logging.getLogger("slurmhealth.history")


def _user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


class History:
    """The node's history database. ``busy_timeout_ms`` bounds waits on other writers."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        spool_path: str | os.PathLike[str] | None = None,
        busy_timeout_ms: int = 5000,
    ) -> None:
        # plain str paths: pathlib costs the prolog ~7 ms of imports
        self.path = os.fspath(path)
        self.spool_path = os.fspath(spool_path) if spool_path else f"{self.path}.spool.jsonl"
        self.busy_timeout_ms = int(busy_timeout_ms)
        self._conn: sqlite3.Connection | None = None
        self._ingested = 0  # batches ingested from spools by this object, ever

    # -- connection and schema ------------------------------------------------------------

    def connection(self) -> sqlite3.Connection:
        """The read-write connection, opened (created, migrated) on first use."""
        if self._conn is not None:
            return self._conn
        os.makedirs(os.path.dirname(self.path) or ".", mode=0o750, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout_ms / 1000, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
            self._set_wal(conn)
            conn.execute("PRAGMA synchronous = NORMAL")
            if _user_version(conn) < latest_version():
                self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

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

    def _migrate(self, conn: sqlite3.Connection) -> None:
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

    def close(self) -> None:
        if self._conn is not None:
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
        try:
            conn = self.connection()
            self._ingest(conn)
            with immediate(conn):
                apply(conn, batch, time.time())
            return True
        except (sqlite3.Error, OSError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        try:
            append(self.spool_path, (batch.to_json() + "\n").encode())
        except OSError as spool_exc:
            # no fallback in a shared temp dir: a job's user could plant or read it there
            log.error("history %s not written (%s; spool %s: %s); record lost", self.path,
                      problem, self.spool_path, spool_exc)  # fmt: skip
            return False
        log.warning("history %s not written (%s); batch spooled to %s", self.path, problem,
                    self.spool_path)  # fmt: skip
        return False

    def ingest_spool(self) -> int:
        """Ingest pending spool files now; return how many batches went into the database."""
        before = self._ingested
        try:
            self._ingest(self.connection())
        except (sqlite3.Error, OSError) as exc:
            log.warning("history %s: spool not ingested (%s: %s)", self.path,
                        type(exc).__name__, exc)  # fmt: skip
        return self._ingested - before

    def _ingest(self, conn: sqlite3.Connection) -> None:
        def counted(n: int) -> None:
            self._ingested += n

        ingest_all(conn, (self.spool_path,), self.path, counted)

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
        except (sqlite3.Error, OSError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return "\n".join(str(row[0]) for row in rows)
