"""How well the job used what it was given, as jobstats shows it: GPU utilisation and memory
per node against what was allocated, idle GPUs named, time used against time asked; and the
timeline collapsed to what matters (state changes, faults, drains; repeats merged).

Pure: facts in, frozen summaries out. Times are UTC seconds.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from slurmhealth.diagnose.facts import Facts, GpuStats
from slurmhealth.report.answer import where_gpus

IDLE_PCT = 5.0  # a GPU averaging less was idle (rules.toml's idle_gpus rule says the same)
GIB = 2**30


@dataclass(frozen=True)
class NodeUse:
    node: str
    gpus: tuple[int, ...]
    util_mean: float | None  # percent, the mean over the node's GPUs
    idle_gpus: tuple[int, ...]  # averaged under IDLE_PCT
    mem_peak_bytes: int | None  # the highest GPU's peak
    mem_total_bytes: int | None  # one GPU's framebuffer, when known


@dataclass(frozen=True)
class Efficiency:
    nodes: tuple[NodeUse, ...]
    gpus_held: int
    gpus_idle: int
    util_mean: float | None  # over every GPU of the job
    elapsed_s: float | None
    time_limit_s: float | None
    lines: tuple[str, ...]  # the summary as every renderer prints it


def _node_use(node: str, gpus: Sequence[GpuStats]) -> NodeUse:
    known = [g for g in gpus if g.util_mean is not None]
    peaks = [g.mem_peak_bytes for g in gpus if g.mem_peak_bytes is not None]
    totals = [g.mem_total_bytes for g in gpus if g.mem_total_bytes]
    return NodeUse(
        node=node,
        gpus=tuple(g.gpu for g in gpus),
        util_mean=statistics.fmean(g.util_mean for g in known if g.util_mean is not None)
        if known
        else None,
        idle_gpus=tuple(g.gpu for g in known if (g.util_mean or 0.0) < IDLE_PCT),
        mem_peak_bytes=max(peaks, default=None),
        mem_total_bytes=max(totals, default=None),
    )


def duration(seconds: float) -> str:
    """``2d03h``, ``1h05m``, ``4m10s``."""
    s = round(seconds)
    d, h, m = s // 86400, s // 3600 % 24, s // 60 % 60
    if d:
        return f"{d}d{h:02d}h"
    return f"{h}h{m:02d}m" if h else f"{m}m{s % 60:02d}s"


def _idle_line(u: NodeUse) -> str:
    """``GPUs 0-7 on n1 averaged 0% utilisation: the job did not use its GPUs``."""
    gpus = f"{where_gpus(None, u.idle_gpus)} on {u.node}"
    if len(u.idle_gpus) == len(u.gpus):
        return (
            f"{gpus} averaged {u.util_mean or 0.0:.0f}% utilisation: the job did not use its GPUs"
        )
    return (f"{gpus} averaged under {IDLE_PCT:.0f}% utilisation: idle while the node's "
            "other GPUs worked")  # fmt: skip


def _mem_line(uses: Sequence[NodeUse]) -> str | None:
    peaks = [u.mem_peak_bytes for u in uses if u.mem_peak_bytes is not None]
    if not peaks:
        return None
    peak = max(peaks)
    total = max((u.mem_total_bytes for u in uses if u.mem_total_bytes), default=None)
    text = f"GPU memory: peak {peak / GIB:.1f} GiB on one GPU"
    if total:
        return text + f" of {total / GIB:.1f} GiB ({peak / total:.0%})"
    return text


def _time_line(elapsed: float | None, limit: float | None) -> str | None:
    if elapsed is None:
        return None
    if limit:
        return (f"time: {duration(elapsed)} used of the {duration(limit)} asked "
                f"({elapsed / limit:.0%})")  # fmt: skip
    return f"time: {duration(elapsed)} (time limit not recorded)"


def efficiency(facts: Facts) -> Efficiency:
    uses = tuple(_node_use(nf.node, nf.gpus) for nf in facts.nodes if nf.gpus)
    all_gpus = [g for nf in facts.nodes for g in nf.gpus if g.util_mean is not None]
    mean = statistics.fmean(g.util_mean or 0.0 for g in all_gpus) if all_gpus else None
    j = facts.job
    elapsed = j.end_ts - j.start_ts if j.start_ts is not None and j.end_ts is not None else None
    lines = []
    if mean is not None:
        per_node = ", ".join(f"{u.node} {u.util_mean or 0:.0f}%" for u in uses)
        lines.append(f"GPU utilisation: mean {mean:.0f}% over {len(all_gpus)} GPU(s) on "
                     f"{len(uses)} node(s) ({per_node})")  # fmt: skip
    else:
        lines.append("GPU utilisation: no samples recorded")
    lines += [_idle_line(u) for u in uses if u.idle_gpus]
    lines += [x for x in (_mem_line(uses), _time_line(elapsed, j.time_limit_s)) if x]
    return Efficiency(uses, sum(len(u.gpus) for u in uses), sum(len(u.idle_gpus) for u in uses),
                      mean, elapsed, j.time_limit_s, tuple(lines))  # fmt: skip


# -- the timeline collapsed -------------------------------------------------------------------

_NUMBER = re.compile(r"\d+(?:\.\d+)?")
QUIET = ("ok", "info")  # severities of entries the collapsed timeline keeps only for state


@dataclass(frozen=True)
class TimelineEntry:
    """One thing that happened; collapsed, the first of ``count`` alike entries (the last at
    ``last_ts``)."""

    ts: float
    node: str | None
    gpu: int | None
    kind: str  # job | run | finding | event | drain | task
    severity: str  # ok | info | warn | fail | critical
    text: str
    count: int = 1
    last_ts: float | None = None


def collapse(entries: Sequence[TimelineEntry]) -> list[TimelineEntry]:
    """State changes (job, check runs, drains), faults and warnings; entries alike but for
    their numbers (the same event on the same GPU) merged into the first, counted."""
    out: dict[tuple[object, ...], TimelineEntry] = {}
    for e in entries:
        if e.kind not in ("job", "run", "drain") and e.severity in QUIET:
            continue
        key = (e.node, e.gpu, e.kind, e.severity, _NUMBER.sub("#", e.text))
        first = out.get(key)
        out[key] = e if first is None else replace(first, count=first.count + 1, last_ts=e.ts)
    return sorted(out.values(), key=lambda m: m.ts)
