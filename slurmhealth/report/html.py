"""A :class:`Report` as ONE self-contained HTML file: inline CSS and SVG plots, no URLs, no
scripts.

The first screen answers: the verdict (``#verdict``), whose fault (``#fault``), what the
user does (``#user-action``), what was already done (``#admin-done``) and what is left for
the admins (``#admin-action``); then the efficiency summary (``#efficiency``), the
diagnoses one line per cause (``#diagnoses``), the timeline collapsed (``#timeline``, all of
it in a ``<details>`` fold), the task metrics, one panel of plots per node (``#node-<node>``, see
``report.plots``), the GPU table, the evidence and past incidents.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

from slurmhealth.report import layout
from slurmhealth.report.answer import DiagnosisGroup
from slurmhealth.report.build import Report
from slurmhealth.report.plots import legend, node_id, plot

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1em 1.5em;color:#222;max-width:1200px}
h1{font-size:1.25em;margin:.2em 0 .4em}h2{font-size:1.1em;margin-top:1.2em;
border-bottom:1px solid #ddd}h3{font-size:1em;margin:.6em 0 .2em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:2px 6px;
text-align:left;vertical-align:top;font-size:13px}th{background:#f4f4f4}
.answer{border-left:5px solid #888;background:#fafafa;padding:.4em .8em;margin:.4em 0}
.answer p{margin:.25em 0}.answer .label{font-weight:600}
.verdict{font-size:1.15em;font-weight:600}
.answer.edge-critical,.answer.edge-fail{border-color:#b00}.answer.edge-warn{border-color:#a60}
.answer.edge-ok{border-color:#080}.evidence-lines{margin:.1em 0 .1em 1.2em;color:#555;
font-size:13px;padding:0}
.sev-critical,.sev-fail{color:#b00}.sev-warn{color:#a60}.sev-ok{color:#080}
.jobline{color:#444;font-size:13px;margin:.3em 0}.jobline b{font-weight:600;color:#222}
.plots{display:flex;flex-wrap:wrap;gap:1em}.plot{border:1px solid #eee}
.plot text{font-size:10px;fill:#555}.axis{stroke:#999;stroke-width:1}
.grid{stroke:#eee;stroke-width:1}.failure{stroke:#c00;stroke-dasharray:4 3}
.gpu-line{fill:none}
.legend span{display:inline-block;margin-right:.8em;font-size:12px}
details{margin:.3em 0}summary{cursor:pointer}code{font-size:12px}.diagnosis ul{color:#222}
"""


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


def _p(pid: str, label: str, text: str) -> str:
    return f'<p id="{pid}"><span class="label">{escape(label)}</span> {escape(text)}</p>'


def _answer(report: Report) -> list[str]:
    """The verdict, whose fault, the next steps and what was already done."""
    sev = layout.worst_severity(report)
    out = [f'<section class="answer edge-{sev}" id="answer">',
           f'<p class="verdict sev-{sev}" id="verdict">{escape(report.verdict)}</p>']  # fmt: skip
    a = report.answer
    if a is not None:
        out.append(_p("fault", "Whose fault:", layout.fault_text(report)))
        if a.evidence:
            items = "".join(f"<li>{escape(e)}</li>" for e in a.evidence)
            out.append(f'<ul class="evidence-lines">{items}</ul>')
        out.append(_p("user-action", "What you should do:", a.user_action))
        if a.admin_done:
            out.append(_p("admin-done", "Already done:", "; ".join(a.admin_done)))
        out.append(_p("admin-action", "What the admins should do:", a.admin_action))
    return [*out, "</section>"]


def _head(report: Report) -> list[str]:
    """From the doctype to the answer and the job's facts on one line."""
    j = report.job
    facts = " &middot; ".join(
        f"<b>{escape(k)}</b> {escape(v)}" for k, v in layout.header(report) if k != "job"
    )
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>slurmhealth report: job {escape(j.job_id)}</title>",
        f"<style>{CSS}</style></head><body>",
        f'<h1 id="job">slurmhealth report: job {escape(j.job_id)}</h1>',
        *_answer(report),
        f'<p class="jobline" id="job-facts">{facts}</p>',
    ]
    if layout.failure_shown(report) is not None:
        out.append(
            f'<p class="jobline">Failure at {layout.utc(report.failure_ts)}'
            + (f" (timeline within &plusmn;{report.window_s:g} s)" if report.window_s else "")
            + "</p>"
        )
    return out


def _efficiency(report: Report) -> list[str]:
    lines = report.efficiency.lines if report.efficiency else ()
    out = ['<h2 id="efficiency">Efficiency</h2><ul class="efficiency">']
    out += [f"<li>{escape(x)}</li>" for x in lines]
    out.append("</ul>")
    rows = layout.task_rows(report)
    if rows:
        out.append('<h2 id="tasks">Task metrics</h2>')
        out.append(_table(layout.TASK_COLUMNS, rows, "tasks"))
    return out


