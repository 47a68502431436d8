"""Retention: the node deletes what is older than ``[history]`` says, a bounded amount
at a time (``history.prune_max_rows`` per run, in transactions of :data:`BATCH_ROWS`), so a
prune never holds the write lock long enough to delay a prolog.

Defaults (``[history]``, ``config.HistoryConfig``): raw samples 14 days, per-GPU rollups
400 days, the records (check runs, findings, events, drains, evidence rows, jobs) 5 years;
0 keeps a kind forever. The newest ``drains`` row of each node is always kept (it says whether
slurmhealth's drain is in force). Deleted pages are reused by later writes; ``VACUUM``
(``slurmhealth history prune --vacuum``) gives them back to the filesystem.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from slurmhealth.errors import SchemaTooNew, StoreError
from slurmhealth.history.batch import immediate

if TYPE_CHECKING:
    from slurmhealth.config import Config

log = logging.getLogger("slurmhealth.history")

DAY_S = 86400.0
BATCH_ROWS = 5000

# table -> (time expression, which retention, extra condition)
_PLAN: tuple[tuple[str, str, str, str], ...] = (
    ("samples", "ts", "raw_samples_days", ""),
    ("sample_rollups", "bucket", "rollups_days", ""),
    ("findings", "ts", "records_days", ""),
    ("events", "ts", "records_days", ""),
    ("check_runs", "ts", "records_days", ""),
    ("evidence", "ts", "records_days", ""),
    ("drains", "ts", "records_days", " and id not in (select max(id) from drains group by node)"),
    ("jobs", "coalesce(end_ts, start_ts)", "records_days", ""),
)
_KEYS = {"sample_rollups": "job_id, node, gpu, bucket", "jobs": "job_id"}  # others: rowid


@dataclass(frozen=True)
class Retention:
    """How long each kind of row is kept (days; 0 = forever) and how many rows one prune
    deletes at most."""

    raw_samples_days: float
    rollups_days: float
    records_days: float
    max_rows: int


def policy(cfg: Config) -> Retention:
    """The ``[history]`` section as a :class:`Retention`."""
    h = cfg.history
    return Retention(h.raw_samples_days, h.rollups_days, h.records_days, h.prune_max_rows)


@dataclass(frozen=True)
class PruneResult:
    deleted: Mapping[str, int] = field(default_factory=dict)  # table -> rows deleted
    complete: bool = True  # False: the row budget ran out, more is due
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.deleted.values())


def _delete_sql(table: str, when: str, extra: str) -> str:
    key = _KEYS.get(table, "rowid")
    inner = f"select {key} from {table} where {when} < ?{extra} limit ?"
    return f"delete from {table} where ({key}) in ({inner})"


def prune(conn: sqlite3.Connection, policy: Retention, now: float | None = None) -> PruneResult:
    """Delete what ``policy`` no longer keeps, oldest tables' rows first, at most
    ``policy.max_rows`` rows in transactions of :data:`BATCH_ROWS` rows."""
    t0 = time.monotonic()
    now = time.time() if now is None else now
    budget = max(0, int(policy.max_rows))
    deleted: dict[str, int] = {}
    complete = True
    for table, when, days_attr, extra in _PLAN:
        days = float(getattr(policy, days_attr))
        if days <= 0:
            continue
        sql, cutoff = _delete_sql(table, when, extra), now - days * DAY_S
        while True:
            step = min(BATCH_ROWS, budget)
            if step <= 0:
                complete = False
                break
            with immediate(conn):
                n = conn.execute(sql, (cutoff, step)).rowcount
            deleted[table] = deleted.get(table, 0) + n
            budget -= n
            if n < step:
                break
        if not complete:
            break
    return PruneResult({t: n for t, n in deleted.items() if n}, complete, time.monotonic() - t0)


class Prunable(Protocol):
    """What the hooks' prune needs of a history (``history.writer.History``, which calls
    :func:`prune` here: named by its shape, so the two modules import nothing of each other)."""

    path: str

    def prune(self, policy: Retention, now: float | None = None) -> PruneResult: ...


def prune_quietly(history: Prunable, cfg: Config) -> PruneResult | None:
    """The hooks' prune (after the epilog, from the health check): logged, never raises."""
    try:
        result = history.prune(policy(cfg))
    except SchemaTooNew:
        return None  # the hook already said so, once: a newer release owns this history
    except StoreError as exc:
        log.warning("history %s not pruned: %s", history.path, exc)
        return None
    if result.total or not result.complete:
        log.info("history %s: pruned %d rows in %.2f s%s (%s)", history.path, result.total,
                 result.seconds, "" if result.complete else ", more next time",
                 ", ".join(f"{t} {n}" for t, n in result.deleted.items()))  # fmt: skip
    return result
