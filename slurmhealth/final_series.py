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

With ``[metrics] job_labels = "info"`` per-GPU series keyed by the GPU alone would exist
only after each job: where a GPU's jobs end hours apart (day-long jobs), every job would
make its GPUs' stat series anew (17 a GPU), the churn this mode is there to avoid. So in
this mode a finished job's stats are one series per job and node,

- ``slurmhealth_job_gpu_stats_info{job_id, node, stats="samples util_mean_percent ...",
  gpu_0="<uuid> <value> ... [<reason>=<seconds> ...]", gpu_1=...} 1``: ``stats`` names the
  values' order (the same string for every job), each ``gpu_<index>`` holds that GPU's
  uuid, one value per name (``-``: unknown) in Python's shortest exact notation, then its
  throttle seconds by reason;

a job's record, like ``slurmhealth_job_info``, read by the report (:func:`decode`) and not
meant for PromQL arithmetic. A job then adds one series per node here, whatever its GPUs.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

from slurmhealth.model_records import Job, job_label_values
from slurmhealth.series_labels import SeriesLabels

STAT = "slurmhealth_job_gpu_stat"
THROTTLE = "slurmhealth_job_gpu_throttle_seconds"
RECORD = "slurmhealth_job_gpu_stats_info"  # info mode: one series per job and node

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
_RECORD_HELP = (
    "A finished job's per-GPU stats on one node (job_labels = info): stats names the values "
    "in each gpu_<index> label, after the GPU's uuid; then throttle seconds by reason"
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
    """The families for ``gpus`` (per-GPU stats as ``NodeFacts.to_dict()`` holds them), in
    the form of a sidecar's state file (``export_state``: built without prometheus_client,
    which the epilog does not otherwise import): in ``series`` mode the two per-GPU
    families, labelled as the job's live per-GPU series are (``series_labels``); in
    ``info`` mode the job's one record series for the node."""
    if job_labels == "info":
        return [record(job.job_id, node, gpus)]
    stats: list[list[Any]] = []
    throttle: list[list[Any]] = []
    lab = SeriesLabels(job_labels, job_label_values(job, node))
    for g in gpus:
        values = lab.gpu(str(g.get("gpu", "")), str(g.get("uuid") or ""))
        labels = dict(zip(lab.gpu_names, values, strict=True))
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


def _text(value: float) -> str:
    text = repr(value)  # the shortest text that reads back as exactly this float
    return text[:-2] if text.endswith(".0") else text


_TOKEN = re.compile(r"[^\s=]+\Z")


def record(job_id: str, node: str, gpus: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``info`` mode: the job's stats on ``node`` as one series (no series when no GPU has
    an index)."""
    labels = {"job_id": job_id, "node": node, "stats": " ".join(STATS)}
    for g in gpus:
        index = str(g.get("gpu", ""))
        if not index.isdigit():
            continue
        uuid = str(g.get("uuid") or "")
        words = [uuid if _TOKEN.match(uuid) else "-"]
        for field in STATS.values():
            value = _number(g.get(field))
            words.append("-" if value is None else _text(value))
        for reason, seconds in sorted((g.get("throttle_seconds") or {}).items()):
            value = _number(seconds)
            if value is not None and value > 0 and _TOKEN.match(str(reason)):
                words.append(f"{reason}={_text(value)}")
        labels[f"gpu_{int(index)}"] = " ".join(words)
    samples = [[RECORD, labels, 1.0]] if len(labels) > 3 else []
    return {"name": RECORD, "type": "gauge", "help": _RECORD_HELP, "samples": samples}


def decode(labels: Mapping[str, str]) -> dict[int, dict[str, Any]]:
    """A record series' labels (:func:`record`) -> GPU index -> its stats as
    ``NodeFacts.to_dict()`` holds them (``uuid``, the fields of ``STATS`` it has,
    ``throttle_seconds``); what does not parse is left out."""
    names = labels.get("stats", "").split()
    fields = [STATS.get(name) for name in names]
    out: dict[int, dict[str, Any]] = {}
    for key, text in labels.items():
        if not key.startswith("gpu_") or not key[4:].isdigit():
            continue
        words = text.split()
        if len(words) < 1 + len(names):
            continue
        got: dict[str, Any] = {"uuid": None if words[0] == "-" else words[0]}
        throttle: dict[str, float] = {}
        with contextlib.suppress(ValueError):
            for field, word in zip(fields, words[1 : 1 + len(names)], strict=True):
                if field is not None and word != "-" and math.isfinite(float(word)):
                    got[field] = float(word)
            for word in words[1 + len(names) :]:
                reason, _, seconds = word.partition("=")
                throttle[reason] = float(seconds)
            got["throttle_seconds"] = throttle
            out[int(key[4:])] = got
    return out
