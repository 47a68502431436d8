"""A job's per-GPU stats from Prometheus: the sidecars' series by ``job_id``
(docs/metrics.md), for a report made where no node history is in reach (a login node).

:meth:`PromSource.gpu_stats` gives the :class:`GpuStats` the node histories give
(``report.collect``), field by field the same definitions, from a handful of range
functions over the job's window (``count_over_time``, ``sum_over_time``, ``min_`` and
``max_over_time``, ``quantile_over_time``) evaluated once at its end: their cost grows with
the samples Prometheus holds, never with what comes back. Then, at the same definitions:

- ``util_p5``: the history keeps a 5 %-bin histogram and reports the lower edge of the bin
  holding the sample of rank ``int(0.05 * (n - 1))``; here ``quantile_over_time`` at exactly
  that rank (one query per distinct sample count), floored to the same bin;
- ``throttle_seconds``: samples that showed the reason (``gpu_clock_event_active``, a series
  only while it holds) x the sampling step (the median spacing of the job's last samples);
- ``util_swings``: a subquery at half the sampling step counts the changes of the
  idle (< 10 %) / busy (> 90 %) mark, skipping the samples between. It costs one evaluation
  per GPU and step, so it runs only within :data:`SWING_BUDGET` evaluations; beyond, it is
  0 and named in :attr:`PromSource.skipped`;
- ``nvlink_active_min``: None (Prometheus holds the links down, not the links a GPU has).

A series Prometheus does not have leaves its fields None (0 for the deltas). Prometheus
down, slow or refusing: :class:`PrometheusError`, one line.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from slurmhealth.diagnose.facts import GpuStats
from slurmhealth.errors import UsageError
from slurmhealth.history.rollups import BUCKET_S, BUSY_PCT, HIST_WIDTH, IDLE_PCT
from slurmhealth.prom_client import Call, Labels, Matrix, PromClient, Vector
from slurmhealth.report.collect import HW_THROTTLE, MAX_SERIES

P = "slurmhealth_"
SLACK_S = 120.0  # the sidecar samples from the prolog to the epilog, around Slurm's times
STEP_WINDOW_S = 900.0  # the sampling step: the median spacing of the last 15 minutes
SWING_BUDGET = 300_000  # subquery evaluations (GPUs x steps) the swing count may cost
MAX_P5_QUERIES = 16  # distinct sample counts given their exact rank; the rest: plain 5 %
_JOB_ID = re.compile(r"[0-9A-Za-z_.+-]{1,64}")
# the idle/busy mark as floor((u - idle) / span): -1 idle, 0 between, 1 busy (span nudged
# up by 1e-7 so that exactly BUSY_PCT stays "between", as the history counts it)
_IDLE, _SPAN = IDLE_PCT / 100, (BUSY_PCT - IDLE_PCT) / 100 * (1 + 1e-7)

Key = tuple[str, int]  # (node, GPU index)

# name -> (function, series, how a GPU's several series combine)
_STATS: dict[str, tuple[str, str, Callable[[Iterable[float]], float]]] = {
    "samples": ("count_over_time", "gpu_up", sum),
    "util_sum": ("sum_over_time", "gpu_utilization_ratio", sum),
    "util_n": ("count_over_time", "gpu_utilization_ratio", sum),
    "util_min": ("min_over_time", "gpu_utilization_ratio", min),
    "util_max": ("max_over_time", "gpu_utilization_ratio", max),
    "power_sum": ("sum_over_time", "gpu_power_watts", sum),
    "power_n": ("count_over_time", "gpu_power_watts", sum),
    "mem_peak": ("max_over_time", "gpu_memory_used_bytes", max),
    "mem_total": ("max_over_time", "gpu_memory_total_bytes", max),
    "temp_max": ("max_over_time", "gpu_temperature_celsius", max),
    "margin_min": ("min_over_time", "gpu_thermal_margin_celsius", min),
    "pcie_gen_min": ("min_over_time", "gpu_pcie_link_gen", min),
    "pcie_width_min": ("min_over_time", "gpu_pcie_link_width", min),
}  # fmt: skip
# counters whose growth over the job is a delta (as the history: max - min of the sum)
_DELTAS = {
    "nvlink": ("gpu_nvlink_errors_total", 'counter=~"replay|recovery"'),
    "replay": ("gpu_pcie_replay_errors_total", ""),
}


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _alternatives(values: Iterable[str]) -> str:
    """A PromQL regex literal matching exactly ``values``."""
    return _quote("|".join(re.escape(v) for v in sorted(set(values))))


def _key(labels: Labels) -> Key | None:
    try:
        return labels["node"], int(labels["gpu"])
    except (KeyError, ValueError):
        return None  # a job-level series (gpu "") or one without the labels


def _per_gpu(vector: Vector, how: Callable[[Iterable[float]], float]) -> dict[Key, float]:
    """One value per GPU from its series (a GPU's labels may change: a new uuid)."""
    found: dict[Key, list[float]] = {}
    for labels, value in vector:
        if (key := _key(labels)) is not None and not math.isnan(value):
            found.setdefault(key, []).append(value)
    return {key: how(values) for key, values in found.items()}


class PromSource:
    """Per-GPU stats of a job from the Prometheus at ``url``; ``timeout_s`` bounds one
    :meth:`gpu_stats` call, all its queries together."""

    def __init__(self, url: str, timeout_s: float, *, client: PromClient | None = None) -> None:
        self.client = client or PromClient(url, timeout_s)
        self.timeout_s = timeout_s
        self.skipped: tuple[str, ...] = ()  # GpuStats fields the last call could not afford

    def gpu_stats(
        self, job_id: str, start: float, end: float, *, series_points: int = MAX_SERIES
    ) -> dict[str, tuple[GpuStats, ...]]:
        """Node -> its GPUs' stats (by index) over the job's window ``start``..``end`` (UTC
        s), each with a plot series of at most ``series_points`` points (0: none)."""
        sel, window, at = self._window(job_id, start, end)
        deadline = time.monotonic() + self.timeout_s
        first = self.client.gather(self._first_calls(sel, window, at), deadline)
        values = {name: _per_gpu(first[name], how) for name, (_, _, how) in _STATS.items()}
        for name in _DELTAS:
            values[name] = _per_gpu(first[name], sum)
        throttle = _throttle_counts(first["throttle"])
        keys = sorted(set().union(*values.values(), throttle))
        steps = _steps(first["steps"])
        step = statistics.median(steps.values()) if steps else None
        calls = self._p5_calls(sel, window, at, values["util_n"])
        swings_expr = self._swings_expr(sel, window, step, len(keys), end - start)
        if swings_expr is not None:
            calls["swings"] = partial(self.client.query, swings_expr, at)
        counts = {**values["util_n"], **values["samples"]}
        calls.update(self._series_calls(sel, window, start, at, counts, series_points))
        second = self.client.gather(calls, deadline)
        self.skipped = () if swings_expr is not None or not keys else ("util_swings",)
        p5 = _p5(second, values["util_n"])
        swings = _per_gpu(second.get("swings", []), sum)
        series = _series(second.get("series_util", []), second.get("series_power", []))
        out: dict[str, list[GpuStats]] = {}
        for key in keys:
            v = {name: found.get(key) for name, found in values.items()}
            stats = _gpu(key, v, first["samples"], p5.get(key), swings.get(key))
            node_step = steps.get(key[0], step) or 0.0
            throttled = {r: round(n * node_step, 1) for r, n in throttle.get(key, {}).items()}
            out.setdefault(key[0], []).append(
                _with(stats, throttle_seconds=throttled, series=tuple(series.get(key, ())))
            )
        return {node: tuple(gpus) for node, gpus in sorted(out.items())}

    def _window(self, job_id: str, start: float, end: float) -> tuple[str, str, float]:
        """The job's selector, the range of its window (with :data:`SLACK_S` either side)
        and the time it is evaluated at."""
        if not _JOB_ID.fullmatch(job_id):
            raise UsageError(f"job id {job_id!r} is not one Slurm gives (digits, _ + . -)")
        if not (math.isfinite(start) and math.isfinite(end)) or end < start:
            raise UsageError(f"job window {start!r}..{end!r} is not a time range")
        seconds = math.ceil(end - start + 2 * SLACK_S)
        return f"job_id={_quote(job_id)}", f"{seconds}s", end + SLACK_S

    def _first_calls(self, sel: str, window: str, at: float) -> dict[str, Call]:
        exprs = {
            name: f"{fn}({P}{series}{{{sel}}}[{window}])"
            for name, (fn, series, _) in _STATS.items()
        }
        for name, (series, extra) in _DELTAS.items():
            m = f"{P}{series}{{{sel}{',' + extra if extra else ''}}}[{window}]"
            exprs[name] = f"max_over_time({m}) - min_over_time({m})"
        reasons = _alternatives(HW_THROTTLE.values())
        exprs["throttle"] = (
            f"count_over_time({P}gpu_clock_event_active{{{sel},reason=~{reasons}}}[{window}])"
        )
        calls: dict[str, Call] = {
            name: partial(self.client.query, expr, at) for name, expr in exprs.items()
        }
        steps = f"{P}sidecar_samples_total{{{sel}}}[{STEP_WINDOW_S:.0f}s]"
        calls["steps"] = partial(self.client.query_samples, steps, at)
        return calls

    def _p5_calls(
        self, sel: str, window: str, at: float, counts: Mapping[Key, float]
    ) -> dict[str, Call]:
        """``quantile_over_time`` at the rank the history's p5 takes, ``int(0.05 * (n - 1))``
        (nudged 1e-6 up: no interpolation with the next sample), per distinct count ``n``."""
        by_count: dict[int, set[str]] = {}
        for (node, _), n in counts.items():
            by_count.setdefault(int(n), set()).add(node)
        ranked = sorted(by_count, key=lambda n: -len(by_count[n]))
        calls: dict[str, Call] = {}
        util = f"{P}gpu_utilization_ratio"
        for n in ranked[:MAX_P5_QUERIES]:
            phi = min(1.0, (int(0.05 * (n - 1)) + 1e-6) / (n - 1)) if n > 1 else 0.0
            nodes = _alternatives(by_count[n])
            expr = f"quantile_over_time({phi!r}, {util}{{{sel},node=~{nodes}}}[{window}])"
            calls[f"p5:{n}"] = partial(self.client.query, expr, at)
        if len(ranked) > MAX_P5_QUERIES:
            expr = f"quantile_over_time(0.05, {util}{{{sel}}}[{window}])"
            calls["p5:"] = partial(self.client.query, expr, at)
        return calls

    def _swings_expr(
        self, sel: str, window: str, step: float | None, gpus: int, seconds: float
    ) -> str | None:
        """Changes of the idle/busy mark at half the sampling step (each sample seen even
        when the scrapes jitter), or None when that costs more than :data:`SWING_BUDGET`."""
        if step is None or step <= 0:
            return None
        sub_ms = max(1, int(step * 500))
        if gpus * (seconds + 2 * SLACK_S) * 1000 / sub_ms > SWING_BUDGET:
            return None
        mark = f"floor(({P}gpu_utilization_ratio{{{sel}}} - {_IDLE!r}) / {_SPAN!r}) != 0"
        return f"changes(({mark})[{window}:{sub_ms}ms])"

    def _series_calls(
        self, sel: str, window: str, start: float, at: float, samples: Mapping[Key, float],
        points: int,
    ) -> dict[str, Call]:  # fmt: skip
        """Utilisation and power for the plots: every sample when a GPU has no more than
        ``points``, else means over strides of whole rollup buckets (as the history)."""
        if points <= 0 or not samples:
            return {}
        names = {"series_util": "gpu_utilization_ratio", "series_power": "gpu_power_watts"}
        if max(samples.values()) <= points:
            return {
                name: partial(self.client.query_samples, f"{P}{m}{{{sel}}}[{window}]", at)
                for name, m in names.items()
            }
        end = at - SLACK_S
        buckets = max(1, math.ceil((end - start) / BUCKET_S))
        stride = BUCKET_S * math.ceil(buckets / points)
        first, last = (
            (math.floor(start / stride) + 1) * stride,
            (math.floor(end / stride) + 1) * stride,
        )
        return {
            name: partial(
                self.client.query_range,
                f"avg_over_time({P}{m}{{{sel}}}[{stride}s])", first, last, stride,
            )
            for name, m in names.items()
        }  # fmt: skip


def _throttle_counts(vector: Vector) -> dict[Key, dict[str, float]]:
    out: dict[Key, dict[str, float]] = {}
    for labels, n in vector:
        if (key := _key(labels)) is not None and labels.get("reason") and n > 0:
            reasons = out.setdefault(key, {})
            reasons[labels["reason"]] = reasons.get(labels["reason"], 0.0) + n
    return out


def _steps(matrix: Matrix) -> dict[str, float]:
    """Node -> the median spacing of its last samples (s)."""
    stamps: dict[str, set[float]] = {}
    for labels, points in matrix:
        stamps.setdefault(labels.get("node", ""), set()).update(ts for ts, _ in points)
    out = {}
    for node, ts in stamps.items():
        ordered = sorted(ts)
        gaps = [b - a for a, b in itertools.pairwise(ordered) if b > a]
        if gaps:
            out[node] = statistics.median(gaps)
    return out


def _p5(answers: Mapping[str, Any], counts: Mapping[Key, float]) -> dict[Key, float]:
    """Each GPU's quantile from the query made for its sample count (else the plain one)."""
    out: dict[Key, float] = {}
    for name, vector in sorted(answers.items(), key=lambda item: item[0] == "p5:"):
        if not name.startswith("p5:"):
            continue
        for key, q in _per_gpu(vector, min).items():
            if key in counts and (name == "p5:" or f"p5:{int(counts[key])}" == name):
                out.setdefault(key, q)
    return out


def _series(
    util: Matrix, power: Matrix
) -> dict[Key, list[tuple[float, float | None, float | None]]]:
    """(ts, utilisation %, power W) per GPU, in time order."""
    points: dict[Key, dict[float, list[float | None]]] = {}
    for col, matrix, scale in ((0, util, 100.0), (1, power, 1.0)):
        for labels, values in matrix:
            if (key := _key(labels)) is None:
                continue
            at = points.setdefault(key, {})
            for ts, v in values:
                if not math.isnan(v):
                    at.setdefault(ts, [None, None])[col] = v * scale
    return {key: [(ts, *at[ts]) for ts in sorted(at)] for key, at in points.items()}  # type: ignore[misc]


def _bin_floor(q: float) -> float:
    """The lower edge of the history's utilisation bin holding ``q`` % (rollups.HIST)."""
    return float(int(min(max(round(q, 6), 0.0), 100.0) // HIST_WIDTH) * HIST_WIDTH)


def _gpu(
    key: Key, v: Mapping[str, float | None], up: Vector, p5: float | None, swings: float | None
) -> GpuStats:
    def pct(x: float | None) -> float | None:
        return None if x is None else x * 100.0

    def whole(x: float | None) -> int | None:
        return None if x is None else round(x)

    uuids = [u for labels, _ in up if _key(labels) == key and (u := labels.get("uuid"))]
    util_min, util_max = pct(v["util_min"]), pct(v["util_max"])
    if p5 is not None:
        p5 = _bin_floor(p5 * 100.0)
        p5 = min(
            max(p5, util_min if util_min is not None else p5),
            util_max if util_max is not None else p5,
        )
    util_n, power_n = v["util_n"] or 0, v["power_n"] or 0
    return GpuStats(
        gpu=key[1],
        uuid=max(uuids) if uuids else None,
        samples=int(v["samples"] or util_n),
        util_mean=100.0 * (v["util_sum"] or 0.0) / util_n if util_n else None,
        util_p5=p5,
        util_min=util_min,
        util_max=util_max,
        util_swings=int(swings or 0),
        mem_peak_bytes=whole(v["mem_peak"]),
        mem_total_bytes=whole(v["mem_total"]),
        power_mean_w=(v["power_sum"] or 0.0) / power_n if power_n else None,
        temp_max_c=v["temp_max"],
        margin_min_c=v["margin_min"],
        pcie_gen_min=whole(v["pcie_gen_min"]),
        pcie_width_min=whole(v["pcie_width_min"]),
        nvlink_errors_delta=max(0, whole(v["nvlink"]) or 0),
        pcie_replays_delta=max(0, whole(v["replay"]) or 0),
    )


def _with(stats: GpuStats, **changes: Any) -> GpuStats:
    return dataclasses.replace(stats, **changes)
