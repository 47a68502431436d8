"""Per-node history database (DESIGN.md section 5): sqlite in WAL mode plus a spool.

Writes never raise on database trouble: a batch that cannot be written is appended to a
JSON-lines spool and ingested by the next successful write. Timestamps are UTC unix seconds.
The write path uses plain ``sqlite3``; ``sqlite_utils`` (slow to import) is only imported
to migrate a stale database and for ``runs`` / ``table_rows``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurmhealth.errors import StoreError

log = logging.getLogger("slurmhealth.store")

Migration = Callable[[Any], None]
"""A migration receives a ``sqlite_utils.Database`` inside an open transaction."""

_MIGRATIONS: dict[int, tuple[str, Migration]] = {}
_INGEST_LOCK = threading.Lock()
_T, _I, _R = "TEXT", "INTEGER", "REAL"


def migration(version: int, name: str) -> Callable[[Migration], Migration]:
    """Register a forward migration. Versions are unique and applied in ascending order."""

    def register(fn: Migration) -> Migration:
        if version in _MIGRATIONS:
            raise ValueError(f"duplicate migration version {version}")
        _MIGRATIONS[version] = (name, fn)
        return fn

    return register


# Current schema: table -> column -> type. Update when a migration adds columns.
COLUMNS: dict[str, dict[str, str]] = {
    "check_runs": {"run_id": _T, "ts": _R, "node": _T, "job_id": _T, "phase": _T, "gpus": _T,
                   "status": _T, "exit_code": _I, "duration_s": _R, "backend": _T, "error": _T},
    "findings": {"id": _I, "run_id": _T, "ts": _R, "node": _T, "job_id": _T, "check_name": _T,
                 "severity": _T, "severity_value": _I, "gpu": _I, "uuid": _T, "message": _T,
                 "action": _T, "hint": _T, "evidence": _T},
    "drains": {"id": _I, "ts": _R, "node": _T, "job_id": _T, "run_id": _T, "state": _T,
               "reason": _T, "actor": _T, "detail": _T},
    "jobs": {"job_id": _T, "node": _T, "user": _T, "uid": _I, "account": _T, "partition": _T,
             "qos": _T, "priority": _I, "nodes": _T, "gpus": _T, "start_ts": _R, "end_ts": _R,
             "exit_code": _T, "state": _T},
    "events": {"id": _I, "ts": _R, "node": _T, "job_id": _T, "gpu": _I, "uuid": _T, "kind": _T,
               "severity": _T, "message": _T, "evidence": _T},
    "samples": {"id": _I, "ts": _R, "node": _T, "job_id": _T, "gpu": _I, "uuid": _T,
                "metrics": _T, **{c: t for c, t in (
                    ("util_pct", _R), ("power_w", _R), ("mem_used_bytes", _I), ("temp_c", _R),
                    ("margin_c", _R), ("clock_reasons", _I), ("pcie_gen", _I),
                    ("pcie_width", _I), ("nvlink_active", _I), ("nvlink_errors", _I),
                    ("pcie_replay", _I))}},
    "evidence": {"id": _I, "ts": _R, "job_id": _T, "node": _T, "path": _T, "sha256": _T,
                 "size": _I, "kind": _T},
    "baselines": {"id": _I, "ts": _R, "node": _T, "kind": _T, "metric": _T, "value": _R,
                  "unit": _T, "gpu_model": _T, "gpu": _I, "label": _T, "source": _T},
    "kv": {"key": _T, "value": _T, "updated": _R},
}  # fmt: skip
PRIMARY_KEYS = {"check_runs": "run_id", "jobs": "job_id", "kv": "key"}  # others: "id"
JSON_COLUMNS = {"check_runs": ("gpus",), "findings": ("evidence",), "drains": ("detail",),
                "events": ("evidence",), "samples": ("metrics",), "kv": ("value",)}  # fmt: skip
_INDEXES: dict[str, list[tuple[str, ...]]] = {
    "check_runs": [("node", "ts"), ("job_id",), ("ts",)],
    "findings": [("run_id",), ("node", "ts"), ("job_id",)],
    "drains": [("node", "ts"), ("job_id",)],
    "jobs": [("node", "start_ts")],
    "events": [("node", "ts"), ("job_id",)],
    "samples": [("node", "ts"), ("job_id",)],
    "evidence": [("job_id",)],
    "baselines": [("node", "kind", "metric", "ts")],
}


@migration(1, "initial schema")
def _initial_schema(db: Any) -> None:
    for table, columns in COLUMNS.items():
        db[table].create(dict(columns), pk=PRIMARY_KEYS.get(table, "id"))
        for cols in _INDEXES.get(table, []):
            db[table].create_index(list(cols), if_not_exists=True)


@migration(2, "sample metrics as columns")
def _sample_columns(db: Any) -> None:
    """The report aggregates a day of samples in SQL: json_extract re-parses the JSON for
    every call (12 per row), real columns are ~10x faster."""
    have = set(db["samples"].columns_dict)
    for column, kind in COLUMNS["samples"].items():
        if column not in have:
            db["samples"].add_column(column, {"INTEGER": int, "REAL": float}.get(kind, str))
    # covering index: the report reads one job's samples of one node in (gpu, ts) order
    # from the index alone, without a sort or a table lookup per row (2.3x faster)
    db["samples"].create_index(
        ["job_id", "node", "gpu", "ts", "util_pct", "power_w", "clock_reasons", "uuid",
         "mem_used_bytes", "temp_c", "margin_c", "pcie_gen", "pcie_width", "nvlink_active",
         "nvlink_errors", "pcie_replay"],
        index_name="idx_samples_report",
        if_not_exists=True,
    )  # fmt: skip


def _sql_value(value: Any) -> Any:
    if isinstance(value, int) and not -(2**63) <= value < 2**63:
        return str(value)  # too big for an sqlite INTEGER
    if value is None or isinstance(value, int | float | str | bytes):
        return value
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, default=str)
    return str(value)


def _q(name: str) -> str:
    return f'"{name}"'


@dataclass
class Batch:
    """Rows written in one transaction, or spooled as one JSON line if that fails."""

    inserts: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    upserts: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)
    kv: dict[str, object] = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ``ValueError`` for an unknown table or column (a bug, never spooled)."""
        rows = [(t, r) for t, r in self.inserts] + [(t, r) for t, r, _ in self.upserts]
        for table, row in rows:
            if table not in COLUMNS or table == "kv":
                raise ValueError(f"unknown table {table!r}")
            unknown = set(row) - set(COLUMNS[table])
            if unknown or not row:
                raise ValueError(f"{table}: unknown or no columns {sorted(unknown)}")
        for table, row, pk in self.upserts:
            if pk != PRIMARY_KEYS.get(table, "id") or row.get(pk) is None:
                raise ValueError(f"{table}: upsert needs its primary key {pk!r}")

    def to_json(self) -> str:
        doc = {"inserts": self.inserts, "upserts": self.upserts, "kv": self.kv}
        return json.dumps(doc, default=str, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Batch:
        """Parse one spool line; raise ``ValueError`` if it is not a valid batch."""
        try:
            doc = json.loads(text)
            batch = cls(
                inserts=[(str(t), dict(r)) for t, r in doc.get("inserts", [])],
                upserts=[(str(t), dict(r), str(pk)) for t, r, pk in doc.get("upserts", [])],
                kv=dict(doc.get("kv", {})),
            )
        except (TypeError, AttributeError, ValueError) as exc:
            raise ValueError(f"not a batch: {exc}") from None
        batch.validate()
        return batch


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        raise


def _user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _apply(conn: sqlite3.Connection, batch: Batch, now: float) -> None:
    rows = [(t, r, None) for t, r in batch.inserts] + list(batch.upserts)
    for table, row, pk in rows:
        cols = ", ".join(map(_q, row))
        sql = f"INSERT INTO {_q(table)} ({cols}) VALUES ({', '.join('?' * len(row))})"
        if pk is not None:  # upsert; None means "unknown" and never overwrites a value
            sets = [f"{_q(c)} = COALESCE(excluded.{_q(c)}, {_q(table)}.{_q(c)})" for c in row]
            sql += f" ON CONFLICT({_q(pk)}) DO UPDATE SET {', '.join(sets)}"
        conn.execute(sql, [_sql_value(v) for v in row.values()])
    for key, value in batch.kv.items():
        conn.execute(
            "INSERT INTO kv (key, value, updated) VALUES (?, ?, ?) ON CONFLICT(key) "
            "DO UPDATE SET value = excluded.value, updated = excluded.updated",
            (key, json.dumps(value, default=str), now),
        )


def _append(path: str, data: bytes) -> None:
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


def _decode(table: str, row: dict[str, Any]) -> dict[str, Any]:
    for col in JSON_COLUMNS.get(table, ()):
        if isinstance(row.get(col), str):
            with contextlib.suppress(ValueError):
                row[col] = json.loads(row[col])
    return row


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
        self._db: Any = None
        self._fallback: str | None = None
        self._ingested = 0  # batches ingested from spools by this object, ever

    # -- connection and schema ------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        os.makedirs(os.path.dirname(self.path) or ".", mode=0o750, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout_ms / 1000, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout = {self.busy_timeout_ms}")
            self._set_wal(conn)
            conn.execute("PRAGMA synchronous = NORMAL")
            if _user_version(conn) < max(_MIGRATIONS):
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
        for version in sorted(_MIGRATIONS):
            name, fn = _MIGRATIONS[version]
            with _immediate(conn):
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
        self._conn = self._db = None

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
            conn = self._connect()
            self._ingest_all(conn)
            with _immediate(conn):
                _apply(conn, batch, time.time())
            return True
        except (sqlite3.Error, OSError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        line = (batch.to_json() + "\n").encode()
        for where in (self.spool_path, self._fallback_spool()):
            try:
                _append(where, line)
            except OSError as spool_exc:
                problem += f"; spool {where}: {spool_exc}"
                continue
            log.warning("history %s not written (%s); batch spooled to %s", self.path,
                        problem, where)  # fmt: skip
            return False
        log.error("history %s not written (%s); record lost", self.path, problem)
        return False

    def _fallback_spool(self) -> str:
        if self._fallback is None:
            import tempfile

            name = f"slurmhealth-spool-{os.getuid()}.jsonl"
            self._fallback = os.path.join(tempfile.gettempdir(), name)
        return self._fallback

    def ingest_spool(self) -> int:
        """Ingest pending spool files now; return how many batches went into the database."""
        before = self._ingested
        try:
            self._ingest_all(self._connect())
        except (sqlite3.Error, OSError) as exc:
            log.warning("history %s: spool not ingested (%s: %s)", self.path,
                        type(exc).__name__, exc)  # fmt: skip
        return self._ingested - before

    def _ingest_all(self, conn: sqlite3.Connection) -> None:
        with _INGEST_LOCK:
            for spool in dict.fromkeys((self.spool_path, self._fallback_spool())):
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
                    self._ingest_file(conn, src, spool, mine)

    def _ingest_file(self, conn: sqlite3.Connection, src: str, spool: str, mine: str) -> None:
        try:
            if src != mine:
                os.rename(src, mine)  # the claim: atomic, so no two processes share a file
            fd = os.open(mine, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # wait for appends that started before the rename
            with os.fdopen(os.dup(fd), "rb") as fh:
                data = fh.read()
        finally:
            os.close(fd)
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
            _append(rejected, b"".join(bad))
            log.warning("history %s: %d invalid spool line(s) kept in %s", self.path,
                        len(bad), rejected)  # fmt: skip
        try:
            now, refused = time.time(), list[tuple[bytes, sqlite3.Error]]()
            with _immediate(conn):
                for line, batch in good:
                    conn.execute("SAVEPOINT batch")
                    try:
                        _apply(conn, batch, now)
                    except (sqlite3.IntegrityError, sqlite3.InterfaceError) as why:
                        conn.execute("ROLLBACK TO batch")
                        refused.append((line, why))
                    conn.execute("RELEASE batch")
        except BaseException:
            if good:
                _append(spool, b"".join(line for line, _ in good))  # put back: nothing lost
            os.unlink(mine)
            raise
        os.unlink(mine)
        self._ingested += len(good) - len(refused)
        for line, err in refused:
            log.warning("history %s: spooled batch refused (%s), kept in %s", self.path,
                        err, rejected)  # fmt: skip
            try:
                _append(rejected, line)
            except OSError:
                log.error("history %s: refused batch lost: %r", self.path, line)

    # -- reads ----------------------------------------------------------------------------

    def _utils(self) -> Any:
        if self._db is None:
            import sqlite_utils

            conn = self._connect()
            self._db = sqlite_utils.Database(conn, recursive_triggers=False,
                                             execute_plugins=False)  # fmt: skip
        return self._db

    def kv_get(self, key: str, default: Any = None) -> Any:
        """The JSON-decoded value stored under ``key``, or ``default``."""
        try:
            row = self._connect().execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"{self.path}: {exc}") from exc
        return default if row is None else json.loads(row[0])

    def runs(
        self,
        node: str | None = None,
        job: str | None = None,
        since: float | None = None,
        limit: int = 200,
    ) -> list[dict[str, Any]]:
        """Check runs newest first, each with its ``findings`` (worst first)."""
        clauses: list[str] = []
        params: list[Any] = []
        for clause, value in (("node = ?", node), ("job_id = ?", job), ("ts >= ?", since)):
            if value is not None:
                clauses.append(clause)
                params.append(value)
        where = " AND ".join(clauses) or None
        runs = self.table_rows("check_runs", where, params, "ts DESC, rowid DESC", limit)
        by_id = {run["run_id"]: {**run, "findings": []} for run in runs}
        marks = ", ".join("?" * len(by_id))
        for f in self.table_rows("findings", f"run_id IN ({marks})", list(by_id),
                                 "severity_value DESC, id"):  # fmt: skip
            by_id[f["run_id"]]["findings"].append(f)
        return list(by_id.values())

    def table_rows(
        self,
        table: str,
        where: str | None = None,
        params: Sequence[Any] | Mapping[str, Any] | None = None,
        order_by: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """Rows of ``table`` (JSON columns decoded); ``where`` is an SQL fragment."""
        if table not in COLUMNS and table != "schema_migrations":
            raise ValueError(f"unknown table {table!r}")
        try:
            rows = self._utils()[table].rows_where(where, params, order_by=order_by, limit=limit)
            return [_decode(table, row) for row in rows]
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"{self.path}: {exc}") from exc

    def integrity_check(self) -> str:
        """``"ok"``, or what ``PRAGMA integrity_check`` (or opening the file) reported."""
        try:
            rows = self._connect().execute("PRAGMA integrity_check").fetchall()
        except (sqlite3.Error, OSError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return "\n".join(str(row[0]) for row in rows)
