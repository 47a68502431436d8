"""Prometheus' answers about one job, per GPU: the arithmetic of ``report.prometheus``
(sums and counts per plot stride, the sampling step, the p5 by sample count, the plot
points, each GPU's :class:`GpuStats`), kept apart so that each module stays small."""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from slurmhealth.diagnose.facts import GpuStats
from slurmhealth.final_series import STATS, decode
from slurmhealth.history.rollups import HIST_WIDTH, util_bin
from slurmhealth.prom_client import Labels, Matrix, Vector

Key = tuple[str, int]  # (node, GPU index)
Points = list[tuple[float, float | None, float | None]]  # (ts, util %, power W)


def key_of(labels: Labels) -> Key | None:
    try:
        return labels["node"], int(labels["gpu"])
    except (KeyError, ValueError):
        return None  # a job-level series (gpu "") or one without the labels


def per_gpu(vector: Vector, how: Callable[[Iterable[float]], float]) -> dict[Key, float]:
    """One value per GPU from its series (a GPU's labels may change: a new uuid)."""
    found: dict[Key, list[float]] = {}
    for labels, value in vector:
        if (key := key_of(labels)) is not None and not math.isnan(value):
            found.setdefault(key, []).append(value)
    return {key: how(values) for key, values in found.items()}


class Summed:
    """Per GPU: the sum and count of one series kind in each plot stride, and in all."""

    def __init__(self, sums: Matrix, counts: Matrix) -> None:
        self.sums, self.counts = _by_time(sums), _by_time(counts)
        self.n = {key: n for key, at in self.counts.items() if (n := sum(at.values()))}

    def mean(self, key: Key) -> float | None:
        if not self.n.get(key):
            return None
        return sum(self.sums.get(key, {}).values()) / self.n[key]

    def at(self, key: Key) -> Callable[[float], float | None]:
        """The GPU's mean in the stride ending at a time (None: no sample there)."""
        sums, counts = self.sums.get(key, {}), self.counts.get(key, {})
        return lambda t: sums[t] / n if (n := counts.get(t)) and t in sums else None


def _by_time(matrix: Matrix) -> dict[Key, dict[float, float]]:
    """GPU -> time -> value (a GPU's several series added up); NaN left out."""
    out: dict[Key, dict[float, float]] = {}
    for labels, points in matrix:
        if (key := key_of(labels)) is None:
            continue
        if key in out:  # a second series of the GPU (its uuid changed): added up
            at = out[key]
            for t, v in points:
                at[t] = at.get(t, 0.0) + v
        else:
            out[key] = dict(points)
    for key, at in out.items():
        if any(v != v for v in at.values()):
            out[key] = {t: v for t, v in at.items() if v == v}
    return out


def throttle_counts(vector: Vector) -> dict[Key, dict[str, float]]:
    out: dict[Key, dict[str, float]] = {}
    for labels, n in vector:
        if (key := key_of(labels)) is not None and labels.get("reason") and n > 0:
            reasons = out.setdefault(key, {})
            reasons[labels["reason"]] = reasons.get(labels["reason"], 0.0) + n
    return out


def sampling(matrix: Matrix) -> tuple[dict[str, float], dict[str, float]]:
    """Node -> the median spacing of its last samples (s), and the sidecar's sample count."""
    stamps: dict[str, set[float]] = {}
    totals: dict[str, float] = {}
    for labels, points in matrix:
        node = labels.get("node", "")
        stamps.setdefault(node, set()).update(ts for ts, _ in points)
        counted = [v for _, v in points if not math.isnan(v)]
        totals[node] = max([totals.get(node, 0.0), *counted])
    steps = {}
    for node, ts in stamps.items():
        gaps = [b - a for a, b in itertools.pairwise(sorted(ts)) if b > a]
        if gaps:
            steps[node] = statistics.median(gaps)
    return steps, totals


def p5_of(answers: Mapping[str, Any], counts: Mapping[Key, float]) -> dict[Key, float]:
    """Each GPU's quantile from the query made for its sample count (else the plain one)."""
    out: dict[Key, float] = {}
    for name, vector in sorted(answers.items(), key=lambda item: item[0] == "p5:"):
        if not name.startswith("p5:"):
            continue
        for key, q in per_gpu(vector, min).items():
            if key in counts and (name == "p5:" or f"p5:{int(counts[key])}" == name):
                out.setdefault(key, q)
    return out


def raw_series(util: Matrix, power: Matrix) -> dict[Key, Points]:
    """(ts, utilisation %, power W) per GPU from every sample, in time order."""
    cols = [_by_key(util, 100.0), _by_key(power, 1.0)]
    out: dict[Key, Points] = {}
    for key in cols[0].keys() | cols[1].keys():
        u, p = cols[0].get(key, {}), cols[1].get(key, {})
        if list(u) == list(p):  # the usual: both at every time, in time order
            out[key] = list(zip(u, u.values(), p.values(), strict=True))
            if any(a > b for a, b in itertools.pairwise(u)):
                out[key].sort()
        else:
            out[key] = [(t, u.get(t), p.get(t)) for t in sorted(u.keys() | p.keys())]
    return out


