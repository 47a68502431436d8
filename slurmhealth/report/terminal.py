"""A :class:`Report` on the terminal (rich): the answer first, then the efficiency summary,
the task metrics, the diagnoses one line per cause, the timeline collapsed (all of it with
``full_timeline``), the GPUs worth a look, the evidence and past incidents.

No logic beyond layout: everything shown is in the report.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from slurmhealth.report import layout
from slurmhealth.report.build import Report

SEVERITY_STYLE = {
    "critical": "bold red",
    "fail": "red",
    "warn": "yellow",
    "info": "cyan",
    "ok": "green",
}


def _print_table(
    con: Any,
    title: str,
    cols: Sequence[str],
    rows: Iterable[Sequence[Any]],
    styles: Sequence[str] | None = None,
) -> None:
    from rich.table import Table
    from rich.text import Text

    t = Table(title=title, title_justify="left")
    for c in cols:
        t.add_column(c, overflow="fold")
    for i, row in enumerate(rows):
        t.add_row(
            *(Text("-" if v is None else str(v)) for v in row),
            style=styles[i] if styles else None,
        )
    con.print(t)


def _indented(con: Any, spaces: int, text: Any) -> None:
    """``text`` with every line it wraps to indented, not only the first."""
    from rich.padding import Padding

    con.print(Padding(text, (0, 0, 0, spaces), expand=False))


def _print_head(report: Report, con: Any) -> None:
    """The job panel, then the answer: verdict, whose fault, the next steps."""
    from rich.panel import Panel
    from rich.text import Text

    head = Text()
    for n, (k, v) in enumerate(layout.header(report)):
        head.append(f"{k}: ", style="bold")
        head.append(v + ("\n" if n % 4 == 3 and n < 11 else "   "))
    con.print(Panel(head, title=f"job {report.job.job_id}", title_align="left"))
    style = SEVERITY_STYLE.get(layout.worst_severity(report), "")
    con.print(Text("verdict: ", style="bold") + Text(report.verdict, style))
    a = report.answer
    if a is None:
        return
    con.print(Text("whose fault: ", style="bold") + Text(layout.fault_text(report)))
    for line in a.evidence:
        _indented(con, 2, Text(f"evidence: {line}", "dim"))
    con.print(Text("what you should do: ", style="bold") + Text(a.user_action))
    for done in a.admin_done:
        con.print(Text("already done: ", style="bold") + Text(done))
    con.print(Text("what the admins should do: ", style="bold") + Text(a.admin_action))


def _print_efficiency(report: Report, con: Any) -> None:
    from rich.text import Text

    if report.efficiency is not None:
        con.print(Text("efficiency", style="bold"))
        for line in report.efficiency.lines:
            _indented(con, 2, Text(line))
    rows = layout.task_rows(report)
    if rows:
        _print_table(con, "task metrics (what the training loop reported)",
                     layout.TASK_COLUMNS, rows)  # fmt: skip


def _print_diagnoses(report: Report, con: Any) -> None:
    """One line per cause; the first group's verify step under it."""
    from rich.text import Text

    if not report.groups:
        return
    con.print(Text("diagnoses", style="bold"))
    for n, g in enumerate(report.groups):
        style = SEVERITY_STYLE.get(g.severity, "")
        _indented(con, 2, Text(g.line, style) + Text(f"  [{g.fault_class}]", "dim"))
        if n == 0:
            _indented(con, 4, Text(f"verify: {g.diagnoses[0].verify}", "dim"))


def _print_timeline(report: Report, con: Any, full: bool) -> None:
    entries = report.timeline if full else report.moments
    hidden = len(report.timeline) - len(report.moments)
    title = "timeline (UTC)" if full else "timeline (UTC), what matters"
    if not full and hidden > 0:
        title += f"; {hidden} more {'entry' if hidden == 1 else 'entries'}: --timeline"
    _print_table(
        con,
        title,
        ["time", "node", "GPU", "kind", "what"],
        [(layout.utc(e.ts), e.node, e.gpu, e.kind, layout.moment_text(e)) for e in entries],
        [SEVERITY_STYLE.get(e.severity, "") for e in entries],
    )


def _print_gpus(report: Report, con: Any) -> None:
    """Only the GPUs with something to look at; the others are counted."""
    from rich.text import Text

    xids = layout.xids_by_gpu(report)
    odd = layout.odd_gpus(report)
    rows, quiet = [], []
    for nf in report.nodes:
        for g in nf.gpus:
            if (nf.node, g.gpu) in odd or layout.notable(g):
                rows.append((nf.node, g.gpu, *layout.gpu_row(g).values(),
                             layout.xid_text(xids, nf.node, g.gpu)))  # fmt: skip
            else:
                quiet.append(f"{nf.node}:{g.gpu}")
    title = "GPUs" + (f" ({len(quiet)} more without faults)" if quiet else "")
    if rows:
        _print_table(con, title, ["node", "GPU", *layout.gpu_columns(), "Xids"], rows)
    elif quiet:
        con.print(Text(f"GPUs: {len(quiet)}, no faults (--json or --html for every stat)"))


def _print_tail(report: Report, con: Any) -> None:
    from rich.text import Text

    if any(s == "accounting" for _n, s, _p in report.sources):  # no node's records reached
        used = dict.fromkeys(f"{s} ({p})" for _n, s, p in report.sources)
        con.print(Text("read from Slurm accounting: " + ", ".join(used), style="bold"))
    for source, why in report.unreached:  # e.g. a summary its manifest does not vouch for
        _indented(con, 2, Text(f"not used: {source}: {why}", style="dim"))
    root = layout.evidence_dir(report)
    if report.evidence:
        con.print(Text("evidence" + (f" in {root}" if root else ""), style="bold"))
    for e in report.evidence:
        _indented(con, 2, Text(layout.bundle_text(report, e)))
    if report.known_incidents:
        _print_table(
            con,
            "known incidents (slurmhealth incident add)",
            ["why", "job", "symptom", "root cause", "fix"],
            [(w, i.job_id, i.symptom, i.root_cause, i.fix) for w, i in report.known_incidents],
        )
    if report.past_incidents:
        _print_table(con, "past incidents (same node+GPU or Xid)",
                     ["time", "job", "node", "GPU", "what"],
                     [(layout.utc(i.ts), i.job_id, i.node, i.gpu, i.what)
                      for i in report.past_incidents])  # fmt: skip


def print_report(report: Report, console: Any = None, full_timeline: bool = False) -> None:
    """The answer first, then efficiency, diagnoses, timeline, GPUs, evidence, incidents."""
    from rich.console import Console

    con = console or Console(soft_wrap=False, emoji=False, highlight=False)
    _print_head(report, con)
    _print_efficiency(report, con)
    _print_diagnoses(report, con)
    _print_timeline(report, con, full_timeline)
    _print_gpus(report, con)
    if report.stragglers:
        _print_table(con, "stragglers", ["node", "GPU", "what"],
                     [(s.node, s.gpu, s.text) for s in report.stragglers])  # fmt: skip
    _print_tail(report, con)
