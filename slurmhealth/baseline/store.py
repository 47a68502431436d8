"""Benchmark results in the node's history (table ``baselines``), and read back fleet-wide.

A metric is lower-is-better by naming convention only (``*_lat_p50`` / ``*_lat_p99``);
nothing extra is stored. ``detail`` of a measurement is not stored.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from slurmhealth.baseline.model import ParseResult
from slurmhealth.config import Config
from slurmhealth.errors import StoreError

LOWER_IS_BETTER_SUFFIXES = ("_lat_p50", "_lat_p99")


def higher_is_better(metric: str) -> bool:
    """False for latency percentiles (``fio.randread.read_lat_p99``), True otherwise."""
    return not metric.endswith(LOWER_IS_BETTER_SUFFIXES)


def ingest(
    cfg: Config,
    kind: str,
    result: ParseResult,
    *,
    node: str,
    gpu_model: str | None,
    label: str | None,
    source: str | None,
    ts: float | None = None,
) -> int:
    """Write one ``baselines`` row per measurement into ``node``'s history, in one batch.
    Returns the number of rows (written, or spooled when the database is unwritable)."""
    from slurmhealth.store import Batch, History

    now = time.time() if ts is None else ts
    rows: list[tuple[str, dict[str, Any]]] = [
        (
            "baselines",
            {
                "ts": now,
                "node": node,
                "kind": kind,
                "metric": m.metric,
                "value": float(m.value),
                "unit": m.unit,
                "gpu_model": gpu_model or None,
                "gpu": m.gpu,
                "label": label or None,
                "source": source or None,
            },
        )
        for m in result.measurements
    ]
    if not rows:
        return 0
    with History(cfg.db_path(node), spool_path=cfg.spool_path(node) or None) as history:
        history.write(Batch(inserts=rows))
    return len(rows)


def rows(
    cfg: Config,
    node: str | None = None,
    kind: str | None = None,
    metric: str | None = None,
) -> list[dict[str, Any]]:
    """Baseline rows of every reachable history (``history_paths``), oldest first."""
    from slurmhealth.report.collect import connect, history_paths

    clauses: list[str] = []
    params: list[Any] = []
    for column, value in (("node", node), ("kind", kind), ("metric", metric)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    where = f" where {' and '.join(clauses)}" if clauses else ""
    sql = f"select * from baselines{where} order by ts, id"
    out: list[dict[str, Any]] = []
    for path in history_paths(cfg, [node] if node else []):
        try:
            conn = connect(path)
            try:
                out += [dict(r) for r in conn.execute(sql, params)]
            finally:
                conn.close()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                continue  # a history never written to by this version
            raise StoreError(f"{path}: {exc}") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"{path}: {exc}") from exc
    out.sort(key=lambda r: (r["ts"], r["id"]))
    return out