def _by_key(matrix: Matrix, scale: float) -> dict[Key, dict[float, float]]:
    """GPU -> time -> value x ``scale`` (NaN left out; a GPU's later series win a time)."""
    out: dict[Key, dict[float, float]] = {}
    for labels, values in matrix:
        if (key := key_of(labels)) is not None:
            out.setdefault(key, {}).update((t, v * scale) for t, v in values if v == v)
    return out


def stride_end(t: float, end: float) -> float:
    """The plot time of the stride evaluated at ``t`` (1 ms before its end: the end, a
    whole second), never after the job's ``end``."""
    return min(float(round(t)), end)


def strided_series(summed: Mapping[str, Summed], end: float) -> dict[Key, Points]:
    """(ts, utilisation %, power W) per GPU: the means of each plot stride."""
    util, power = summed["util"], summed["power"]
    out = {}
    for key in set(util.counts) | set(power.counts):
        u, p = util.at(key), power.at(key)
        times = sorted({*util.counts.get(key, ()), *power.counts.get(key, ())})
        out[key] = [
            (stride_end(t, end), None if (v := u(t)) is None else v * 100.0, p(t)) for t in times
        ]
    return out


def uuids_of(answers: Iterable[Any]) -> dict[Key, str]:
    """Each GPU's uuid label (the greatest, as the history's ``max(uuid)``)."""
    out: dict[Key, str] = {}
    for answer in answers:
        for labels, _ in answer:
            if (key := key_of(labels)) is not None and (uuid := labels.get("uuid")):
                out[key] = max(out.get(key, uuid), uuid)
    return out


def bin_floor(q: float) -> float:
    """The lower edge of the history's utilisation bin holding ``q`` % (rollups.HIST)."""
    return float(util_bin(round(q, 6)) * HIST_WIDTH)  # rounded: a ratio x 100 is inexact


def gpu_stats_of(
    key: Key, v: Mapping[str, float | None], summed: Mapping[str, Summed], p5: float | None,
    swings: float | None,
) -> GpuStats:  # fmt: skip
    def pct(x: float | None) -> float | None:
        return None if x is None else x * 100.0

    def whole(x: float | None) -> int | None:
        return None if x is None else round(x)

    util_min, util_max = pct(v["util_min"]), pct(v["util_max"])
    if p5 is not None:  # as report.collect: the bin's edge, within the samples' range
        p5 = bin_floor(p5 * 100.0)
        p5 = max(p5, util_min) if util_min is not None else p5
        p5 = min(p5, util_max) if util_max is not None else p5
    return GpuStats(
        gpu=key[1],
        util_mean=pct(summed["util"].mean(key)),
        util_p5=p5,
        util_min=util_min,
        util_max=util_max,
        util_swings=int(swings or 0),
        mem_peak_bytes=whole(v["mem_peak"]),
        mem_total_bytes=whole(v["mem_total"]),
        power_mean_w=summed["power"].mean(key),
        temp_max_c=v["temp_max"],
        margin_min_c=v["margin_min"],
        pcie_gen_min=whole(v["pcie_gen_min"]),
        pcie_width_min=whole(v["pcie_width_min"]),
        nvlink_errors_delta=max(0, whole(v["nvlink"]) or 0),
        pcie_replays_delta=max(0, whole(v["replay"]) or 0),
    )


_WHOLE = frozenset(f.name for f in dataclasses.fields(GpuStats) if f.type in ("int", "int | None"))


def _published(key: Key, got: Mapping[str, Any]) -> GpuStats:
    whole: dict[str, Any] = {
        k: round(v) if k in _WHOLE and isinstance(v, float) else v for k, v in got.items()
    }
    return GpuStats(gpu=key[1], **whole)


def final_stats(stats: Vector, throttle: Vector) -> dict[Key, GpuStats]:
    """Each GPU's stats as its node's epilog published them (``final_series``, ``series``
    mode)."""
    fields: dict[Key, dict[str, Any]] = {}
    for labels, value in stats:
        name = STATS.get(labels.get("stat", ""))
        if name is None or (key := key_of(labels)) is None or math.isnan(value):
            continue
        got = fields.setdefault(key, {"uuid": labels.get("uuid") or None})
        got[name] = value
    for key, reasons in throttle_counts(throttle).items():
        if key in fields:
            fields[key]["throttle_seconds"] = reasons
    return {key: _published(key, got) for key, got in fields.items()}


def record_stats(records: Vector, gpus: Mapping[str, frozenset[int]] | None) -> dict[Key, GpuStats]:
    """Each GPU's stats from the job's record series (``final_series.record``, ``info``
    mode), only those of ``gpus`` (node -> GPU indices; ``None``: all)."""
    out: dict[Key, GpuStats] = {}
    for labels, _ in records:
        node = labels.get("node", "")
        for index, got in decode(labels).items():
            if gpus is None or index in gpus.get(node, ()):
                out[node, index] = _published((node, index), got)
    return out
