"""A :class:`Report` as ONE self-contained HTML file: inline CSS and SVG plots, no URLs.

Per node two small charts (``svg.plot-util`` ``#plot-util-<node>``, ``svg.plot-power``
``#plot-power-<node>``), one polyline per GPU (``polyline.gpu-line``,
``#plot-util-<node>-gpu<i>``, ``data-gpu``), x axis in UTC.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from slurmhealth.diagnose.facts import Diagnosis, GpuStats, NodeFacts
from slurmhealth.report import layout
from slurmhealth.report.build import Report
from slurmhealth.report.sources import NodeEvidence

W, H, PAD_L, PAD_R, PAD_T, PAD_B = 560, 180, 48, 12, 12, 28
PW, PH = W - PAD_L - PAD_R, H - PAD_T - PAD_B  # the plotting area inside the padding
COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:1200px}
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.5em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:2px 6px;
text-align:left;vertical-align:top;font-size:13px}th{background:#f4f4f4}
.verdict{font-size:1.1em;padding:.5em;border-left:4px solid #888;background:#fafafa}
.sev-critical,.sev-fail{color:#b00}.sev-warn{color:#a60}.sev-ok{color:#080}
.verdict.sev-critical,.verdict.sev-fail{border-color:#b00}.verdict.sev-warn{border-color:#a60}
.plots{display:flex;flex-wrap:wrap;gap:1em}.plot{border:1px solid #eee}
.plot text{font-size:10px;fill:#555}.axis{stroke:#999;stroke-width:1}
.grid{stroke:#eee;stroke-width:1}.failure{stroke:#c00;stroke-dasharray:4 3}
.gpu-line{fill:none;stroke-width:1.3}
.legend span{display:inline-block;margin-right:.8em;font-size:12px}
code{font-size:12px}
"""


def _id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)


def _table(
    cols: Sequence[str],
    rows: Iterable[Sequence[Any]],
    cls: str = "",
    row_classes: Sequence[str] | None = None,
) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in cols)
    body = []
    for i, row in enumerate(rows):
        rc = f' class="{row_classes[i]}"' if row_classes else ""
        cells = "".join(f"<td>{escape('-' if v is None else str(v))}</td>" for v in row)
        body.append(f"<tr{rc}>{cells}</tr>")
    return (
        f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
    )


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]


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


def _value_grid(sc: _Scale, unit: str) -> list[str]:
    return [
        f'<line class="grid" x1="{PAD_L}" x2="{W - PAD_R}" y1="{sc.y(v):.1f}" '
        f'y2="{sc.y(v):.1f}"/><text x="{PAD_L - 4}" y="{sc.y(v) + 3:.1f}" '
        f'text-anchor="end">{v:.0f}{unit}</text>'
        for v in _ticks(0.0, sc.top, 5)
    ]


def _time_ticks(sc: _Scale) -> list[str]:
    ticks = _ticks(sc.t0, sc.t1, 5)
    parts = []
    for n, t in enumerate(ticks):
        anchor = "start" if n == 0 else "end" if n == len(ticks) - 1 else "middle"
        hms = time.strftime("%H:%M:%SZ", time.gmtime(t))
        parts.append(
            f'<text class="tick-utc" x="{sc.x(t):.1f}" y="{H - PAD_B + 14}" '
            f'text-anchor="{anchor}">{hms}</text>'
        )
    return parts


def _polylines(
    sc: _Scale, pid: str, series: list[tuple[GpuStats, list[tuple[float, float]]]]
) -> list[str]:
    parts = []
    for g, pts in series:
        colour = COLOURS[g.gpu % len(COLOURS)]
        coords = " ".join(f"{sc.x(t):.1f},{sc.y(v):.1f}" for t, v in pts)
        parts.append(
            f'<polyline class="gpu-line" id="{pid}-gpu{g.gpu}" data-gpu="{g.gpu}" '
            f'stroke="{colour}" points="{coords}"><title>GPU {g.gpu}</title>'
            "</polyline>"
        )
    return parts


def plot(nf: NodeFacts, metric: str, mark: float | None = None) -> str:
    """An inline SVG chart of ``metric`` (util | power) over time, one polyline per GPU;
    ``mark``: the failure time, drawn as a red dashed line."""
    series = _series(nf, metric)
    all_ts = [t for _, pts in series for t, _ in pts]
    all_v = [v for _, pts in series for _, v in pts]
    t0, t1 = (min(all_ts), max(all_ts)) if all_ts else (0.0, 1.0)
    sc = _Scale(t0, t1, 100.0 if metric == "util" else max([*all_v, 1.0]) * 1.1)
    pid = f"plot-{metric}-{_id(nf.node)}"
    unit, label = ("%", "GPU utilisation (%)") if metric == "util" else ("W", "power (W)")
    parts = [
        f'<svg class="plot plot-{metric}" id="{pid}" '
        f'data-node="{escape(nf.node)}" width="{W}" height="{H}" '
        f'viewBox="0 0 {W} {H}" role="img" aria-label="{escape(nf.node)} {label}">',
        f"<title>{escape(nf.node)}: {label} per GPU, UTC</title>",
        *_value_grid(sc, unit),
        *(_time_ticks(sc) if all_ts else []),
    ]
    if mark is not None and all_ts and t0 <= mark <= t1:
        parts.append(
            f'<line class="failure" x1="{sc.x(mark):.1f}" x2="{sc.x(mark):.1f}" y1="{PAD_T}" '
            f'y2="{PAD_T + PH}"><title>failure {layout.utc(mark)}</title></line>'
        )
    parts.append(f'<text x="{PAD_L + 4}" y="{PAD_T + 10}" class="plot-label">{label}</text>')
    parts.append(
        f'<line class="axis" x1="{PAD_L}" x2="{W - PAD_R}" y1="{PAD_T + PH}" '
        f'y2="{PAD_T + PH}"/><line class="axis" x1="{PAD_L}" x2="{PAD_L}" '
        f'y1="{PAD_T}" y2="{PAD_T + PH}"/>'
    )
    if all_ts:
        parts.append(
            f'<text x="{W - PAD_R}" y="{H - 2}" text-anchor="end">UTC {layout.utc(t0)[:10]}</text>'
        )
    return "".join([*parts, *_polylines(sc, pid, series), "</svg>"])


