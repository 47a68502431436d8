"""Per-GPU rollups of a job's samples: one ``sample_rollups`` row per (job, node, GPU,
:data:`BUCKET_S` bucket), updated by every write of ``samples`` rows in the same
transaction (``batch.apply``: direct writes and spool ingests alike).

A row holds count, sum, min and max of utilisation and power, the extremes of the other
columns, the OR of the clock-event reasons and how many samples showed each reason
(``r_<reason>``), a histogram of utilisation (``h<bin>``, bins of :data:`HIST_WIDTH` %, for
percentiles) and the idle/busy marks that count swings: within the bucket, and across its
start (``mark_in``: the GPU's last mark before it, carried from the previous bucket).
All in plain columns: a job's per-GPU stats are one SQL aggregate over O(buckets) rows,
not O(samples), and survive the raw samples' retention (``history.retention``). UTC s.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any

from slurmhealth.model import CLOCK_EVENT_REASONS

BUCKET_S = 300
HIST_WIDTH = 5  # utilisation histogram bins: 0-4, 5-9, ..., 95-99, 100
IDLE_PCT, BUSY_PCT = 10.0, 90.0  # a swing: utilisation crossing between these

# rollup column -> (samples column, how two values combine)
_EXTREMES: dict[str, tuple[str, Any]] = {
    "util_min": ("util_pct", min), "util_max": ("util_pct", max),
    "power_min": ("power_w", min), "power_max": ("power_w", max),
    "temp_max": ("temp_c", max), "margin_min": ("margin_c", min),
    "mem_max": ("mem_used_bytes", max), "pcie_gen_min": ("pcie_gen", min),
    "pcie_width_min": ("pcie_width", min), "nvlink_active_min": ("nvlink_active", min),
    "nvlink_errors_min": ("nvlink_errors", min), "nvlink_errors_max": ("nvlink_errors", max),
    "pcie_replay_min": ("pcie_replay", min), "pcie_replay_max": ("pcie_replay", max),
}  # fmt: skip
_SUMS = {"util": "util_pct", "power": "power_w"}  # <name>_n, <name>_sum
HIST = tuple(f"h{i}" for i in range(100 // HIST_WIDTH + 1))
REASONS = {f"r_{name}": bit for name, bit in CLOCK_EVENT_REASONS.items()}
_COUNTS = ("n", "util_n", "power_n", "swings", *HIST, *REASONS)  # summed when merged
KEY = ("job_id", "node", "gpu", "bucket")
COLUMNS = (
    *KEY, "uuid", "n", "ts_first", "ts_last", "util_n", "util_sum", "power_n", "power_sum",
    *_EXTREMES, "reasons_or", *HIST, *REASONS, "mark_in", "mark_first", "mark_last", "swings",
)  # fmt: skip
_TYPES = {"job_id": "TEXT NOT NULL", "node": "TEXT NOT NULL", "gpu": "INTEGER NOT NULL",
          "bucket": "INTEGER NOT NULL", "uuid": "TEXT", "mark_in": "TEXT",
          "mark_first": "TEXT", "mark_last": "TEXT",
          **dict.fromkeys(("ts_first", "ts_last", "util_sum", "power_sum", "util_min",
                           "util_max", "power_min", "power_max", "temp_max", "margin_min"),
                          "REAL")}  # fmt: skip
# (REAL: sqlite keeps 5000.0 as 5000 in a NUMERIC column, and 5000 / 100 divides as integers)
CREATE_SQL = (
    "CREATE TABLE IF NOT EXISTS sample_rollups ("
    + ", ".join(f"{c} {_TYPES.get(c, 'NUMERIC')}" for c in COLUMNS)
    + f", PRIMARY KEY ({', '.join(KEY)})) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS idx_sample_rollups_bucket ON sample_rollups (bucket)",
)
_SELECT = f"SELECT {', '.join(COLUMNS)} FROM sample_rollups WHERE " + " AND ".join(
    f"{c} = ?" for c in KEY
)
_PREVIOUS = (
    "SELECT mark_in, mark_last FROM sample_rollups WHERE job_id = ? AND node = ? AND gpu = ?"
    " AND bucket < ? ORDER BY bucket DESC LIMIT 1"
)
_UPSERT = (
    f"INSERT OR REPLACE INTO sample_rollups ({', '.join(COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(COLUMNS))})"
)


def util_bin(pct: float) -> int:
    """The index in :data:`HIST` of the bin holding ``pct`` % (clamped to 0-100)."""
    return int(min(max(pct, 0.0), 100.0) // HIST_WIDTH)


def bucket_of(ts: float) -> int:
    return int(ts // BUCKET_S) * BUCKET_S


def _mark(util: float) -> str | None:
    return "l" if util < IDLE_PCT else "h" if util > BUSY_PCT else None


def of_samples(key: tuple[str, str, int, int], rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The rollup of ``rows`` (``samples`` rows of one GPU and bucket, in time order)."""
    out: dict[str, Any] = dict(zip(KEY, key, strict=True))
    ts = [float(r["ts"]) for r in rows]
    out.update(uuid=next((r["uuid"] for r in reversed(rows) if r.get("uuid")), None),
               n=len(rows), ts_first=min(ts), ts_last=max(ts))  # fmt: skip
    values = {c: [v for r in rows if (v := r.get(c)) is not None] for c in {*_SUMS.values(),
              *(col for col, _ in _EXTREMES.values())}}  # fmt: skip
    for name, col in _SUMS.items():
        out[f"{name}_n"], out[f"{name}_sum"] = len(values[col]), sum(values[col])
    for rcol, (col, how) in _EXTREMES.items():
        out[rcol] = how(values[col]) if values[col] else None
    masks = [int(m) for r in rows if (m := r.get("clock_reasons"))]
    orred = 0
    for m in masks:
        orred |= m
    out["reasons_or"] = orred if masks or any(r.get("clock_reasons") == 0 for r in rows) else None
    for col, bit in REASONS.items():
        out[col] = sum(1 for m in masks if m & bit)
    util = values["util_pct"]
    out.update(dict.fromkeys(HIST, 0))
    for u in util:
        out[HIST[util_bin(u)]] += 1
    marks = "".join(m for u in util if (m := _mark(u)))
    out["mark_in"] = None
    out["mark_first"], out["mark_last"] = (marks[0], marks[-1]) if marks else (None, None)
    out["swings"] = sum(1 for a, b in itertools.pairwise(marks) if a != b)
    return out


