"""Named queries: everything slurmhealth reads from a history, by name.

Each takes a :class:`~slurmhealth.history.reader.Source`, returns plain dicts (JSON columns
decoded once, by ``schema.decode``) or plain values, and raises only
:class:`~slurmhealth.errors.StoreError` for a history that cannot be read.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

from slurmhealth.history.reader import Source, dicts, reading, where_clause

# tables that hold rows about a job on a node (``job_id`` and ``node`` columns)
JOB_TABLES = ("check_runs", "findings", "events", "drains", "evidence", "samples")


def _newest(
    db: Source, table: str, filters: Iterable[tuple[str, Any]], limit: int | None
) -> list[dict[str, Any]]:
    where, params = where_clause(filters)
    limit_sql = "" if limit is None else f" limit {int(limit)}"
    sql = f"select * from {table}{where} order by ts desc, rowid desc{limit_sql}"
    with reading(db) as conn:
        return list(dicts(conn, table, sql, params))


def runs(
    db: Source,
    node: str | None = None,
    job: str | None = None,
    since: float | None = None,
    limit: int = 200,
) -> list[dict[str, Any]]:
    """Check runs newest first, each with its ``findings`` (worst first)."""
    filters = (("node = ?", node), ("job_id = ?", job), ("ts >= ?", since))
    by_id = {r["run_id"]: {**r, "findings": []} for r in _newest(db, "check_runs", filters, limit)}
    marks = ", ".join("?" * len(by_id))
    sql = f"select * from findings where run_id in ({marks}) order by severity_value desc, id"
    with reading(db) as conn:
        for f in dicts(conn, "findings", sql, list(by_id)):
            by_id[f["run_id"]]["findings"].append(f)
    return list(by_id.values())


def check_runs(
    db: Source, node: str | None = None, phase: str | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """``check_runs`` rows (without findings), newest first."""
    return _newest(db, "check_runs", (("node = ?", node), ("phase = ?", phase)), limit)


def drain_rows(
    db: Source, node: str | None = None, state: str | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """``drains`` rows (drains, suppressed drains, resumes), newest first."""
    return _newest(db, "drains", (("node = ?", node), ("state = ?", state)), limit)


def remediation_rows(
    db: Source,
    node: str | None = None,
    job: str | None = None,
    since: float | None = None,
    limit: int | None = 200,
) -> list[dict[str, Any]]:
    """``remediations`` rows (a node's repair steps), newest first."""
    filters = (("node = ?", node), ("job_id = ?", job), ("ts >= ?", since))
    return _newest(db, "remediations", filters, limit)


def job_row(db: Source, job_id: str) -> dict[str, Any] | None:
    """The job's ``jobs`` row (``gpus`` decoded), or None."""
    with reading(db) as conn:
        found = list(dicts(conn, "jobs", "select * from jobs where job_id = ?", (job_id,)))
    return found[0] if found else None


def owner_uid(db: Source, job_id: str) -> int | None:
    """The uid the ``jobs`` row records for the job (its owner), or None."""
    with reading(db) as conn:
        row = conn.execute(
            "select uid from jobs where job_id = ? and uid is not null", (job_id,)
        ).fetchone()
    return row[0] if row is not None and isinstance(row[0], int) else None


def nodes_of_job(db: Source, job_id: str) -> list[str]:
    """The nodes this history holds any row about the job for (each table's distinct
    nodes found by index seeks, not by reading a month of samples)."""
    found: dict[str, None] = {}
    with reading(db) as conn:
        for table in ("jobs", "check_runs", "findings", "events", "drains", "samples"):
            last = ""
            while True:
                sql = f"select min(node) from {table} where job_id = ? and node > ?"
                node = conn.execute(sql, (job_id, last)).fetchone()[0]
                if node is None:
                    break
                found[node] = None
                last = node
    return list(found)


def job_had_events(db: Source, job_id: str) -> bool:
    """Whether the sidecar recorded an event above ``info`` during the job."""
    with reading(db) as conn:
        row = conn.execute(
            "select count(*) from events where job_id = ? and severity != 'info'", (job_id,)
        ).fetchone()
    return bool(row and row[0])


def job_node_rows(
    db: Source, table: str, job_id: str, node: str, *, newest_first: bool = False
) -> Iterator[dict[str, Any]]:
    """The job's rows of ``table`` on ``node`` in time order, one at a time (a caller with a
    byte cap or a deadline stops reading when it must)."""
    if table not in JOB_TABLES:
        raise ValueError(f"not a table of job rows: {table!r}")
    order = "ts desc, rowid desc" if newest_first else "ts, rowid"
    sql = f"select * from {table} where job_id = ? and node = ? order by {order}"
    with reading(db) as conn:
        yield from dicts(conn, table, sql, (job_id, node))


def job_row_counts(db: Source, job_id: str, node: str) -> dict[str, int]:
    """How many rows about the job on ``node`` each table holds (``samples``: the GPU
    samples its rollups count, or the raw ones where it has none; never the task's):
    O(buckets), not O(samples)."""
    others = [t for t in JOB_TABLES if t != "samples"]
    sql = " union all ".join(f"select count(*) from {t} where job_id = ? and node = ?"
                             for t in others)  # fmt: skip
    with reading(db) as conn:
        rows = conn.execute(sql, (job_id, node) * len(others))
        counts = dict(zip(others, (r[0] for r in rows), strict=True))
        counts["samples"] = _sample_count(conn, job_id, node)
    return {t: counts[t] for t in JOB_TABLES}


def _sample_count(conn: sqlite3.Connection, job_id: str, node: str) -> int:
    if int(conn.execute("PRAGMA user_version").fetchone()[0]) >= 3:
        sql = "select sum(n) from sample_rollups where job_id = ? and node = ?"
        rolled = conn.execute(sql, (job_id, node)).fetchone()[0]
        if rolled:
            return int(rolled)
    sql = "select count(*) from samples where job_id = ? and node = ? and gpu is not null"
    return int(conn.execute(sql, (job_id, node)).fetchone()[0])


def incident_rows(db: Source, job_id: str) -> list[dict[str, Any]]:
    """The job's ``findings`` and then ``events`` rows on every node (the context an
    incident records: nodes, GPUs, Xids, checks)."""
    with reading(db) as conn:
        return [
            row
            for table in ("findings", "events")
            for row in dicts(conn, table, f"select * from {table} where job_id = ?", (job_id,))
        ]


_PAST_SQL = """
select job_id, ts, node, gpu, {what} as what, message, severity from {table}
where (job_id is null or job_id != ?) and severity not in ('ok') and ts < ? and ({pairs})
order by ts desc limit 50
"""


def past_incident_rows(
    db: Source, job_id: str, pairs: Iterable[tuple[str, int]], before: float
) -> list[dict[str, Any]]:
    """Findings and events of other jobs (or of no job) on the given (node, GPU) pairs
    from before ``before`` (the job's end), newest first, at most 50 of each: ``job_id,
    ts, node, gpu, what, message, severity`` where ``what`` is the check name or the event
    kind."""
    pairs = sorted(pairs)
    if not pairs:
        return []
    cond = " or ".join(["(node = ? and gpu = ?)"] * len(pairs))
    params: list[Any] = [job_id, before, *(v for p in pairs for v in p)]
    out: list[dict[str, Any]] = []
    with reading(db) as conn:
        for table, what in (("findings", "check_name"), ("events", "kind")):
            sql = _PAST_SQL.format(table=table, what=what, pairs=cond)
            out += dicts(conn, table, sql, params)
    return out
