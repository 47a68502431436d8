"""Cumulative error counters remembered across runs, and their growth over a minimum window.

A rate from two reads seconds apart is noise: one NVLink replay between an epilog and the
next prolog five seconds later reads as 12/min. So every rate check judges the growth over
at least ``min_window_s`` seconds and ``min_count`` errors (thresholds of the check, shown by
``slurmhealth checks``); shorter evidence can warn, never fail.

The history (the sidecar's in memory; the prolog's stored between runs by :func:`pack` and
:func:`load` in the history's key-value table) is ``{"v": 2, "gpus": {uuid: {counter:
ring}}}``, a ring being ``[[ts, value], ...]`` oldest first. Reads of an unchanged value
collapse into the first and last of the run, points closer than an eighth of the window are
merged, and a point is dropped once a newer one is old enough to start the window, so a ring
holds about ten points whatever the sampling interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

from slurmhealth.checks.counter_reads import counters_of as counters_of
from slurmhealth.checks.engine import CheckContext, finding, readable
from slurmhealth.model import Finding, NodeSnapshot, Severity

VERSION = 2
FORGET_S = 30 * 86400.0  # a GPU not read this long (replaced, moved) is forgotten

History = dict[str, Any]
Ring = list[list[float]]


def pack(history: History) -> dict[str, Any]:
    """The history as stored: per GPU, the counters that did not move over one common span
    (most of them, most of the time: all read since the same run) as one value each, the
    others as rings."""
    gpus: dict[str, Any] = {}
    for uuid, rings in history.get("gpus", {}).items():
        span: list[float] = []
        quiet, moving = {}, {}
        for key, ring in rings.items():
            if 0 < len(ring) <= 2 and ring[0][1] == ring[-1][1]:
                span = span or [ring[0][0], ring[-1][0]]
                if ring[0][0] == span[0] and ring[-1][0] == span[1]:
                    quiet[key] = ring[0][1]
                    continue
            moving[key] = ring
        gpus[uuid] = {"span": span, "quiet": quiet, "rings": moving}
    return {"v": VERSION, "gpus": gpus}


def load(data: Any) -> History:
    """A history read back from storage (:func:`pack`); anything else (an older format, a
    damaged value) is an empty history: the window then starts again from this run. A GPU
    whose entry does not parse is dropped alone."""
    gpus: dict[str, dict[str, Ring]] = {}
    if isinstance(data, dict) and data.get("v") == VERSION and isinstance(data.get("gpus"), dict):
        for uuid, packed in data["gpus"].items():
            try:
                rings = {
                    str(key): [[float(ts), int(value)] for ts, value in ring]
                    for key, ring in packed["rings"].items()
                    if ring
                }
                if packed["quiet"]:
                    since, until = (float(ts) for ts in packed["span"])
                    for key, value in packed["quiet"].items():
                        v = int(value)  # ~450 counters on 8 GPUs: no comprehension each
                        rings[str(key)] = (
                            [[since, v]] if until == since else [[since, v], [until, v]]
                        )
            except (AttributeError, KeyError, TypeError, ValueError):
                continue
            gpus[str(uuid)] = rings
    return {"v": VERSION, "gpus": gpus}


def remember(
    history: History,
    snapshot: NodeSnapshot,
    window_s: float,
    counters: Mapping[str, Mapping[str, int]] | None = None,
) -> History:
    """Add the snapshot's counters (``counters`` when already read) to ``history``, in place;
    returned for convenience."""
    ts = round(snapshot.ts, 3)
    gpus: dict[str, dict[str, Ring]] = history.setdefault("gpus", {})
    for uuid, values in (counters_of(snapshot) if counters is None else counters).items():
        rings = gpus.setdefault(uuid, {})
        for key, value in values.items():
            ring = rings.get(key)
            if (
                ring
                and len(ring) >= 2
                and ring[-2][1] == ring[-1][1] == value
                and ts >= ring[-1][0]
            ):
                ring[-1][0] = ts  # unchanged: the run of equal reads grows
            else:
                rings[key] = _add(ring or [], ts, value, window_s)
    for uuid in [u for u, rings in gpus.items() if _newest(rings) < ts - FORGET_S]:
        del gpus[uuid]
    history["v"] = VERSION
    return history


def _newest(rings: Mapping[str, Ring]) -> float:
    """When the GPU was last read (its counters are remembered together)."""
    ring = next(iter(rings.values()), None)
    return ring[-1][0] if ring else -math.inf


def _add(ring: Ring, ts: float, value: float, window_s: float) -> Ring:
    if ring and (value < ring[-1][1] or ts < ring[-1][0]):
        ring = []  # the counter went back (driver reload, GPU reset) or the clock did
    # (a read equal to the last two never gets here: remember() moves their run's end itself)
    if len(ring) >= 2 and ts - ring[-2][0] < window_s / 8:
        ring[-1] = [ts, value]
    else:
        ring.append([ts, value])
    while len(ring) >= 2 and ring[1][0] <= ts - window_s:
        del ring[0]
    return ring


class Growth(NamedTuple):  # a tuple: cheaper to define than a frozen dataclass
    """How much a counter grew over the judged window, and whether that is evidence."""

    delta: float  # how many errors
    span_s: float
    enough: bool  # span >= min_window_s and delta >= min_count

    @property
    def per_s(self) -> float:
        return self.delta / self.span_s

    @property
    def per_min(self) -> float:
        return 60.0 * self.per_s


def rings_of(history: Mapping[str, Any] | None, uuid: str | None) -> Mapping[str, Ring]:
    """One GPU's remembered reads, by counter."""
    rings: Mapping[str, Ring] = ((history or {}).get("gpus") or {}).get(uuid or "", {})
    return rings


def growth(
    ring: Ring | None, now: float, value: int | None, th: Mapping[str, float]
) -> Growth | None:
    """The counter's growth from the newest remembered read at least ``min_window_s`` old
    (else the oldest: a short window, not evidence) to ``value`` at ``now``. None: no
    history, no growth, or the counter went back (a reset)."""
    if not ring or value is None or value <= ring[0][1]:
        return None
    ref = ring[0]
    for point in ring:
        if point[0] > now - th["min_window_s"]:
            break
        ref = point
    count, span = value - ref[1], now - ref[0]
    if count <= 0 or span <= 0:
        return None
    return Growth(count, span, span >= th["min_window_s"] and count >= th["min_count"])


RATE_THRESHOLDS = {"min_window_s": 300, "min_count": 5}
"""The evidence every rate check asks for by default (override per check)."""


def rate_warnings(
    ctx: CheckContext, th: Mapping[str, float], check: str, key: str, what: str
) -> list[Finding]:
    """One warning per GPU whose counter ``key`` grew at ``warn_per_min`` or more over
    enough evidence (``min_window_s``, ``min_count``); slower or shorter growth is silent."""
    out = []
    for g in readable(ctx):
        value = ctx.counters.get(g.uuid or "", {}).get(key)
        found = growth(rings_of(ctx.counter_history, g.uuid).get(key), ctx.snapshot.ts, value, th)
        if found is None or not found.enough or found.per_min < th["warn_per_min"]:
            continue
        out.append(
            finding(
                check,
                Severity.WARN,
                g,
                f"{found.delta:g} {what} in {found.span_s:.0f} s ({found.per_min:.3g}/min)",
                per_min=round(found.per_min, 3),
                count=found.delta,
                window_s=round(found.span_s, 3),
            )
        )
    return out
