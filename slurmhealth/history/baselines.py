"""The ``baselines`` table: benchmark results of a node, written and read back.

``baseline/`` parses and compares; this module is how its results reach the history.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from slurmhealth.errors import StoreError
from slurmhealth.history.batch import Batch
from slurmhealth.history.reader import Source, dicts, reading, where_clause
from slurmhealth.history.writer import History


class Measured(Protocol):
    """One benchmark number (``baseline.model.Measurement``)."""

    @property
    def metric(self) -> str: ...
    @property
    def value(self) -> float: ...
    @property
    def unit(self) -> str: ...
    @property
    def gpu(self) -> int | None: ...


def add_baselines(
    history: History,
    kind: str,
    measurements: Iterable[Measured],
    *,
    ts: float,
    node: str,
    gpu_model: str | None,
    label: str | None,
    source: str | None,
) -> int:
    """Write one ``baselines`` row per measurement, in one batch (spooled when the database
    is unwritable). Returns the number of rows."""
    rows = [
        ("baselines", {"ts": ts, "node": node, "kind": kind, "metric": m.metric,
                       "value": float(m.value), "unit": m.unit, "gpu_model": gpu_model or None,
                       "gpu": m.gpu, "label": label or None, "source": source or None,
                       "printed": getattr(m, "printed", None)})
        for m in measurements
    ]  # fmt: skip
    if rows:
        history.write(Batch(inserts=rows))
    return len(rows)


def baseline_rows(
    db: Source, node: str | None = None, kind: str | None = None, metric: str | None = None
) -> list[dict[str, Any]]:
    """``baselines`` rows, oldest first; none from a history that has no such table yet."""
    where, params = where_clause((("node = ?", node), ("kind = ?", kind), ("metric = ?", metric)))
    sql = f"select * from baselines{where} order by ts, id"
    try:
        with reading(db) as conn:
            return list(dicts(conn, "baselines", sql, params))
    except StoreError as exc:
        if "no such table" in str(exc.__cause__):
            return []  # a history never written to by this version
        raise
