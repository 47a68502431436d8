"""Inline SVG charts of one node's GPUs over a job: utilisation and power, one polyline per
GPU (``polyline.gpu-line``, ``#plot-<metric>-<node>-gpu<i>``, ``data-gpu``), the GPUs that
misbehaved drawn in colour and thick (``data-odd="1"``), the others thin and grey; value and
time ticks on round numbers (0/200/400/600 W, 22:15/22:30 UTC).
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Collection
from dataclasses import dataclass
from html import escape

from slurmhealth.diagnose.facts import GpuStats, NodeFacts

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 560, 180, 48, 12, 12, 28
PW, PH = W - PAD_L - PAD_R, H - PAD_T - PAD_B  # the plotting area inside the padding
COLOURS = ("#d62728", "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2",
           "#17becf")  # fmt: skip
QUIET = "#b8b8b8"  # the GPUs nothing points at
_STEPS = (1.0, 2.0, 2.5, 5.0, 10.0)
# time steps a reader counts in: 1, 2, 5, 10, 15, 30 min; 1, 2, 3, 6, 12 h; 1, 2, 7 days
_TIME_STEPS = (60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
               172800, 604800)  # fmt: skip


def node_id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)


def nice_ticks(top: float, n: int = 4) -> list[float]:
    """Ticks from 0 on a round step (1, 2, 2.5 or 5 x 10^k), the last at or above ``top``:
    ``nice_ticks(607)`` -> 0, 200, 400, 600, 800."""
    if not math.isfinite(top) or top <= 0:
        return [0.0, 1.0]
    raw = top / n
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(s * mag for s in _STEPS if s * mag >= raw * (1 - 1e-9))
    return [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]


def time_ticks(t0: float, t1: float, n: int = 6) -> list[float]:
    """UTC times on a round step (whole minutes, hours or days) between ``t0`` and ``t1``."""
    if t1 <= t0:
        return [t0]
    step = next((s for s in _TIME_STEPS if (t1 - t0) / s <= n), _TIME_STEPS[-1])
    first = math.ceil(t0 / step) * step
    return [float(t) for t in range(int(first), int(t1) + 1, step)]


@dataclass(frozen=True)
class _Scale:
    """Maps a (time, value) point onto the chart's pixels; values clip to ``[0, top]``."""

    t0: float
    t1: float
    top: float

    def x(self, t: float) -> float:
        return PAD_L + (0.0 if self.t1 <= self.t0 else (t - self.t0) / (self.t1 - self.t0) * PW)

    def y(self, v: float) -> float:
        return PAD_T + PH - max(0.0, min(v, self.top)) / self.top * PH


def _series(nf: NodeFacts, metric: str) -> list[tuple[GpuStats, list[tuple[float, float]]]]:
    """Per GPU the known ``(ts, value)`` points of ``metric`` (util | power)."""
    col = 1 if metric == "util" else 2
    return [
        (g, [(float(p[0]), float(v)) for p in g.series if (v := p[col]) is not None])
        for g in nf.gpus
    ]


def _value_grid(sc: _Scale, ticks: list[float], unit: str) -> list[str]:
    return [
        f'<line class="grid" x1="{PAD_L}" x2="{W - PAD_R}" y1="{sc.y(v):.1f}" '
        f'y2="{sc.y(v):.1f}"/><text class="tick-value" x="{PAD_L - 4}" y="{sc.y(v) + 3:.1f}" '
        f'text-anchor="end">{v:g}{unit}</text>'
        for v in ticks
    ]


def _time_grid(sc: _Scale) -> list[str]:
    ticks = time_ticks(sc.t0, sc.t1)
    fmt = "%m-%d" if len(ticks) > 1 and ticks[1] - ticks[0] >= 86400 else "%H:%M"
    return [
        f'<text class="tick-utc" x="{sc.x(t):.1f}" y="{H - PAD_B + 14}" '
        f'text-anchor="middle">{time.strftime(fmt, time.gmtime(t))}</text>'
        for t in ticks
    ]