def merge(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Two rollups of the same key as one; ``b`` holds the later samples."""
    out = dict(a)
    out["uuid"] = b["uuid"] or a["uuid"]
    for col in (*_COUNTS, "util_sum", "power_sum"):
        out[col] = (a[col] or 0) + (b[col] or 0)
    for col, how in (("ts_first", min), ("ts_last", max)):
        out[col] = how(a[col], b[col])
    for col, (_, how) in _EXTREMES.items():
        both = [v for v in (a[col], b[col]) if v is not None]
        out[col] = how(both) if both else None
    ors = [v for v in (a["reasons_or"], b["reasons_or"]) if v is not None]
    out["reasons_or"] = (ors[0] | ors[-1]) if ors else None
    turn = a["mark_last"] and b["mark_first"] and a["mark_last"] != b["mark_first"]
    out["swings"] += 1 if turn else 0
    out["mark_first"] = a["mark_first"] or b["mark_first"]
    out["mark_last"] = b["mark_last"] or a["mark_last"]
    return out


def decode(row: Iterable[Any]) -> dict[str, Any]:
    """A stored ``sample_rollups`` row (in :data:`COLUMNS` order) as a rollup dict."""
    return dict(zip(COLUMNS, row, strict=True))


def group(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, int, int], list[Any]]:
    """GPU ``samples`` rows by rollup key, each group in the given (time) order."""
    groups: dict[tuple[str, str, int, int], list[Any]] = {}
    for r in rows:
        if r.get("gpu") is None or r.get("ts") is None:
            continue  # a task row, or one without a time: nothing to roll up
        key = (str(r.get("job_id") or ""), str(r.get("node") or ""), int(r["gpu"]),
               bucket_of(float(r["ts"])))  # fmt: skip
        groups.setdefault(key, []).append(r)
    return groups


def add(conn: sqlite3.Connection, rows: Iterable[Mapping[str, Any]]) -> None:
    """Fold GPU ``samples`` rows into their rollups (inside the caller's transaction)."""
    for key, part in group(rows).items():
        rollup = of_samples(key, part)
        old = conn.execute(_SELECT, key).fetchone()
        if old is not None:
            rollup = merge(decode(old), rollup)
        else:  # a new bucket: the GPU's last mark before it, for a swing at its start
            prev = conn.execute(_PREVIOUS, key).fetchone()
            rollup["mark_in"] = (prev[1] or prev[0]) if prev else None
        conn.execute(_UPSERT, [rollup[c] for c in COLUMNS])