def _group(g: DiagnosisGroup, first: bool = False) -> str:
    """One line per cause; its texts and evidence folded under it (the first one open)."""
    d = g.diagnoses[0]
    cites = "".join(
        f"<li>{escape(c.kind)}: {escape(c.text)}"
        + (f" <code>{escape(c.ref)}</code>" if c.ref else "")
        + (f" at {layout.utc(c.ts)}" if c.ts is not None else "")
        + "</li>"
        for c in d.citations[:5]
    )
    return (
        f'<details class="diagnosis sev-{escape(g.severity)}" data-rule="{escape(g.rule)}"'
        f"{' open' if first else ''}>"
        f"<summary>{escape(g.line)} ({escape(g.severity)}, {escape(g.fault_class)}, "
        f"{d.confidence:.0%})</summary><ul>"
        f"<li>root cause: {escape(d.root_cause)}</li><li>verify: {escape(d.verify)}</li>"
        f"<li>you: {escape(d.user_action)}</li><li>admins: {escape(d.admin_action)}</li>"
        f'</ul><ul class="citations">{cites}</ul></details>'
    )


def _diagnoses(report: Report) -> list[str]:
    out = ['<h2 id="diagnoses">Diagnoses</h2>']
    out += [_group(g, n == 0) for n, g in enumerate(report.groups)]
    return out if report.groups else [*out, "<p>No diagnosis matched.</p>"]


def _timeline(report: Report) -> list[str]:
    """What matters, and the full timeline folded."""
    rows = [(layout.utc(e.ts), e.node, e.gpu, e.kind, e.severity, layout.moment_text(e))
            for e in report.moments]  # fmt: skip
    return [
        '<h2 id="timeline">Timeline (UTC), what matters</h2>',
        _table(layout.TIMELINE_COLUMNS, rows, "timeline-summary",
               [f"sev-{e.severity}" for e in report.moments]),
        f'<details id="timeline-full"><summary>full timeline ({len(report.timeline)} '
        "entries)</summary>",
        _table(layout.TIMELINE_COLUMNS, layout.timeline_rows(report), "timeline",
               [f"sev-{e.severity}" for e in report.timeline]),
        "</details>",
    ]  # fmt: skip


def _plots(report: Report) -> list[str]:
    mark, odd = report.failure_ts, layout.odd_gpus(report)
    out = ['<h2 id="plots">GPU utilisation and power (UTC)</h2>']
    for nf in report.nodes:
        mine = {g for n, g in odd if n == nf.node}
        out.append(
            f'<section class="node-plots" id="node-{node_id(nf.node)}">'
            f"<h3>{escape(nf.node)}</h3>{legend(nf, mine)}"
            f'<div class="plots">{plot(nf, "util", mark, mine)}{plot(nf, "power", mark, mine)}'
            "</div></section>"
        )
    return out


def _gpus(report: Report) -> list[str]:
    """The GPU and straggler tables."""
    xids = layout.xids_by_gpu(report)
    rows = [
        (nf.node, g.gpu, *layout.gpu_row(g).values(), layout.xid_text(xids, nf.node, g.gpu))
        for nf in report.nodes
        for g in nf.gpus
    ]
    out = ['<h2 id="gpus">GPUs</h2>',
           _table(["node", "GPU", *layout.gpu_columns(), "Xids"], rows, "gpus")]  # fmt: skip
    if report.stragglers:
        out.append('<h2 id="stragglers">Stragglers</h2>')
        out.append(_table(layout.STRAGGLER_COLUMNS, layout.straggler_rows(report)))
    return out


def _tail(report: Report) -> list[str]:
    """Evidence, past incidents and the footer."""
    root = layout.evidence_dir(report)
    out = ['<h2 id="evidence">Evidence' + (f" in <code>{escape(root)}</code>" if root else "")
           + '</h2><ul class="evidence">']  # fmt: skip
    out += [f"<li>{escape(layout.bundle_text(report, e))}</li>" for e in report.evidence]
    out.append("</ul>")
    out.append('<h2 id="past-incidents">Past incidents (same node+GPU or Xid)</h2>')
    out.append(_table(layout.PAST_COLUMNS, layout.past_rows(report), "incidents"))
    out.append(
        f"<p><small>generated {layout.utc(report.generated_ts)} by slurmhealth; sources: "
        + escape(", ".join(f"{n} {s} {p}" for n, s, p in report.sources))
        + "</small></p></body></html>"
    )
    return out


def to_html(report: Report) -> str:
    out = [*_head(report), *_efficiency(report), *_diagnoses(report), *_timeline(report)]
    out += [*_plots(report), *_gpus(report), *_tail(report)]
    return "\n".join(out) + "\n"
