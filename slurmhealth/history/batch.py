"""A batch of rows written in one transaction (or spooled as one JSON line), and how it is
applied to a connection. Plain ``sqlite3``: the prolog's write path."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from slurmhealth.history.schema import COLUMNS, PRIMARY_KEYS, SAMPLE_COLUMNS, quote, sql_value


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
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """One ``BEGIN IMMEDIATE`` transaction: committed, or rolled back on any exception."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            if conn.in_transaction:
                conn.execute("ROLLBACK")
        raise


def sample_row(row: dict[str, Any]) -> dict[str, Any]:
    """A GPU ``samples`` row with each ``metrics`` field that has a column moved into it
    (a batch spooled by an older release repeats them): the JSON keeps only the rest."""
    metrics = row.get("metrics")
    if row.get("gpu") is None or not isinstance(metrics, dict):
        return row
    out = {**row, "metrics": {k: v for k, v in metrics.items() if k not in SAMPLE_COLUMNS}}
    for key, col in SAMPLE_COLUMNS.items():
        if out.get(col) is None and metrics.get(key) is not None:
            out[col] = metrics[key]
    out["metrics"] = out["metrics"] or None
    return out


def apply(conn: sqlite3.Connection, batch: Batch, now: float) -> None:
    """Execute ``batch``'s statements (inside the caller's transaction), the rollups of
    its GPU samples included. Inserts of one table and column set go in one
    ``executemany`` (a table's rows keep their order)."""
    inserts = [(t, sample_row(r) if t == "samples" else r) for t, r in batch.inserts]
    same: dict[tuple[str, tuple[str, ...]], list[list[Any]]] = {}
    for table, row in inserts:
        same.setdefault((table, tuple(row)), []).append([sql_value(v) for v in row.values()])
    for (table, names), values in same.items():
        marks = ", ".join("?" * len(names))
        sql = f"INSERT INTO {quote(table)} ({', '.join(map(quote, names))}) VALUES ({marks})"
        conn.executemany(sql, values)
    for table, row, pk in batch.upserts:  # None means "unknown": never overwrites a value
        cols = ", ".join(map(quote, row))
        sets = [f"{quote(c)} = COALESCE(excluded.{quote(c)}, {quote(table)}.{quote(c)})"
                for c in row]  # fmt: skip
        sql = (
            f"INSERT INTO {quote(table)} ({cols}) VALUES ({', '.join('?' * len(row))}) "
            f"ON CONFLICT({quote(pk)}) DO UPDATE SET {', '.join(sets)}"
        )
        conn.execute(sql, [sql_value(v) for v in row.values()])
    samples = [r for t, r in inserts if t == "samples"]
    if samples:  # only the sidecar writes samples: a check never imports the rollups
        from slurmhealth.history import rollups

        rollups.add(conn, samples)
    for key, value in batch.kv.items():
        conn.execute(
            "INSERT INTO kv (key, value, updated) VALUES (?, ?, ?) ON CONFLICT(key) "
            "DO UPDATE SET value = excluded.value, updated = excluded.updated",
            (key, json.dumps(value, default=str), now),
        )
