"""The pairwise sweep in the history: its record (``kv`` key ``sweep:<id>``: settings,
every test's result, the verdict) and its measurements as ``baselines`` rows (label
``sweep:<id>``), so a sweep's numbers join the node's baselines; read back by id.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from slurmhealth.history.batch import Batch
from slurmhealth.history.reader import Source, dicts, reading
from slurmhealth.history.writer import History

KEY_PREFIX = "sweep:"
_WARN = 20  # Severity.WARN: findings at or above it are evidence


def add_sweep(
    history: History,
    sweep_id: str,
    record: Mapping[str, Any],
    baselines: Sequence[Mapping[str, Any]],
) -> None:
    """The sweep's record and its ``baselines`` rows in one batch (spooled when the
    database is unwritable)."""
    rows = [("baselines", dict(r)) for r in baselines]
    history.write(Batch(inserts=rows, kv={KEY_PREFIX + sweep_id: dict(record)}))


def sweep_record(db: Source, sweep_id: str) -> dict[str, Any] | None:
    """The stored record of sweep ``sweep_id``, or None."""
    with reading(db) as conn:
        row = conn.execute("select value from kv where key = ?", (KEY_PREFIX + sweep_id,))
        found = row.fetchone()
    if found is None:
        return None
    value = json.loads(found[0])
    return value if isinstance(value, dict) else None


def sweep_list(db: Source) -> list[tuple[str, float]]:
    """``(id, stored at)`` of every sweep, newest first."""
    sql = "select key, updated from kv where key like ? order by updated desc"
    with reading(db) as conn:
        rows = conn.execute(sql, (KEY_PREFIX + "%",)).fetchall()
    return [(str(k)[len(KEY_PREFIX) :], float(ts or 0.0)) for k, ts in rows]


def node_findings(db: Source, node: str, since: float, limit: int = 5) -> list[dict[str, Any]]:
    """``node``'s findings of warn or worse since ``since`` (UTC s), newest first: what
    the checks saw of its GPUs and HCAs (``ib_errors mlx5_1/1 ...``)."""
    sql = (
        "select ts, check_name, severity, gpu, message, evidence from findings"
        " where node = ? and ts >= ? and severity_value >= ? order by ts desc, id desc limit ?"
    )
    with reading(db) as conn:
        return list(dicts(conn, "findings", sql, (node, since, _WARN, int(limit))))
