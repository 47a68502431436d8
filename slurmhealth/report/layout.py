"""What every renderer of a :class:`Report` shows the same way: time stamps, the job header,
a GPU's row, where a diagnosis points, and the columns and rows of the shared tables."""

from __future__ import annotations

import time
from typing import Any

from slurmhealth.diagnose.facts import Diagnosis, GpuStats
from slurmhealth.report.build import Report


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
