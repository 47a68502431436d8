"""A :class:`Report` for people (rich terminal, markdown) and machines (versioned JSON).

No logic beyond layout: everything shown is in the report. The JSON is documented in
``docs/report-schema.json`` (``"schema": "slurmhealth.report/1"``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, fields
from typing import Any

from slurmhealth.diagnose.facts import GpuStats
from slurmhealth.report.build import SCHEMA, Report

SEVERITY_STYLE = {
    "critical": "bold red",
    "fail": "red",
    "warn": "yellow",
    "info": "cyan",
    "ok": "green",
}
TERMINAL_TIMELINE = 30  # entries shown on screen (nearest the failure); JSON has them all
SPARK = "▁▂▃▄▅▆▇█"


def utc(ts: float | None) -> str:
    """``2024-05-01T12:00:03Z`` (ISO 8601, UTC), or ``-``."""
    return "-" if ts is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def _num(v: float | None, fmt: str = ".0f", unit: str = "") -> str:
    return "-" if v is None else f"{v:{fmt}}{unit}"


def gpu_row(g: GpuStats) -> dict[str, str]:
    """One GPU's stats as display strings (terminal, markdown and HTML tables)."""
    throttle = ", ".join(f"{k} {v:.0f}s" for k, v in sorted(g.throttle_seconds.items()) if v)
    return {
        "util mean/p5 %": f"{_num(g.util_mean)}/{_num(g.util_p5)}",
        "mem peak": _num(
            None if g.mem_peak_bytes is None else g.mem_peak_bytes / 2**30, ".1f", " GiB"
        ),
        "power mean": _num(g.power_mean_w, ".0f", " W"),
        "temp max / margin min": f"{_num(g.temp_max_c, '.0f', ' C')} / "
        f"{_num(g.margin_min_c, '.0f', ' C')}",
        "throttle": throttle or "-",
        "NVLink err Δ": str(g.nvlink_errors_delta),
        "PCIe replay Δ": str(g.pcie_replays_delta),
    }


def notable(g: GpuStats) -> bool:
    """Anything on this GPU an operator should look at (the terminal hides the others)."""
    return bool(
        any(g.throttle_seconds.values())
        or g.nvlink_errors_delta
        or g.pcie_replays_delta
        or (g.margin_min_c is not None and g.margin_min_c < 5)
        or g.util_swings > 10
    )


def xids_by_gpu(report: Report) -> dict[tuple[str, int], list[int]]:
    out: dict[tuple[str, int], list[int]] = {}
    for nf in report.nodes:
        for row in (*nf.findings, *nf.events):
            ev = row.get("evidence")
            if row.get("gpu") is not None and isinstance(ev, dict) and "xid" in ev:
                xs = out.setdefault((nf.node, int(row["gpu"])), [])
                if ev["xid"] not in xs:
                    xs.append(ev["xid"])
    return out


def header(report: Report) -> list[tuple[str, str]]:
    j = report.job
    return [
        ("job", j.job_id),
        ("user", j.user or "-"),
        ("account", j.account or "-"),
        ("partition", j.partition or "-"),
        ("QOS", j.qos or "-"),
        ("priority", "-" if j.priority is None else str(j.priority)),
        ("nodes", ",".join(j.nodes) or "-"),
        ("GPUs", ",".join(map(str, j.gpus)) or "-"),
        ("start", utc(j.start_ts)),
        ("end", utc(j.end_ts)),
        ("state", j.state or "-"),
        ("exit", j.exit_code or "-"),
    ]


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


