"""A :class:`Report` for people (markdown; the terminal in ``report.terminal``) and machines
(versioned JSON).

No logic beyond layout: everything shown is in the report. The JSON is documented in
``docs/report-schema.json`` (``"schema": "slurmhealth.report/1"``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, fields
from typing import Any

from slurmhealth.diagnose.facts import job_to_dict
from slurmhealth.report.build import SCHEMA, Report
from slurmhealth.report.layout import (
    PAST_COLUMNS,
    STRAGGLER_COLUMNS,
    TASK_COLUMNS,
    TIMELINE_COLUMNS,
    bundle_text,
    evidence_dir,
    failure_shown,
    fault_text,
    gpu_columns,
    gpu_row,
    header,
    moment_text,
    past_rows,
    straggler_rows,
    task_rows,
    timeline_rows,
    utc,
    xid_text,
    xids_by_gpu,
)
from slurmhealth.report.terminal import print_report

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
            **job_to_dict(j),
            "nodes": list(j.node_names),
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
        "diagnoses": [{**d.to_dict(), "action": d.admin_action} for d in report.diagnoses],
        "evidence": [{**asdict(e), "files": [dict(f) for f in e.files]} for e in report.evidence],
        "past_incidents": [{**asdict(i), "time": utc(i.ts)} for i in report.past_incidents],
        "searched": list(report.searched),
        "unreached": [{"source": s, "why": w} for s, w in report.unreached],
        "incidents": [{"why": why, **asdict(i)} for why, i in report.known_incidents],
        "answer": None if report.answer is None else asdict(report.answer),
        "efficiency": None if report.efficiency is None else asdict(report.efficiency),
        "diagnosis_groups": [
            {k: v for k, v in asdict(g).items() if k != "diagnoses"} for g in report.groups
        ],
        "timeline_summary": [{**asdict(e), "time": utc(e.ts)} for e in report.moments],
    }


# -- markdown -------------------------------------------------------------------------------


def _md_cell(v: Any) -> str:
    return "-" if v is None or v == "" else str(v).replace("|", "\\|").replace("\n", " ")


def _md_table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(_md_cell(v) for v in row) + " |" for row in rows]
    return out


def _md_answer(report: Report) -> list[str]:
    """The verdict, whose fault, the next steps and what was already done."""
    lines = [f"# slurmhealth report: job {report.job.job_id}", "", f"**Verdict:** {report.verdict}"]
    a = report.answer
    if a is not None:
        lines += ["", f"**Whose fault:** {fault_text(report)}"]
        lines += [f"- evidence: {e}" for e in a.evidence]
        lines += ["", f"**What you should do:** {a.user_action}"]
        lines += ["", *(f"- already done: {d}" for d in a.admin_done)] if a.admin_done else []
        lines += ["", f"**What the admins should do:** {a.admin_action}"]
    if failure_shown(report) is not None:
        lines += [
            "",
            f"Failure at {utc(report.failure_ts)}"
            + (f" (timeline within ±{report.window_s:g} s)" if report.window_s else ""),
        ]
    return [*lines, "", *_md_table(["field", "value"], header(report)), ""]


def _md_efficiency(report: Report) -> list[str]:
    lines = ["## Efficiency", ""]
    lines += [f"- {x}" for x in (report.efficiency.lines if report.efficiency else ())]
    rows = task_rows(report)
    if rows:
        lines += ["", "## Task metrics", "", *_md_table(TASK_COLUMNS, rows)]
    return [*lines, ""]


def _md_diagnoses(report: Report) -> list[str]:
    """One line per cause, then each cause's texts once."""
    lines = ["## Diagnoses", ""]
    if not report.groups:
        return [*lines, "No diagnosis matched.", ""]
    lines += [f"- **{g.line}** ({g.severity}, {g.fault_class})" for g in report.groups]
    for g in report.groups:
        d = g.diagnoses[0]
        lines += ["", f"### {g.line}", "", f"- root cause: {d.root_cause}",
                  f"- verify: {d.verify}", f"- you: {d.user_action}",
                  f"- admins: {d.admin_action}"]  # fmt: skip
        for c in d.citations[:5]:
            text = c.text.splitlines()[0] if c.text else ""
            lines.append(f"- evidence ({c.kind}): {text}" + (f" [{c.ref}]" if c.ref else "")
                         + (f" at {utc(c.ts)}" if c.ts else ""))  # fmt: skip
    return [*lines, ""]


def _md_timeline(report: Report, full: bool) -> list[str]:
    if full:
        return ["## Timeline (UTC)", "", *_md_table(TIMELINE_COLUMNS, timeline_rows(report)), ""]
    rows = [(utc(e.ts), e.node, e.gpu, e.kind, e.severity, moment_text(e)) for e in report.moments]
    hidden = len(report.timeline) - len(report.moments)
    more = f"{hidden} more {'entry' if hidden == 1 else 'entries'}"
    note = [f"{more}: `--timeline`", ""] if hidden > 0 else []
    return ["## Timeline (UTC), what matters", "", *note, *_md_table(TIMELINE_COLUMNS, rows), ""]


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
    return ["## GPUs", "", *_md_table(cols, rows)]


def _md_tail(report: Report) -> list[str]:
    """Stragglers, evidence and past incidents."""
    lines = []
    if report.stragglers:
        lines += ["", "## Stragglers", "", *_md_table(STRAGGLER_COLUMNS, straggler_rows(report))]
    root = evidence_dir(report)
    lines += ["", "## Evidence" + (f" (in {root})" if root else ""), ""]
    lines += [f"- {bundle_text(report, e)}" for e in report.evidence]
    lines += ["", "## Past incidents (same node+GPU or Xid)", ""]
    return lines + _md_table(PAST_COLUMNS, past_rows(report))


def to_markdown(report: Report, full_timeline: bool = False) -> str:
    """The answer first, then efficiency, diagnoses, the timeline (collapsed unless
    ``full_timeline``), GPUs, evidence and past incidents."""
    lines = _md_answer(report) + _md_efficiency(report) + _md_diagnoses(report)
    lines += _md_timeline(report, full_timeline) + _md_gpus(report) + _md_tail(report)
    return "\n".join(lines) + "\n"


__all__ = ["print_report", "sparkline", "to_json", "to_markdown"]
