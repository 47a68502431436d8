"""A :class:`Report` for people (rich terminal, markdown) and machines (versioned JSON).

No logic beyond layout: everything shown is in the report. The JSON is documented in
``docs/report-schema.json`` (``"schema": "slurmhealth.report/1"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, fields
from typing import Any

from slurmhealth.diagnose.facts import Diagnosis
from slurmhealth.report.build import SCHEMA, Report
from slurmhealth.report.layout import (
    PAST_COLUMNS,
    STRAGGLER_COLUMNS,
    TIMELINE_COLUMNS,
    gpu_columns,
    gpu_row,
    header,
    notable,
    num,
    past_rows,
    straggler_rows,
    timeline_rows,
    utc,
    where,
    worst_severity,
    xid_text,
    xids_by_gpu,
)

SEVERITY_STYLE = {
    "critical": "bold red",
    "fail": "red",
    "warn": "yellow",
    "info": "cyan",
    "ok": "green",
}
TERMINAL_TIMELINE = 30  # entries shown on screen (nearest the failure); JSON has them all
SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: Iterable[float | None], top: float, width: int = 24) -> str:
    known = [v for v in values if v is not None]
    if not known or top <= 0:
        return ""
    step = max(1, len(known) // width)
    buckets = [known[i : i + step] for i in range(0, len(known), step)][:width]
    return "".join(SPARK[min(7, int(sum(b) / len(b) / top * 7.999))] for b in buckets)


# -- JSON -----------------------------------------------------------------------------------


def to_json(report: Report) -> dict[str, Any]:
    """The versioned, documented JSON form (``docs/report-schema.json``)."""
    j = report.job
    gpus = []
    for nf in report.nodes:
        for g in nf.gpus:
            d = {f.name: getattr(g, f.name) for f in fields(g)}  # asdict deep-copies: slow
            d["throttle_seconds"] = dict(g.throttle_seconds)
            d["series"] = [list(p) for p in g.series]
            gpus.append({"node": nf.node, **d})
    return {
        "schema": SCHEMA,
        "generated": utc(report.generated_ts),
        "job": {
            **asdict(j),
            "nodes": list(j.nodes),
            "gpus": list(j.gpus),
            "start": utc(j.start_ts),
            "end": utc(j.end_ts),
        },
        "verdict": report.verdict,
        "failure_ts": report.failure_ts,
        "failure": None if report.failure_ts is None else utc(report.failure_ts),
        "window_s": report.window_s,
        "sources": [{"node": n, "source": s, "path": p} for n, s, p in report.sources],
        "timeline": [{**asdict(e), "time": utc(e.ts)} for e in report.timeline],
        "gpus": gpus,
        "stragglers": [asdict(s) for s in report.stragglers],
        "tasks": [{"node": nf.node, **asdict(nf.task)} for nf in report.nodes if nf.task],
        "diagnoses": [d.to_dict() for d in report.diagnoses],
        "evidence": [{**asdict(e), "files": [dict(f) for f in e.files]} for e in report.evidence],
        "past_incidents": [{**asdict(i), "time": utc(i.ts)} for i in report.past_incidents],
        "searched": list(report.searched),
        "incidents": [{"why": why, **asdict(i)} for why, i in report.known_incidents],
    }


# -- markdown -------------------------------------------------------------------------------


def _md_cell(v: Any) -> str:
    return "-" if v is None or v == "" else str(v).replace("|", "\\|").replace("\n", " ")


def _md_table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in rows]
    return out


def _md_head(report: Report) -> list[str]:
    lines = [f"# slurmhealth report: job {report.job.job_id}", ""]
    lines += [*_md_table(["field", "value"], header(report)), ""]
    lines += [f"**Verdict:** {report.verdict}", ""]
    if report.failure_ts is not None:
        lines += [
            f"Failure at {utc(report.failure_ts)}"
            + (f" (timeline within ±{report.window_s:g} s)" if report.window_s else ""),
            "",
        ]
    return [*lines, "## Timeline (UTC)", "", *_md_table(TIMELINE_COLUMNS, timeline_rows(report))]


def _md_gpus(report: Report) -> list[str]:
    """The GPU table with a sparkline of utilisation and of power per GPU."""
    xids = xids_by_gpu(report)
    rows = []
    for nf in report.nodes:
        for g in nf.gpus:
            util = sparkline((p[1] for p in g.series), 100.0)
            power = sparkline(
                (p[2] for p in g.series), max((p[2] or 0 for p in g.series), default=0)
            )
            xs = xid_text(xids, nf.node, g.gpu)
            rows.append((nf.node, g.gpu, *gpu_row(g).values(), xs, util, power))
    cols = ["node", "GPU", *gpu_columns(), "Xids", "util plot", "power plot"]
    return ["", "## GPUs", "", *_md_table(cols, rows)]


TASK_COLUMNS = (
    "node",
    "steps",
    "step s (median)",
    "samples/s first -> last",
    "MFU",
    "comm",
    "data wait",
)


def _md_tasks(report: Report) -> list[str]:
    tasks = [(nf.node, nf.task) for nf in report.nodes if nf.task]
    if not tasks:
        return []
    rows = [
        (
            n,
            t.steps_total,
            num(t.step_seconds_median, ".3g"),
            f"{num(t.samples_per_second_first, '.4g')} -> {num(t.samples_per_second_last, '.4g')}",
            num(t.mfu_ratio, ".0%"),
            num(t.comm_ratio, ".0%"),
            num(t.data_wait_ratio, ".0%"),
        )
        for n, t in tasks
    ]
    return ["", "## Task metrics", "", *_md_table(TASK_COLUMNS, rows)]


def _md_diagnosis(d: Diagnosis) -> list[str]:
    at = where(d)
    lines = [
        f"### {d.title} ({d.severity}, confidence {d.confidence:.0%})"
        + (f" on {at}" if at else ""),
        "",
        f"- root cause: {d.root_cause}",
        f"- verify: {d.verify}",
        f"- action: {d.action}",
    ]
    for c in d.citations:
        lines.append(
            f"- evidence ({c.kind}): {c.text}"
            + (f" [{c.ref}]" if c.ref else "")
            + (f" at {utc(c.ts)}" if c.ts else "")
        )
    return [*lines, ""]


def _md_tail(report: Report) -> list[str]:
    """Diagnoses, evidence and past incidents."""
    lines = ["", "## Diagnoses", ""]
    for d in report.diagnoses:
        lines += _md_diagnosis(d)
    if not report.diagnoses:
        lines += ["No diagnosis matched.", ""]
    lines += ["## Evidence", ""]
    for e in report.evidence:
        lines.append(
            f"- {e.node} ({e.source}): bundle {e.bundle_dir or '-'}, "
            f"manifest {e.manifest or '-'}, summary {e.summary or '-'}"
        )
        lines += [f"  - {f['path']}" for f in e.files]
    lines += ["", "## Past incidents (same node+GPU or Xid)", ""]
    return lines + _md_table(PAST_COLUMNS, past_rows(report))


def to_markdown(report: Report) -> str:
    lines = _md_head(report) + _md_gpus(report)
    if report.stragglers:
        lines += ["", "## Stragglers", ""]
        lines += _md_table(STRAGGLER_COLUMNS, straggler_rows(report))
    lines += _md_tasks(report) + _md_tail(report)
    return "\n".join(lines) + "\n"


# -- terminal -------------------------------------------------------------------------------


def _near_failure(report: Report, n: int) -> tuple[list[Any], int]:
    entries = list(report.timeline)
    if len(entries) <= n:
        return entries, 0
    pivot = report.failure_ts if report.failure_ts is not None else entries[-1].ts
    keep = sorted(sorted(entries, key=lambda e: abs(e.ts - pivot))[:n], key=lambda e: e.ts)
    return keep, len(entries) - n


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


def _print_head(report: Report, con: Any) -> None:
    """The job panel, the verdict and the timeline nearest the failure."""
    from rich.panel import Panel
    from rich.text import Text

    head = Text()
    for n, (k, v) in enumerate(header(report)):
        head.append(f"{k}: ", style="bold")
        head.append(v + ("\n" if n % 4 == 3 and n < 11 else "   "))
    con.print(Panel(head, title=f"job {report.job.job_id}", title_align="left"))
    style = SEVERITY_STYLE.get(worst_severity(report), "")
    con.print(Text("verdict: ", style="bold") + Text(report.verdict, style))
    shown, hidden = _near_failure(report, TERMINAL_TIMELINE)
    _print_table(
        con,
        "timeline (UTC)" + (f", {hidden} more: --window or --json" if hidden else ""),
        ["time", "node", "GPU", "kind", "what"],
        [(utc(e.ts), e.node, e.gpu, e.kind, e.text) for e in shown],
        [SEVERITY_STYLE.get(e.severity, "") for e in shown],
    )


def _print_gpus(report: Report, con: Any) -> None:
    """Only the GPUs with something to look at; the others are counted."""
    from rich.text import Text

    xids = xids_by_gpu(report)
    odd = {(s.node, s.gpu) for s in report.stragglers} | set(xids)
    odd |= {(d.node, d.gpu) for d in report.diagnoses if d.node and d.gpu is not None}
    rows, quiet = [], []
    for nf in report.nodes:
        for g in nf.gpus:
            if (nf.node, g.gpu) in odd or notable(g):
                rows.append((nf.node, g.gpu, *gpu_row(g).values(), xid_text(xids, nf.node, g.gpu)))
            else:
                quiet.append(f"{nf.node}:{g.gpu}")
    title = "GPUs" + (f" ({len(quiet)} more without anything notable)" if quiet else "")
    if rows:
        _print_table(con, title, ["node", "GPU", *gpu_columns(), "Xids"], rows)
    elif quiet:
        con.print(Text(f"GPUs: {len(quiet)}, nothing notable (--json or --html for stats)"))


def _print_diagnoses(report: Report, con: Any) -> None:
    from rich.text import Text

    for d in report.diagnoses:
        at = where(d)
        con.print(
            Text(f"{d.title}" + (f" ({at})" if at else ""), SEVERITY_STYLE.get(d.severity, "bold"))
        )
        for label, value in (("cause", d.root_cause), ("verify", d.verify), ("action", d.action)):
            con.print(Text(f"  {label}: ", style="bold") + Text(value))
        for c in d.citations[:5]:
            con.print(Text(f"  evidence: {c.text}" + (f" [{c.ref}]" if c.ref else ""), "dim"))


def print_report(report: Report, console: Any = None) -> None:
    """One screen: header, verdict, timeline, GPUs, diagnoses, evidence, past incidents."""
    from rich.console import Console

    con = console or Console(soft_wrap=False, emoji=False, highlight=False)
    _print_head(report, con)
    _print_gpus(report, con)
    if report.stragglers:
        _print_table(
            con,
            "stragglers",
            ["node", "GPU", "what"],
            [(s.node, s.gpu, s.text) for s in report.stragglers],
        )
    _print_diagnoses(report, con)
    _print_tail(report, con)


def _print_tail(report: Report, con: Any) -> None:
    from rich.text import Text

    for e in report.evidence:
        con.print(
            Text(f"evidence {e.node} ({e.source}): ", style="bold")
            + Text(f"{e.bundle_dir or '-'} manifest {e.manifest or '-'} ({len(e.files)} files)")
        )
    if report.known_incidents:
        _print_table(
            con,
            "known incidents (slurmhealth incident add)",
            ["why", "job", "symptom", "root cause", "fix"],
            [(w, i.job_id, i.symptom, i.root_cause, i.fix) for w, i in report.known_incidents],
        )
    if report.past_incidents:
        _print_table(
            con,
            "past incidents (same node+GPU or Xid)",
            ["time", "job", "node", "GPU", "what"],
            [(utc(i.ts), i.job_id, i.node, i.gpu, i.what) for i in report.past_incidents],
        )
