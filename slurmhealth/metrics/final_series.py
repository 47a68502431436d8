"""A finished job's per-GPU stats as series, for reports made later from Prometheus.

A job's live series go within a scrape of its end (docs/metrics.md). A report made from
Prometheus alone would have to read every sample of them: a week of a 64-node job is ~90
million samples at a 60 s scrape, seconds of Prometheus' CPU per report. The epilog
already holds the job's per-GPU stats (``summary.json``, from the history's rollups, O(GPUs)
whatever the job's length), so it publishes them once more, for ``[metrics]
final_linger_s`` after the job (long enough for several scrapes), as

- ``slurmhealth_job_gpu_stat{<GPU labels>, stat="..."}``: one series per stat below (a stat
  the node does not know, e.g. power on a GPU without a reading, has no series), the unit
  at the end of the stat's name;
- ``slurmhealth_job_gpu_throttle_seconds{<GPU labels>, reason="..."}``: seconds the GPU's
  clocks were held down for a hardware reason.

A report reads them with one small query (``report.prometheus``) and reads the raw series
only for the nodes that published none (a node that went down, a scrape that was missed).
The values are the history's own, so the two reports agree exactly.

With ``[metrics] job_labels = "info"`` the stats carry the GPU's labels only (``node``,
``gpu``, ``uuid``), like the live per-GPU series, so a job adds no series here either; the
job they belong to is one more stat, ``stat="job_id"`` (Slurm's job ids are numbers; a job
whose id is not publishes nothing in this mode), and where two finished jobs' stats of one
GPU are served at once the exporter serves the newer (``export_state``). The report takes
the newest scrape whose ``job_id`` is its job's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from slurmhealth.metrics.series_labels import SeriesLabels
from slurmhealth.model_records import Job, job_label_values

STAT = "slurmhealth_job_gpu_stat"
JOB_STAT = "job_id"  # info mode: the stat that names the job
THROTTLE = "slurmhealth_job_gpu_throttle_seconds"

# stat label -> the field of the report's per-GPU stats (diagnose.facts.GpuStats) it holds,
# in that field's unit (percent: the history's own, so the values round-trip exactly)
STATS: dict[str, str] = {
    "samples": "samples",
    "util_mean_percent": "util_mean",
    "util_p5_percent": "util_p5",
    "util_min_percent": "util_min",
    "util_max_percent": "util_max",
    "util_swings": "util_swings",
    "memory_peak_bytes": "mem_peak_bytes",
    "memory_total_bytes": "mem_total_bytes",
    "power_mean_watts": "power_mean_w",
    "temperature_max_celsius": "temp_max_c",
    "thermal_margin_min_celsius": "margin_min_c",
    "pcie_link_gen_min": "pcie_gen_min",
    "pcie_link_width_min": "pcie_width_min",
    "nvlink_active_min": "nvlink_active_min",
    "nvlink_errors": "nvlink_errors_delta",
    "pcie_replay_errors": "pcie_replays_delta",
}
_STAT_HELP = (
    "A finished job's per-GPU stat over the whole job (the node's history), published by "
    "the epilog for [metrics] final_linger_s; the unit ends the stat's name"
)
_THROTTLE_HELP = (
    "Seconds a finished job's GPU had its clocks held down for a hardware reason, "
    "published by the epilog for [metrics] final_linger_s"
)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def families(
    job: Job, node: str, gpus: Iterable[Mapping[str, Any]], job_labels: str = "series"
) -> list[dict[str, Any]]:
    """The two families for ``gpus`` (per-GPU stats as ``NodeFacts.to_dict()`` holds them),
    labelled as the job's live per-GPU series are (``series_labels``), in the form of a
    sidecar's state file (``export_state``: built without prometheus_client, which the
    epilog does not otherwise import)."""
    stats: list[list[Any]] = []
    throttle: list[list[Any]] = []
    lab = SeriesLabels(job_labels, job_label_values(job, node))
    info = job_labels == "info"
    if info and not job.job_id.isdigit():
        gpus = ()  # nothing would say whose stats they are
    for g in gpus:
        values = lab.gpu(str(g.get("gpu", "")), str(g.get("uuid") or ""))
        labels = dict(zip(lab.gpu_names, values, strict=True))
        if info:
            stats.append([STAT, {**labels, "stat": JOB_STAT}, float(job.job_id)])
        for name, field in STATS.items():
            if (value := _number(g.get(field))) is not None:
                stats.append([STAT, {**labels, "stat": name}, value])
        for reason, seconds in sorted((g.get("throttle_seconds") or {}).items()):
            if (value := _number(seconds)) is not None and value > 0:
                throttle.append([THROTTLE, {**labels, "reason": str(reason)}, value])
    return [
        {"name": STAT, "type": "gauge", "help": _STAT_HELP, "samples": stats},
        {"name": THROTTLE, "type": "gauge", "help": _THROTTLE_HELP, "samples": throttle},
    ]