def to_markdown(report: Report) -> str:
    j = report.job
    lines = [f"# slurmhealth report: job {j.job_id}", ""]
    lines += [*_md_table(["field", "value"], header(report)), ""]
    lines += [f"**Verdict:** {report.verdict}", ""]
    if report.failure_ts is not None:
        lines += [
            f"Failure at {utc(report.failure_ts)}"
            + (f" (timeline within ±{report.window_s:g} s)" if report.window_s else ""),
            "",
        ]
    lines += ["## Timeline (UTC)", ""]
    lines += _md_table(
        ["time", "node", "GPU", "kind", "severity", "what"],
        [(utc(e.ts), e.node, e.gpu, e.kind, e.severity, e.text) for e in report.timeline],
    )
    lines += ["", "## GPUs", ""]
    xids = xids_by_gpu(report)
    rows = []
    for nf in report.nodes:
        for g in nf.gpus:
            stats = gpu_row(g)
            util = sparkline((p[1] for p in g.series), 100.0)
            power = sparkline(
                (p[2] for p in g.series), max((p[2] or 0 for p in g.series), default=0)
            )
            xs = ",".join(map(str, xids.get((nf.node, g.gpu), []))) or "-"
            rows.append((nf.node, g.gpu, *stats.values(), xs, util, power))
    cols = ["node", "GPU", *gpu_row(GpuStats(gpu=0)).keys(), "Xids", "util plot", "power plot"]
    lines += _md_table(cols, rows)
    if report.stragglers:
        lines += ["", "## Stragglers", ""]
        lines += _md_table(
            ["node", "GPU", "source", "what"],
            [(s.node, s.gpu, s.source, s.text) for s in report.stragglers],
        )
    tasks = [(nf.node, nf.task) for nf in report.nodes if nf.task]
    if tasks:
        lines += ["", "## Task metrics", ""]
        lines += _md_table(
            [
                "node",
                "steps",
                "step s (median)",
                "samples/s first -> last",
                "MFU",
                "comm",
                "data wait",
            ],
            [
                (
                    n,
                    t.steps_total,
                    _num(t.step_seconds_median, ".3g"),
                    f"{_num(t.samples_per_second_first, '.4g')} -> "
                    f"{_num(t.samples_per_second_last, '.4g')}",
                    _num(t.mfu_ratio, ".0%"),
                    _num(t.comm_ratio, ".0%"),
                    _num(t.data_wait_ratio, ".0%"),
                )
                for n, t in tasks
            ],
        )
    lines += ["", "## Diagnoses", ""]
    for d in report.diagnoses:
        where = " ".join(x for x in (d.node or "", "" if d.gpu is None else f"GPU {d.gpu}") if x)
        lines += [
            f"### {d.title} ({d.severity}, confidence {d.confidence:.0%})"
            + (f" on {where}" if where else ""),
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
        lines.append("")
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
    lines += _md_table(
        ["time", "job", "node", "GPU", "severity", "what"],
        [(utc(i.ts), i.job_id, i.node, i.gpu, i.severity, i.what) for i in report.past_incidents],
    )
    return "\n".join(lines) + "\n"


# -- terminal -------------------------------------------------------------------------------


def _near_failure(report: Report, n: int) -> tuple[list[Any], int]:
    entries = list(report.timeline)
    if len(entries) <= n:
        return entries, 0
    pivot = report.failure_ts if report.failure_ts is not None else entries[-1].ts
    keep = sorted(sorted(entries, key=lambda e: abs(e.ts - pivot))[:n], key=lambda e: e.ts)
    return keep, len(entries) - n


def print_report(report: Report, console: Any = None) -> None:
    """One screen: header, verdict, timeline, GPUs, diagnoses, evidence, past incidents."""
    from rich.console import Console
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    con = console or Console(soft_wrap=False, emoji=False, highlight=False)
    head = Text()
    for n, (k, v) in enumerate(header(report)):
        head.append(f"{k}: ", style="bold")
        head.append(v + ("\n" if n % 4 == 3 and n < 11 else "   "))
    con.print(Panel(head, title=f"job {report.job.job_id}", title_align="left"))
    worst = max(
        (d.severity for d in report.diagnoses),
        key=["info", "warn", "fail", "critical"].index,
        default="ok",
    )
    con.print(Text("verdict: ", style="bold") + Text(report.verdict, SEVERITY_STYLE.get(worst, "")))

    def table(
        title: str,
        cols: Sequence[str],
        rows: Iterable[Sequence[Any]],
        styles: Sequence[str] | None = None,
    ) -> None:
        t = Table(title=title, title_justify="left")
        for c in cols:
            t.add_column(c, overflow="fold")
        for i, row in enumerate(rows):
            t.add_row(
                *(Text("-" if v is None else str(v)) for v in row),
                style=styles[i] if styles else None,
            )
        con.print(t)

    shown, hidden = _near_failure(report, TERMINAL_TIMELINE)
    title = "timeline (UTC)" + (f", {hidden} more: --window or --json" if hidden else "")
    table(
        title,
        ["time", "node", "GPU", "kind", "what"],
        [(utc(e.ts), e.node, e.gpu, e.kind, e.text) for e in shown],
        [SEVERITY_STYLE.get(e.severity, "") for e in shown],
    )
    xids = xids_by_gpu(report)
    odd = {(s.node, s.gpu) for s in report.stragglers} | set(xids)
    odd |= {(d.node, d.gpu) for d in report.diagnoses if d.node and d.gpu is not None}
    rows, quiet = [], []
    for nf in report.nodes:
        for g in nf.gpus:
            if (nf.node, g.gpu) in odd or notable(g):
                xs = ",".join(map(str, xids.get((nf.node, g.gpu), []))) or "-"
                rows.append((nf.node, g.gpu, *gpu_row(g).values(), xs))
            else:
                quiet.append(f"{nf.node}:{g.gpu}")
    title = "GPUs" + (f" ({len(quiet)} more without anything notable)" if quiet else "")
    if rows:
        table(title, ["node", "GPU", *gpu_row(GpuStats(gpu=0)), "Xids"], rows)
    elif quiet:
        con.print(Text(f"GPUs: {len(quiet)}, nothing notable (--json or --html for stats)"))
    if report.stragglers:
        table(
            "stragglers",
            ["node", "GPU", "what"],
            [(s.node, s.gpu, s.text) for s in report.stragglers],
        )
    for d in report.diagnoses:
        where = " ".join(x for x in (d.node or "", "" if d.gpu is None else f"GPU {d.gpu}") if x)
        con.print(
            Text(
                f"{d.title}" + (f" ({where})" if where else ""),
                SEVERITY_STYLE.get(d.severity, "bold"),
            )
        )
        for label, value in (("cause", d.root_cause), ("verify", d.verify), ("action", d.action)):
            con.print(Text(f"  {label}: ", style="bold") + Text(value))
        for c in d.citations[:5]:
            con.print(Text(f"  evidence: {c.text}" + (f" [{c.ref}]" if c.ref else ""), "dim"))
    _print_tail(report, con, table)


def _print_tail(report: Report, con: Any, table: Any) -> None:
    from rich.text import Text

    for e in report.evidence:
        con.print(
            Text(f"evidence {e.node} ({e.source}): ", style="bold")
            + Text(f"{e.bundle_dir or '-'} manifest {e.manifest or '-'} ({len(e.files)} files)")
        )
    if report.known_incidents:
        table(
            "known incidents (slurmhealth incident add)",
            ["why", "job", "symptom", "root cause", "fix"],
            [(w, i.job_id, i.symptom, i.root_cause, i.fix) for w, i in report.known_incidents],
        )
    if report.past_incidents:
        table(
            "past incidents (same node+GPU or Xid)",
            ["time", "job", "node", "GPU", "what"],
            [(utc(i.ts), i.job_id, i.node, i.gpu, i.what) for i in report.past_incidents],
        )
