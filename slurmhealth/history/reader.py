"""Read access to history files: which ones exist, a read-only handle, and the one place a
read turns ``sqlite3`` trouble into :class:`StoreError`.

Every named query (``history.queries``) takes a :class:`Source`: a :class:`Reader`
(``mode=ro``: never creates or migrates a file, the report's and evidence's way in) or a
:class:`~slurmhealth.history.writer.History` (the read-write handle a hook already holds).
"""

from __future__ import annotations

import contextlib
import glob
import os
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from slurmhealth.errors import StoreError
from slurmhealth.history.schema import check_version, decode

if TYPE_CHECKING:
    from slurmhealth.config import Config


class Source(Protocol):
    """Anything a named query can read from."""

    @property
    def path(self) -> str: ...

    def connection(self) -> sqlite3.Connection: ...


class Reader:
    """One history file opened read-only on first use; ``busy_timeout_s`` bounds waits on
    a writer holding a lock. A file written by a newer release is refused at open
    (:class:`~slurmhealth.errors.SchemaTooNew`, a :class:`StoreError`)."""

    def __init__(self, path: str | os.PathLike[str], busy_timeout_s: float = 5.0) -> None:
        self.path = os.fspath(path)
        self.busy_timeout_s = busy_timeout_s
        self._conn: sqlite3.Connection | None = None

    def connection(self) -> sqlite3.Connection:
        if self._conn is None:
            uri = self.path.replace("%", "%25").replace("?", "%3f").replace("#", "%23")
            conn = sqlite3.connect(f"file:{uri}?mode=ro", uri=True,
                                   timeout=self.busy_timeout_s)  # fmt: skip
            try:
                check_version(self.path, int(conn.execute("PRAGMA user_version").fetchone()[0]))
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_reader(path: str) -> Reader | None:
    """A :class:`Reader` on ``path`` when it is a readable history (it has a ``jobs``
    table), else None."""
    reader = Reader(path)
    try:
        reader.connection().execute("select 1 from jobs limit 1")
    except sqlite3.Error:
        reader.close()
        return None
    return reader


@contextlib.contextmanager
def reading(db: Source) -> Iterator[sqlite3.Connection]:
    """``db``'s connection; ``sqlite3`` errors (and a file that cannot be opened) leave
    as :class:`StoreError` naming the file."""
    try:
        yield db.connection()
    except (sqlite3.Error, OSError) as exc:
        raise StoreError(f"{db.path}: {exc}") from exc


def dicts(
    conn: sqlite3.Connection, table: str, sql: str, params: Sequence[Any] = ()
) -> Iterator[dict[str, Any]]:
    """Rows of ``sql`` over ``table`` as dicts, JSON columns decoded (once, here)."""
    cur = conn.execute(sql, params)
    names = [d[0] for d in cur.description]
    for row in cur:
        yield decode(table, dict(zip(names, row, strict=True)))


def where_clause(filters: Iterable[tuple[str, Any]]) -> tuple[str, list[Any]]:
    """`` where a = ? and ...`` and its parameters, for the filters whose value is given."""
    given = [(clause, value) for clause, value in filters if value is not None]
    if not given:
        return "", []
    return " where " + " and ".join(c for c, _ in given), [v for _, v in given]


def history_paths(cfg: Config, nodes: Iterable[str] = (), discover: bool = True) -> list[str]:
    """The history databases this host can read: its own, and when ``paths.db`` holds
    ``{node}`` (several slurmd on one host, or a shared filesystem) each named node's and,
    with ``discover``, every one found. Only files that exist."""
    paths = [cfg.db_path()]
    if "{node}" in cfg.paths.db:
        paths += [cfg.db_path(n) for n in nodes]
        if discover:
            paths += sorted(glob.glob(cfg.paths.db.replace("{node}", "*")))
    return [p for p in dict.fromkeys(paths) if os.path.exists(p)]
