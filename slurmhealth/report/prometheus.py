"""A job's per-GPU stats from Prometheus: the sidecars' series by ``job_id``, or where
they carry no job labels (``[metrics] job_labels = "info"``) the job's own samples of its
GPUs' series (``prom_spans``; docs/metrics.md), for a report made where no node history is
in reach (a login node).

:meth:`PromSource.gpu_stats` gives the :class:`GpuStats` the node histories give
(``report.collect``). First the stats each node's epilog published after the job
(``final_series``: the history's own numbers, two small queries whatever the job's
length), taken as they are, with plots of each stride's mean (``avg_over_time``; at most
:data:`MAX_PLOT_POINTS` a job). The nodes that published nothing (down before their
epilog, a missed scrape, a job still running) get field by field the same definitions
from range functions over the
job's window (Slurm's start and end, :data:`SLACK_S` wider either side: the sidecar samples
from the prolog to the epilog). Each reads every sample of one series kind once, so the
queries are chosen to read as few as the definitions allow:

- utilisation and power: ``sum_`` and ``count_over_time`` per plot stride (whole 5-minute
  rollup buckets, as the history's plots) in one range query each; their totals are the
  job's means, their ratios the plot's points (every sample for a short job);
- extremes: ``min_`` / ``max_over_time`` over the window; ``mem_total_bytes`` (constant)
  from the job's last minutes only;
- ``util_p5``: the history keeps a 5 %-bin histogram and reports the lower edge of the bin
  holding the sample of rank ``int(0.05 * (n - 1))``; here ``quantile_over_time`` at exactly
  that rank (one query per distinct sample count), floored to the same bin;
- counter deltas (NVLink replay + recovery, PCIe replays), as the history's max - min of a
  counter that only grows: its highest value in the job's last minutes minus its lowest in
  the first ones (:data:`EDGE_S`), never the whole window;
- ``samples``: the sidecar's own count (``sidecar_samples_total`` at the end);
  ``throttle_seconds``: samples that showed the reason (``gpu_clock_event_active``, a series
  only while it holds) x the sampling step (the median spacing of the last samples);
- ``util_swings``: a subquery at half the sampling step counts the changes of the idle
  (< 10 %) / busy (> 90 %) mark, skipping the samples between: one evaluation per GPU and
  step, so only within :data:`SWING_BUDGET`; beyond, 0 and named in ``skipped``;
- ``nvlink_active_min``: None (Prometheus holds the links down, not the links a GPU has).

A series Prometheus does not have leaves its fields None (0 for the deltas). Prometheus
down, slow or refusing: :class:`PrometheusError`, one line.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any

from slurmhealth import final_series
from slurmhealth.diagnose.facts import GpuStats
from slurmhealth.errors import UsageError
from slurmhealth.history.rollups import BUCKET_S, BUSY_PCT, IDLE_PCT
from slurmhealth.prom_client import Call, PromClient
from slurmhealth.report import prom_spans
from slurmhealth.report.collect import HW_THROTTLE, MAX_SERIES
from slurmhealth.report.prom_answers import (
    Key,
    Points,
    Summed,
    final_stats,
    gpu_stats_of,
    p5_of,
    per_gpu,
    raw_series,
    record_stats,
    sampling,
    stride_end,
    strided_series,
    throttle_counts,
    uuids_of,
)
from slurmhealth.report.prom_spans import EDGE_S, SLACK_S, Window

P = "slurmhealth_"
FINAL_S = 900.0  # after the job's end: when its nodes' epilogs publish its stats
SWING_BUDGET = 300_000  # subquery evaluations (GPUs x steps) the swing count may cost
MAX_P5_QUERIES = 16
# plot points of one job, all GPUs together (a 16-node x 8-GPU job keeps 300 per GPU; a
# 64-node one 75, over strides of whole rollup buckets), never under MIN_PLOT_POINTS a GPU
MAX_PLOT_POINTS, MIN_PLOT_POINTS = (
    128 * MAX_SERIES,
    60,
)  # distinct sample counts given their exact rank; the rest: plain 5 %
_JOB_ID = re.compile(r"[0-9A-Za-z_.+-]{1,64}")
# the idle/busy mark as floor((u - idle) / span): -1 idle, 0 between, 1 busy (span nudged
# up by 1e-7 so that exactly BUSY_PCT stays "between", as the history counts it)
_IDLE, _SPAN = IDLE_PCT / 100, (BUSY_PCT - IDLE_PCT) / 100 * (1 + 1e-7)


# name -> (function, series, how a GPU's several series combine), over the whole window
_EXTREMES: dict[str, tuple[str, str, Callable[[Iterable[float]], float]]] = {
    "util_min": ("min_over_time", "gpu_utilization_ratio", min),
    "util_max": ("max_over_time", "gpu_utilization_ratio", max),
    "mem_peak": ("max_over_time", "gpu_memory_used_bytes", max),
    "temp_max": ("max_over_time", "gpu_temperature_celsius", max),
    "margin_min": ("min_over_time", "gpu_thermal_margin_celsius", min),
    "pcie_gen_min": ("min_over_time", "gpu_pcie_link_gen", min),
    "pcie_width_min": ("min_over_time", "gpu_pcie_link_width", min),
}  # fmt: skip
_SUMMED = {"util": "gpu_utilization_ratio", "power": "gpu_power_watts"}
_DELTAS = {
    "nvlink": ("gpu_nvlink_errors_total", ',counter=~"replay|recovery"'),
    "replay": ("gpu_pcie_replay_errors_total", ""),
}


_quote, _alternatives = prom_spans.quote, prom_spans.alternatives


class PromSource:
    """Per-GPU stats of a job from the Prometheus at ``url``; ``timeout_s`` bounds one
    :meth:`gpu_stats` call, all its queries together."""

    def __init__(self, url: str, timeout_s: float, *, client: PromClient | None = None) -> None:
        self.client = client or PromClient(url, timeout_s)
        self.timeout_s = timeout_s
        self.skipped: tuple[str, ...] = ()  # GpuStats fields the last call could not afford

    def gpu_stats(
        self,
        job_id: str,
        start: float,
        end: float,
        *,
        series_points: int = MAX_SERIES,
        final: bool = True,
    ) -> dict[str, tuple[GpuStats, ...]]:
        """Node -> its GPUs' stats (by index) over the job's window ``start``..``end`` (UTC
        s), each with a plot series of at most ``series_points`` points (0: none). The
        stats a node's epilog published (``final_series``) are taken as they are; the other
        nodes' are computed from their series (``final=False``: every node's)."""
        w = _window(job_id, start, end, series_points)
        deadline = time.monotonic() + self.timeout_s
        self.skipped = ()  # (only the series path skips a field)
        w = self._attribute(w, deadline)
        done = self._final_stats(w, deadline) if final else {}
        nodes = {node for node, _ in done}
        rest = w.on(nodes, False)
        out: dict[str, list[GpuStats]] = {}
        if not done or self._has_series(rest, deadline):
            out = self._series_stats(rest, series_points, deadline)
        if done:
            counts = {key: float(stats.samples) for key, stats in done.items()}
            points = plot_points(series_points, len(done))
            stride = _window(job_id, start, end, points).stride
            plots = self._plots(
                dataclasses.replace(w, stride=stride).on(nodes, True), points, counts, deadline
            )
            for key, stats in sorted(done.items()):
                series = tuple(plots.get(key, ()))
                out.setdefault(key[0], []).append(dataclasses.replace(stats, series=series))
        return {
            node: tuple(sorted(gpus, key=lambda g: g.gpu)) for node, gpus in sorted(out.items())
        }

    def _attribute(self, w: Window, deadline: float) -> Window:
        return prom_spans.attribute(self.client, w, deadline)

    def _final_stats(self, w: Window, deadline: float) -> dict[Key, GpuStats]:
        """The stats the nodes' epilogs published after the job (final_series): the job's
        record series (``info`` mode, one per node, by its ``job_id``), and while its
        series carry its labels also the per-GPU stat series (``series`` mode)."""
        at, span = w.end + FINAL_S, f"{FINAL_S + SLACK_S:.0f}s"
        families = {"record": f"{final_series.RECORD}{{{w.job}}}"}
        if not w.spans:
            families.update(stat=f"{final_series.STAT}{{{w.sel}}}",
                            throttle=f"{final_series.THROTTLE}{{{w.sel}}}")  # fmt: skip
        calls = {name: partial(self.client.query, f"last_over_time({sel}[{span}])", at)
                 for name, sel in families.items()}  # fmt: skip
        found = self.client.gather(calls, deadline)
        gpus = {s.node: s.gpus for s in w.spans} if w.spans else None
        done = record_stats(found["record"], gpus)
        if w.spans:
            return done
        return {**final_stats(found["stat"], found["throttle"]), **done}

    def _has_series(self, w: Window, deadline: float) -> bool:
        """Whether any sidecar of the job exported series in ``w`` (one series per node)."""
        expr = f"count(count_over_time({w.jm('sidecar_samples_total')}[{w.span}]))"
        calls: dict[str, Call] = {"n": partial(self.client.query, expr, w.at)}
        return bool(self.client.gather(calls, deadline)["n"])

    def _plots(
        self, w: Window, series_points: int, counts: Mapping[Key, float], deadline: float
    ) -> dict[Key, Points]:
        """Utilisation and power to plot: every sample of a job short enough, else the
        mean of each stride (as the history's plots)."""
        if series_points <= 0:
            return {}
        if max(counts.values(), default=0) <= series_points:
            answers = self._clipped(w, self.client.gather(self._raw_calls(w), deadline))
            return raw_series(answers["raw_util"], answers["raw_power"])
        calls: dict[str, Call] = {}
        for name, series in _SUMMED.items():
            calls.update(self._strided_calls(w, name, "avg_over_time", series))
        answers = self._strided(w, self.client.gather(calls, deadline))
        plots = raw_series(answers["util"], answers["power"])
        return {key: [(stride_end(t, w.end), u, p) for t, u, p in pts]
                for key, pts in plots.items()}  # fmt: skip

    def _series_stats(
        self, w: Window, series_points: int, deadline: float
    ) -> dict[str, list[GpuStats]]:
        """Each GPU's stats computed from its series in ``w``."""
        first = self._strided(w, self.client.gather(self._first_calls(w), deadline))
        values = {name: per_gpu(first[name], how) for name, (_, _, how) in _EXTREMES.items()}
        values.update({name: per_gpu(first[name], sum) for name in ("nvlink", "replay")})
        values["mem_total"] = per_gpu(first["mem_total"], max)
        summed = {name: Summed(first[f"{name}_sum"], first[f"{name}_n"]) for name in _SUMMED}
        throttle = throttle_counts(first["throttle"])
        present = per_gpu(first["present"], max)
        keys = sorted(set().union(*values.values(), summed["util"].n, throttle, present))
        steps, totals = sampling(first["steps"])
        step = statistics.median(steps.values()) if steps else None
        calls = self._p5_calls(w, summed["util"].n)
        swings = self._swings_expr(w, step, len(keys))
        if swings is not None:
            calls["swings"] = partial(self.client.query, swings, w.at)
        raw = series_points > 0 and max(summed["util"].n.values(), default=0) <= series_points
        if raw:
            calls.update(self._raw_calls(w))
        calls.update(
            self._delta_calls(w, {n: {k for k in keys if k not in values[n]} for n in _DELTAS})
        )
        second = self._clipped(w, self.client.gather(calls, deadline))
        for name in _DELTAS:  # GPUs whose counters did not span the job's first and last minutes
            values[name] = {**per_gpu(second.get(f"{name}_all", []), sum), **values[name]}
        self.skipped = () if swings is not None or not keys else ("util_swings",)
        p5 = p5_of(second, summed["util"].n)
        swung = per_gpu(second.get("swings", []), sum)
        if raw:
            series = raw_series(second["raw_util"], second["raw_power"])
        else:
            series = strided_series(summed, w.end) if series_points > 0 else {}
        uuids = uuids_of(first.values())
        out: dict[str, list[GpuStats]] = {}
        for key in keys:
            v = {name: found.get(key) for name, found in values.items()}
            node_step = steps.get(key[0], step) or 0.0
            stats = gpu_stats_of(key, v, summed, p5.get(key), swung.get(key))
            out.setdefault(key[0], []).append(dataclasses.replace(
                stats, uuid=uuids.get(key), series=tuple(series.get(key, ())),
                samples=int(totals.get(key[0]) or summed["util"].n.get(key) or 0),
                throttle_seconds={r: round(n * node_step, 1)
                                  for r, n in throttle.get(key, {}).items()},
            ))  # fmt: skip
        return out

    def _first_calls(self, w: Window) -> dict[str, Call]:
        exprs = {
            name: w.each(lambda s, fn=fn, series=series: f"{fn}({s.m(series)}{s.all})")  # type: ignore[misc]
            for name, (fn, series, _) in _EXTREMES.items()
        }
        for name, (series, extra) in _DELTAS.items():
            exprs[name] = w.each(lambda s, m=series, x=extra: f"(max_over_time({s.m(m, x)}"  # type: ignore[misc]
                                 f"{s.last}) - min_over_time({s.m(m, x)}{s.first}))")  # fmt: skip
        exprs["mem_total"] = w.each(lambda s: f"max_over_time({s.m('gpu_memory_total_bytes')}"
                                    f"{s.last})")  # fmt: skip
        # a GPU that fell off the bus before the sidecar's first sample has gpu_up (0) only
        exprs["present"] = w.each(lambda s: f"max_over_time({s.m('gpu_up')}{s.last})")
        reasons = f",reason=~{_alternatives(HW_THROTTLE.values())}"
        exprs["throttle"] = w.each(lambda s: f"count_over_time("
                                   f"{s.m('gpu_clock_event_active', reasons)}{s.all})")  # fmt: skip
        calls: dict[str, Call] = {
            name: partial(self.client.query, expr, w.at) for name, expr in exprs.items()
        }
        edge = f"[{EDGE_S:.0f}s]"
        calls["steps"] = partial(
            self.client.query_samples, f"{w.jm('sidecar_samples_total')}{edge}", w.at
        )
        for name, series in _SUMMED.items():
            for fn, suffix in (("sum_over_time", "sum"), ("count_over_time", "n")):
                calls.update(self._strided_calls(w, f"{name}_{suffix}", fn, series))
        return calls

    def _strided_calls(self, w: Window, name: str, fn: str, series: str) -> dict[str, Call]:
        """``fn`` of ``series`` over each plot stride, one range query (and, without job
        labels, the job's part of each node's first and last stride: :meth:`_strided`)."""
        first, last = w.strides()
        expr = f"{fn}({w.m(series)}[{w.stride * 1000 - 1}ms])"
        calls: dict[str, Call] = {name: partial(self.client.query_range, expr, first, last,
                                                w.stride)}  # fmt: skip
        if w.spans:
            edges = prom_spans.edge_expr(fn, series, w.spans, w.stride)
            calls[f"{name}:edges"] = partial(self.client.query, edges, w.at)
        return calls

    def _strided(self, w: Window, answers: dict[str, Any]) -> dict[str, Any]:
        """``answers`` with each strided matrix kept to the job's samples (no job labels)."""
        if not w.spans:
            return answers
        out = {k: v for k, v in answers.items() if not k.endswith(":edges")}
        for name in out:
            if f"{name}:edges" in answers:
                out[name] = prom_spans.fix_strides(out[name], answers[f"{name}:edges"],
                                                   w.spans, w.stride)  # fmt: skip
        return out

    def _clipped(self, w: Window, answers: dict[str, Any]) -> dict[str, Any]:
        """``answers`` with every sample read (``raw_*``) kept to the job's (no job labels)."""
        if not w.spans:
            return answers
        return {k: prom_spans.clip(v, w.spans) if k.startswith("raw_") else v
                for k, v in answers.items()}  # fmt: skip

    def _p5_calls(self, w: Window, counts: Mapping[Key, float]) -> dict[str, Call]:
        """``quantile_over_time`` at the rank the history's p5 takes, ``int(0.05 * (n - 1))``
        (nudged 1e-6 up: no interpolation with the next sample), per distinct count ``n``."""
        by_count: dict[int, set[str]] = {}
        for (node, _), n in counts.items():
            by_count.setdefault(int(n), set()).add(node)
        ranked = sorted(by_count, key=lambda n: -len(by_count[n]))
        calls: dict[str, Call] = {}
        for n in ranked[:MAX_P5_QUERIES]:
            phi = min(1.0, (int(0.05 * (n - 1)) + 1e-6) / (n - 1)) if n > 1 else 0.0
            expr = w.on(by_count[n], True).each(
                lambda s, phi=phi: (
                    f"quantile_over_time({phi!r}, "  # type: ignore[misc]
                    f"{s.m('gpu_utilization_ratio')}{s.all})"
                )
            )
            calls[f"p5:{n}"] = partial(self.client.query, expr, w.at)
        if len(ranked) > MAX_P5_QUERIES:
            expr = w.each(lambda s: f"quantile_over_time(0.05, {s.m('gpu_utilization_ratio')}"
                          f"{s.all})")  # fmt: skip
            calls["p5:"] = partial(self.client.query, expr, w.at)
        return calls

    def _swings_expr(self, w: Window, step: float | None, gpus: int) -> str | None:
        """Changes of the idle/busy mark at half the sampling step (each sample seen even
        when the scrapes jitter), or None when that costs more than :data:`SWING_BUDGET`."""
        if step is None or step <= 0:
            return None
        sub_ms = max(1, int(step * 500))
        if gpus * (w.end - w.start + 2 * SLACK_S) * 1000 / sub_ms > SWING_BUDGET:
            return None

        def term(s: prom_spans.Span) -> str:
            mark = f"floor(({s.m('gpu_utilization_ratio')} - {_IDLE!r}) / {_SPAN!r}) != 0"
            return f"changes(({mark})[{s.rng}:{sub_ms}ms]{s.at})"

        return w.each(term)

    def _delta_calls(self, w: Window, short: Mapping[str, set[Key]]) -> dict[str, Call]:
        """A counter's max - min over the whole window, on the nodes of the GPUs whose
        counter missed a value at an end (lost mid-job; none at all: nothing to read)."""
        calls: dict[str, Call] = {}
        for name, (series, extra) in _DELTAS.items():
            if short.get(name):
                on = w.on({node for node, _ in short[name]}, True)
                expr = on.each(lambda s, m=series, x=extra: f"(max_over_time({s.m(m, x)}"  # type: ignore[misc]
                               f"{s.all}) - min_over_time({s.m(m, x)}{s.all}))")  # fmt: skip
                calls[f"{name}_all"] = partial(self.client.query, expr, w.at)
        return calls

    def _raw_calls(self, w: Window) -> dict[str, Call]:
        """Every sample of utilisation and power (a job short enough to plot them all)."""
        return {
            f"raw_{name}": partial(self.client.query_samples, f"{w.m(series)}[{w.span}]", w.at)
            for name, series in _SUMMED.items()
        }


def plot_points(series_points: int, gpus: int) -> int:
    """Points per GPU's plot for a job of ``gpus`` GPUs (0: no plots)."""
    if series_points <= 0:
        return 0
    return min(series_points, max(MIN_PLOT_POINTS, MAX_PLOT_POINTS // max(1, gpus)))


def _window(job_id: str, start: float, end: float, points: int) -> Window:
    if not _JOB_ID.fullmatch(job_id):
        raise UsageError(f"job id {job_id!r} is not one Slurm gives (digits, _ + . -)")
    if not (math.isfinite(start) and math.isfinite(end)) or end < start:
        raise UsageError(f"job window {start!r}..{end!r} is not a time range")
    buckets = max(1, math.ceil((end - start) / BUCKET_S))
    stride = BUCKET_S * math.ceil(buckets / max(1, points or MAX_SERIES))
    span = f"{math.ceil(end - start + 2 * SLACK_S)}s"
    sel = f"job_id={_quote(job_id)}"
    return Window(sel, start, end, end + SLACK_S, span, stride, job=sel, job_id=job_id)