def colour(gpu: int, odd: Collection[int]) -> str:
    """A misbehaving GPU's colour (stable by its rank among them), grey for the others."""
    if gpu not in odd:
        return QUIET
    return COLOURS[sorted(odd).index(gpu) % len(COLOURS)]


def _polylines(
    sc: _Scale, pid: str, series: list[tuple[GpuStats, list[tuple[float, float]]]], odd: set[int]
) -> list[str]:
    parts = []
    # the quiet GPUs first, so the misbehaving ones are drawn on top
    for g, pts in sorted(series, key=lambda s: s[0].gpu in odd):
        coords = " ".join(f"{sc.x(t):.1f},{sc.y(v):.1f}" for t, v in pts)
        width = 2.2 if g.gpu in odd else 0.9
        parts.append(
            f'<polyline class="gpu-line" id="{pid}-gpu{g.gpu}" data-gpu="{g.gpu}" '
            f'data-odd="{int(g.gpu in odd)}" stroke="{colour(g.gpu, odd)}" '
            f'stroke-width="{width}" points="{coords}"><title>GPU {g.gpu}</title></polyline>'
        )
    return parts


def plot(nf: NodeFacts, metric: str, mark: float | None = None, odd: Collection[int] = ()) -> str:
    """An inline SVG chart of ``metric`` (util | power) over time, one polyline per GPU, the
    ``odd`` GPUs highlighted; ``mark``: the failure time, drawn as a red dashed line."""
    series = _series(nf, metric)
    all_ts = [t for _, pts in series for t, _ in pts]
    all_v = [v for _, pts in series for _, v in pts]
    t0, t1 = (min(all_ts), max(all_ts)) if all_ts else (0.0, 1.0)
    ticks = [0.0, 25.0, 50.0, 75.0, 100.0] if metric == "util" else nice_ticks(max(all_v or [1]))
    sc = _Scale(t0, t1, ticks[-1])
    pid = f"plot-{metric}-{node_id(nf.node)}"
    unit, label = ("%", "GPU utilisation (%)") if metric == "util" else (" W", "power (W)")
    parts = [
        f'<svg class="plot plot-{metric}" id="{pid}" '
        f'data-node="{escape(nf.node)}" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" role="img" aria-label="{escape(nf.node)} {label}">',
        f"<title>{escape(nf.node)}: {label} per GPU, UTC</title>",
        *_value_grid(sc, ticks, unit),
        *(_time_grid(sc) if all_ts else []),
    ]
    if mark is not None and all_ts and t0 <= mark <= t1:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(mark))
        parts.append(
            f'<line class="failure" x1="{sc.x(mark):.1f}" x2="{sc.x(mark):.1f}" y1="{PAD_T}" '
            f'y2="{PAD_T + PH}"><title>failure {stamp}</title></line>'
        )
    parts.append(f'<text x="{PAD_L + 4}" y="{PAD_T + 10}" class="plot-label">{label}</text>')
    parts.append(
        f'<line class="axis" x1="{PAD_L}" x2="{W - PAD_R}" y1="{PAD_T + PH}" '
        f'y2="{PAD_T + PH}"/><line class="axis" x1="{PAD_L}" x2="{PAD_L}" '
        f'y1="{PAD_T}" y2="{PAD_T + PH}"/>'
    )
    if all_ts:
        day = time.strftime("%Y-%m-%d", time.gmtime(t0))
        parts.append(f'<text x="{W - PAD_R}" y="{H - 2}" text-anchor="end">UTC {day}</text>')
    return "".join([*parts, *_polylines(sc, pid, series, set(odd)), "</svg>"])


def legend(nf: NodeFacts, odd: Collection[int]) -> str:
    """The highlighted GPUs by colour, the rest counted as grey."""
    spans = [
        f'<span style="color:{colour(g.gpu, odd)}">&#9632; GPU {g.gpu}</span>'
        for g in nf.gpus
        if g.gpu in odd
    ]
    quiet = sum(g.gpu not in odd for g in nf.gpus)
    if quiet:
        spans.append(f'<span style="color:{QUIET}">&#9632; {quiet} other GPU(s)</span>')
    return f'<div class="legend">{"".join(spans)}</div>'
