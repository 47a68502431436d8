"""What every renderer of a :class:`Report` shows the same way: time stamps, the job header,
a GPU's row, where a diagnosis points, and the columns and rows of the shared tables."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from slurmhealth.diagnose.facts import Diagnosis, GpuStats
from slurmhealth.report.build import Report
from slurmhealth.report.efficiency import TimelineEntry

if TYPE_CHECKING:  # a gathered type, named for the annotations only
    from slurmhealth.report.sources import NodeEvidence


def utc(ts: float | None) -> str:
    """``2024-05-01T12:00:03Z`` (ISO 8601, UTC), or ``-``."""
    return "-" if ts is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def num(v: float | None, fmt: str = ".0f", unit: str = "") -> str:
    return "-" if v is None else f"{v:{fmt}}{unit}"


def gpu_row(g: GpuStats) -> dict[str, str]:
    """One GPU's stats as display strings (terminal, markdown and HTML tables)."""
    throttle = ", ".join(f"{k} {v:.0f}s" for k, v in sorted(g.throttle_seconds.items()) if v)
    return {
        "util mean/p5 %": f"{num(g.util_mean)}/{num(g.util_p5)}",
        "mem peak": num(
            None if g.mem_peak_bytes is None else g.mem_peak_bytes / 2**30, ".1f", " GiB"
        ),
        "power mean": num(g.power_mean_w, ".0f", " W"),
        "temp max / margin min": f"{num(g.temp_max_c, '.0f', ' C')} / "
        f"{num(g.margin_min_c, '.0f', ' C')}",
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


def xid_text(xids: dict[tuple[str, int], list[int]], node: str, gpu: int) -> str:
    """The Xids seen on one GPU, ``79,48`` or ``-``."""
    return ",".join(map(str, xids.get((node, gpu), []))) or "-"


def gpu_columns() -> list[str]:
    """The headings of :func:`gpu_row`'s columns."""
    return list(gpu_row(GpuStats(gpu=0)))


def worst_severity(report: Report) -> str:
    """The most severe diagnosis' severity, ``ok`` without one (the verdict's colour)."""
    return max(
        (d.severity for d in report.diagnoses),
        key=["info", "warn", "fail", "critical"].index,
        default="ok",
    )


def where(d: Diagnosis) -> str:
    """``n2 GPU 5``, ``n2``, ``GPU 5`` or empty: where a diagnosis points."""
    return " ".join(x for x in (d.node or "", "" if d.gpu is None else f"GPU {d.gpu}") if x)


TIMELINE_COLUMNS = ("time", "node", "GPU", "kind", "severity", "what")
PAST_COLUMNS = ("time", "job", "node", "GPU", "severity", "what")
STRAGGLER_COLUMNS = ("node", "GPU", "source", "what")


def timeline_rows(report: Report) -> list[tuple[Any, ...]]:
    return [(utc(e.ts), e.node, e.gpu, e.kind, e.severity, e.text) for e in report.timeline]


def straggler_rows(report: Report) -> list[tuple[Any, ...]]:
    return [(s.node, s.gpu, s.source, s.text) for s in report.stragglers]


def past_rows(report: Report) -> list[tuple[Any, ...]]:
    return [(utc(i.ts), i.job_id, i.node, i.gpu, i.severity, i.what) for i in report.past_incidents]


def shown(value: Any) -> str:
    """A header value as shown: unset, empty or Slurm's ``(null)`` is ``-``."""
    text = "" if value is None else str(value).strip()
    return "-" if text.lower() in ("", "(null)", "null", "none") else text


def header(report: Report) -> list[tuple[str, str]]:
    j = report.job
    return [
        ("job", j.job_id),
        ("user", shown(j.user)),
        ("account", shown(j.account)),
        ("partition", shown(j.partition)),
        ("QOS", shown(j.qos)),
        ("priority", shown(j.priority)),
        ("nodes", ",".join(j.node_names) or "-"),
        ("GPUs", ",".join(map(str, j.gpus)) or "-"),
        ("start", utc(j.start_ts)),
        ("end", utc(j.end_ts)),
        ("state", shown(j.state)),
        ("exit", shown(j.exit_code)),
    ]


TASK_COLUMNS = ("node", "steps", "step s (median)", "samples/s first -> last", "MFU", "comm",
                "data wait")  # fmt: skip


def task_rows(report: Report) -> list[tuple[Any, ...]]:
    """Per node what the training loop reported (step time, throughput, MFU, comm share)."""
    return [
        (
            nf.node,
            t.steps_total,
            num(t.step_seconds_median, ".3g"),
            f"{num(t.samples_per_second_first, '.4g')} -> {num(t.samples_per_second_last, '.4g')}",
            num(t.mfu_ratio, ".0%"),
            num(t.comm_ratio, ".0%"),
            num(t.data_wait_ratio, ".0%"),
        )
        for nf in report.nodes
        if (t := nf.task) is not None
    ]


def evidence_files(e: NodeEvidence) -> list[str]:
    """The node's bundle files, each once, relative to its bundle folder (else as stored)."""
    base = e.bundle_dir
    out: dict[str, None] = {}
    for f in e.files:
        path = str(f.get("path") or "")
        if base and os.path.isabs(path) and path.startswith(base.rstrip("/") + "/"):
            path = os.path.relpath(path, base)
        if path:
            out.setdefault(path, None)
    return list(out)


def evidence_dir(report: Report) -> str | None:
    """The folder every node's bundle of the job sits in (``<evidence_dir>/<job>``), if one."""
    parents = {os.path.dirname(e.bundle_dir.rstrip("/")) for e in report.evidence if e.bundle_dir}
    return parents.pop() if len(parents) == 1 else None


def bundle_text(report: Report, e: NodeEvidence) -> str:
    """``n2: kernel.log, manifest.json`` with the bundle's folder relative to the job's."""
    files = evidence_files(e)
    if not e.bundle_dir and not files:
        return f"{e.node} ({e.source}): no evidence bundle"
    folder = e.bundle_dir or "-"
    root = evidence_dir(report)
    if root and e.bundle_dir:
        folder = os.path.relpath(e.bundle_dir, root) + "/"
    return f"{e.node} ({e.source}) {folder}: {', '.join(files) if files else 'no files'}"


def fault_text(report: Report) -> str:
    """``hardware (confidence 95%)``: whose fault it is."""
    a = report.answer
    if a is None:
        return "-"
    return a.fault_class + ("" if a.confidence is None else f" (confidence {a.confidence:.0%})")


def moment_text(e: TimelineEntry) -> str:
    """A collapsed timeline entry's text with its repeat count and last time."""
    if e.count <= 1:
        return e.text
    last = f" until {utc(e.last_ts)}" if e.last_ts is not None else ""
    return f"{e.text} (x{e.count}{last})"


def odd_gpus(report: Report) -> set[tuple[str, int]]:
    """(node, GPU) pairs that misbehaved: a diagnosis, a straggler or an Xid points at them."""
    odd = {(s.node, s.gpu) for s in report.stragglers} | set(xids_by_gpu(report))
    return odd | {(d.node, d.gpu) for d in report.diagnoses if d.node and d.gpu is not None}


def failure_shown(report: Report) -> float | None:
    """The failure time worth a line: a fail or critical entry's, not a healthy job's end."""
    ts = report.failure_ts
    bad = any(e.ts == ts and e.severity in ("fail", "critical") for e in report.timeline)
    return ts if bad else None
