"""Named queries for a node's own state (what ``slurmhealth exporter`` serves whether or not
a job runs): its last checks, its hook runs by result, slurmhealth's drain in force.

Same contract as :mod:`slurmhealth.history.queries`: a :class:`Source` in, plain values
out, :class:`~slurmhealth.errors.StoreError` for a history that cannot be read.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from slurmhealth.history.reader import Source, reading

# drains rows that start or end slurmhealth's drain of a node
_DRAIN_STATES = ("drained", "already", "resumed")


@dataclass(frozen=True)
class LastCheck:
    phase: str
    status: str
    ts: float


@dataclass(frozen=True)
class DrainInForce:
    """slurmhealth's drain of the node, as its history knows it."""

    ts: float
    reason: str


def last_checks(db: Source, node: str) -> list[LastCheck]:
    """The newest check run of each phase (prolog, epilog, healthcheck, ...) on ``node``."""
    sql = (
        "select phase, status, max(ts) from check_runs where node = ? and ts is not null"
        " group by phase order by phase"
    )
    with reading(db) as conn:
        rows = conn.execute(sql, (node,)).fetchall()
    return [LastCheck(str(p or ""), str(s or ""), float(ts)) for p, s, ts in rows]


def hook_run_counts(db: Source, node: str) -> dict[tuple[str, str], int]:
    """How many check runs the history holds for ``node``, by (phase, status)."""
    sql = "select phase, status, count(*) from check_runs where node = ? group by phase, status"
    with reading(db) as conn:
        rows = conn.execute(sql, (node,)).fetchall()
    return {(str(p or ""), str(s or "")): int(n) for p, s, n in rows}


def drain_state_counts(db: Source, node: str) -> dict[str, int]:
    """``drains`` rows of ``node`` by state (drained, suppressed, resumed, ...)."""
    sql = "select state, count(*) from drains where node = ? group by state"
    with reading(db) as conn:
        rows = conn.execute(sql, (node,)).fetchall()
    return {str(s or ""): int(n) for s, n in rows}


def drain_in_force(db: Source, node: str) -> DrainInForce | None:
    """slurmhealth's drain of ``node`` when its newest drain/resume row is a drain and no
    prolog ran after it (a prolog run means Slurm gave the node a job: someone resumed it,
    with ``scontrol`` perhaps). Slurm itself is not asked."""
    marks = ", ".join("?" * len(_DRAIN_STATES))
    sql = (
        f"select state, ts, reason from drains where node = ? and state in ({marks})"
        " order by ts desc, rowid desc limit 1"
    )
    with reading(db) as conn:
        row = conn.execute(sql, (node, *_DRAIN_STATES)).fetchone()
        if row is None or row[0] == "resumed":
            return None
        later = conn.execute(
            "select 1 from check_runs where node = ? and phase = 'prolog' and ts > ? limit 1",
            (node, row[1]),
        ).fetchone()
    return None if later else DrainInForce(float(row[1] or 0.0), str(row[2] or ""))


@dataclass(frozen=True)
class RemediationState:
    """The node's repair as its history knows it: steps by (action, outcome), whether a
    step is in progress (a reboot not yet validated), whether it waits for service."""

    counts: dict[tuple[str, str], int]
    in_progress: bool
    service_required: bool


def remediation_state(db: Source, node: str) -> RemediationState:
    """``remediations`` rows of ``node`` counted, and its newest step's meaning; "service
    required" lasts until a later resume (``drains`` row ``resumed``)."""
    with reading(db) as conn:
        try:
            rows = conn.execute(
                "select action, outcome, count(*) from remediations where node = ?"
                " group by action, outcome", (node,),
            ).fetchall()  # fmt: skip
        except sqlite3.OperationalError:  # a history from before migration 4
            return RemediationState({}, False, False)
        newest = conn.execute(
            "select action, outcome, ts from remediations where node = ?"
            " order by ts desc, rowid desc limit 1", (node,),
        ).fetchone()  # fmt: skip
        resumed = conn.execute(
            "select max(ts) from drains where node = ? and state = 'resumed'", (node,)
        ).fetchone()[0]
    counts = {(str(a or ""), str(o or "")): int(n) for a, o, n in rows}
    if newest is None:
        return RemediationState(counts, False, False)
    action, outcome, ts = newest
    service = action == "service_required" and (resumed is None or float(resumed) < float(ts))
    return RemediationState(counts, outcome == "rebooting", service)
