"""Benchmark results in the node's history (table ``baselines``), and read back fleet-wide.

A metric is lower-is-better by naming convention only (``*_lat_p50`` / ``*_lat_p99``, and
perftest's latencies ``*_us``, also per size: ``ib_send_lat.lat_typical_us@2``); nothing
extra is stored. ``detail`` of a measurement is not stored.
"""

from __future__ import annotations

import time
from typing import Any

from slurmhealth.baseline.model import ParseResult
from slurmhealth.config import Config

LOWER_IS_BETTER_SUFFIXES = ("_lat_p50", "_lat_p99", "_us")


def higher_is_better(metric: str) -> bool:
    """False for latency percentiles (``fio.randread.read_lat_p99``) and latencies in
    microseconds (``ib_write_lat.lat_typical_us@2``), True otherwise."""
    return not metric.partition("@")[0].endswith(LOWER_IS_BETTER_SUFFIXES)


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
    """Record one ``baselines`` row per measurement in ``node``'s history, in one batch.
    Returns the number of rows (written, or spooled when the database is unwritable)."""
    from slurmhealth.history import History
    from slurmhealth.history.baselines import add_baselines

    now = time.time() if ts is None else ts
    with History.for_node(cfg, node) as history:
        history.refuse_newer()
        return add_baselines(history, kind, result.measurements, ts=now, node=node,
                             gpu_model=gpu_model, label=label, source=source)  # fmt: skip


def rows(
    cfg: Config,
    node: str | None = None,
    kind: str | None = None,
    metric: str | None = None,
) -> list[dict[str, Any]]:
    """Baseline rows of every reachable history (``history_paths``), oldest first."""
    from slurmhealth.history.read import Reader, baseline_rows, history_paths

    out: list[dict[str, Any]] = []
    for path in history_paths(cfg, [node] if node else []):
        with Reader(path) as db:
            out += baseline_rows(db, node=node, kind=kind, metric=metric)
    out.sort(key=lambda r: (r["ts"], r["id"]))
    return out