def _legend(nf: NodeFacts) -> str:
    spans = "".join(
        f'<span style="color:{COLOURS[g.gpu % len(COLOURS)]}">&#9632; GPU {g.gpu}</span>'
        for g in nf.gpus
    )
    return f'<div class="legend">{spans}</div>'


def _head(report: Report) -> list[str]:
    """From the doctype to the verdict and the failure time."""
    j = report.job
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>slurmhealth report: job {escape(j.job_id)}</title>",
        f"<style>{CSS}</style></head><body>",
        f'<h1 id="job">slurmhealth report: job {escape(j.job_id)}</h1>',
        _table(["field", "value"], layout.header(report), "header"),
        f'<p class="verdict sev-{layout.worst_severity(report)}" id="verdict">'
        f"{escape(report.verdict)}</p>",
    ]
    if report.failure_ts is not None:
        out.append(
            f"<p>Failure at {layout.utc(report.failure_ts)}"
            + (f" (timeline within &plusmn;{report.window_s:g} s)" if report.window_s else "")
            + "</p>"
        )
    return out


def _plots(report: Report) -> list[str]:
    mark = report.failure_ts
    return ['<h2 id="plots">GPU utilisation and power (UTC)</h2>'] + [
        f'<section class="node-plots" id="node-{_id(nf.node)}">'
        f"<h3>{escape(nf.node)}</h3>{_legend(nf)}"
        f'<div class="plots">{plot(nf, "util", mark)}{plot(nf, "power", mark)}</div></section>'
        for nf in report.nodes
    ]


def _tables(report: Report) -> list[str]:
    """The timeline, GPU and straggler tables."""
    out = [
        '<h2 id="timeline">Timeline (UTC)</h2>',
        _table(
            layout.TIMELINE_COLUMNS,
            layout.timeline_rows(report),
            "timeline",
            [f"sev-{e.severity}" for e in report.timeline],
        ),
        '<h2 id="gpus">GPUs</h2>',
    ]
    xids = layout.xids_by_gpu(report)
    rows = [
        (nf.node, g.gpu, *layout.gpu_row(g).values(), layout.xid_text(xids, nf.node, g.gpu))
        for nf in report.nodes
        for g in nf.gpus
    ]
    out.append(_table(["node", "GPU", *layout.gpu_columns(), "Xids"], rows, "gpus"))
    if report.stragglers:
        out.append('<h2 id="stragglers">Stragglers</h2>')
        out.append(_table(layout.STRAGGLER_COLUMNS, layout.straggler_rows(report)))
    return out


def _diagnosis(d: Diagnosis) -> str:
    at = layout.where(d)
    cites = "".join(
        f"<li>{escape(c.kind)}: {escape(c.text)}"
        + (f" <code>{escape(c.ref)}</code>" if c.ref else "")
        + "</li>"
        for c in d.citations
    )
    return (
        f'<div class="diagnosis sev-{escape(d.severity)}">'
        f"<h3>{escape(d.title)}{' on ' + escape(at) if at else ''} "
        f"({escape(d.severity)}, {d.confidence:.0%})</h3><ul>"
        f"<li>root cause: {escape(d.root_cause)}</li>"
        f"<li>verify: {escape(d.verify)}</li><li>action: {escape(d.action)}</li>"
        f'</ul><ul class="citations">{cites}</ul></div>'
    )


def _evidence(e: NodeEvidence) -> str:
    files = "".join(f"<li><code>{escape(str(f['path']))}</code></li>" for f in e.files)
    return (
        f"<li>{escape(e.node)} ({escape(e.source)}): bundle "
        f"<code>{escape(e.bundle_dir or '-')}</code>, manifest "
        f"<code>{escape(e.manifest or '-')}</code><ul>{files}</ul></li>"
    )


def _tail(report: Report) -> list[str]:
    """Diagnoses, evidence, past incidents and the footer."""
    out = ['<h2 id="diagnoses">Diagnoses</h2>', *map(_diagnosis, report.diagnoses)]
    if not report.diagnoses:
        out.append("<p>No diagnosis matched.</p>")
    out.append('<h2 id="evidence">Evidence</h2><ul class="evidence">')
    out += [*map(_evidence, report.evidence), "</ul>"]
    out.append('<h2 id="past-incidents">Past incidents (same node+GPU or Xid)</h2>')
    out.append(_table(layout.PAST_COLUMNS, layout.past_rows(report), "incidents"))
    out.append(
        f"<p><small>generated {layout.utc(report.generated_ts)} by slurmhealth; sources: "
        + escape(", ".join(f"{n} {s} {p}" for n, s, p in report.sources))
        + "</small></p></body></html>"
    )
    return out


def to_html(report: Report) -> str:
    out = [*_head(report), *_plots(report), *_tables(report), *_tail(report)]
    return "\n".join(out) + "\n"
