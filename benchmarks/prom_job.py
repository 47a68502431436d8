"""A long many-node job in a real Prometheus, for ``report_latency.py --prometheus``.

The series are the exporter's own: one scrape per node is rendered by the real
``SidecarCollector`` (in either ``[metrics] job_labels`` mode) and each of its lines becomes
a template (name and labels as Prometheus stores them); the generator then writes every
sample of every series with its time (OpenMetrics, series after series: a week of 512 GPUs
is ~90 million lines, so each value is a precomputed string and each series one ``join``),
and promtool backfills the file.
A healthy training job: utilisation ~97 % with a checkpoint dip a day, power and temperature
that move, a PCIe replay counter that grows, GPU 3 of the sixth node thermal-throttled
6 samples in every 720. After the job, what each node's epilog publishes for
``final_linger_s`` (``final_series``): the per-GPU stats its history holds, computed here by
the history's own code from the same samples (one history per distinct node: the
throttled one and the others), served by 5 scrapes.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slurmhealth.model import GpuState, NodeSnapshot, NvLink
from slurmhealth.model_records import ExportState, Job

# (tests.* is imported where the data is built: it imports pytest, which the timed report
# process must not pay for)

FINAL_SCRAPES = (30, 90, 150, 210, 270)  # s after the job: a 300 s linger at a 60 s scrape

Values = Callable[[int], Sequence[str]]  # GPU index -> one value string per sample


def _states(node: str, gpus: int, throttled: int | None, **values: Any) -> tuple[GpuState, ...]:
    """The node's GPUs at one moment (``values``: a field's value for each of 8 GPUs)."""
    links = tuple(NvLink(n, True, replay_errors=0, recovery_errors=0, crc_flit_errors=0,
                         crc_data_errors=0) for n in range(18))  # fmt: skip
    fields: dict[str, Any] = dict(
        temperature_c=60, margin_temperature_c=25, power_w=600.0, utilization_gpu_pct=97,
        memory_total_bytes=80 * 2**30, memory_used_bytes=70 * 2**30, pcie_gen=5,
        pcie_width=16, pcie_replay_errors=0, nvlinks=links,
    )  # fmt: skip
    return tuple(
        GpuState(index=g, uuid=f"GPU-{node}-{g:02d}-0000-0000-000000000000",
                 name="NVIDIA H100 80GB HBM3",
                 clock_event_reasons=0x40 if g == throttled else 0,
                 **{**fields, **{k: v[g % 8] for k, v in values.items()}})
        for g in range(gpus)
    )  # fmt: skip


def _template(
    job: str, node: str, gpus: int, throttled: int | None, job_labels: str = "series"
) -> list[str]:
    """The exposition lines of one scrape of the node (values are placeholders; GPU
    ``throttled`` shows HW thermal slowdown)."""
    state = ExportState(Job(job_id=job, node=node, user="bench", priority=1),
                        NodeSnapshot(node, 0.0, _states(node, gpus, throttled)),
                        samples_total=1)  # fmt: skip
    from tests.support.prom_backfill import scrape

    return [line for line in scrape(state, job_labels).splitlines() if line and line[0] != "#"]


def _series_values(n: int) -> dict[str, Values]:
    """Metric name -> the value strings of GPU g's samples (constant series: one string)."""

    def per_gpu(f: Callable[[int, int], float], fmt: str = "{:g}") -> Values:
        cache = {g: [fmt.format(f(g, i)) for i in range(n)] for g in range(8)}
        return lambda g: cache[g % 8]

    util = per_gpu(lambda g, i: 0.02 if (i + 97 * g) % 1440 < 10 else 0.95 + (i * 7 + g) % 5 / 100)
    return {
        "slurmhealth_gpu_utilization_ratio": util,
        "slurmhealth_gpu_power_watts": per_gpu(lambda g, i: 600 + (i * 7 + g) % 50 + 0.5),
        "slurmhealth_gpu_temperature_celsius": per_gpu(lambda g, i: 60 + (i + g) % 10),
        "slurmhealth_gpu_thermal_margin_celsius": per_gpu(lambda g, i: 25 - (i + g) % 10),
        "slurmhealth_gpu_pcie_replay_errors_total": per_gpu(lambda g, i: i // 2000),
        "slurmhealth_sidecar_samples_total": lambda g: [str(i + 1) for i in range(n)],
    }


def _published(job: str, nodes: int, gpus: int, samples: int, step: float, start: float,
               tmp: Path, job_labels: str = "series") -> str:  # fmt: skip
    """The stamped scrapes of what every node's epilog publishes after the job: its
    history's per-GPU stats (``summary.json``), from the same samples as the series."""
    from dataclasses import asdict

    from slurmhealth.history import Batch, History
    from slurmhealth.history.read import Reader
    from slurmhealth.history.rows import sample_rows
    from slurmhealth.metrics.final_series import families
    from slurmhealth.summary.collect import node_facts
    from tests.support.prom_backfill import scrape_families, stamped

    v = _series_values(samples)
    num = {name: [[float(x) for x in v[name](g)] for g in range(8)] for name in v}
    util, power = num["slurmhealth_gpu_utilization_ratio"], num["slurmhealth_gpu_power_watts"]
    temp, margin = (
        num["slurmhealth_gpu_temperature_celsius"],
        num["slurmhealth_gpu_thermal_margin_celsius"],
    )
    replay = num["slurmhealth_gpu_pcie_replay_errors_total"]
    stats = {}
    for throttled in (None, 3):  # node 6 (index 5) and the others
        with History(tmp / f"final-{throttled}.db") as db:
            for first in range(0, samples, 500):
                rows = []
                for i in range(first, min(samples, first + 500)):
                    at = {"utilization_gpu_pct": [round(u[i] * 100) for u in util],
                          "power_w": [p[i] for p in power],
                          "temperature_c": [round(t[i]) for t in temp],
                          "margin_temperature_c": [round(m[i]) for m in margin],
                          "pcie_replay_errors": [round(r[i]) for r in replay]}  # fmt: skip
                    gs = _states("n", gpus, throttled if i % 720 < 6 else None, **at)
                    rows += sample_rows(NodeSnapshot("n", start + i * step, gs), job)
                db.write(Batch(inserts=[("samples", r) for r in rows]))
        with Reader(tmp / f"final-{throttled}.db") as db:
            stats[throttled] = [asdict(g) for g in node_facts(db, job, "n").gpus]
    out = []
    for k in range(nodes):
        node = f"n{k + 1:03d}"
        gpu_stats = [{**g, "uuid": f"GPU-{node}-{g['gpu']:02d}-0000-0000-000000000000"}
                     for g in stats[3 if k == 5 else None]]  # fmt: skip
        labels = Job(job_id=job, node=node, user="bench", priority=1)
        text = scrape_families(families(labels, node, gpu_stats, job_labels))
        end = start + (samples - 1) * step
        out += [stamped(text, end + d) for d in FINAL_SCRAPES]
    return "".join(out)


def write_job(path: Path, job: str, nodes: int, gpus: int, samples: int, step: float,
              end: float, job_labels: str = "series") -> float:  # fmt: skip
    """The OpenMetrics file of the job's ``samples`` scrapes ``step`` s apart, the last at
    ``end``; returns the first scrape's time."""
    start = end - (samples - 1) * step
    stamps = [f" {start + i * step:.0f}\n" for i in range(samples)]
    values = _series_values(samples)
    hot = [i for i in range(samples) if i % 720 < 6]  # the throttled GPU's moments
    with path.open("w") as out:
        for k in range(nodes):
            node = f"n{k + 1:03d}"
            for line in _template(job, node, gpus, 3 if k == 5 else None, job_labels):
                head, const = line.rsplit(" ", 1)
                name = head.split("{", 1)[0]
                if name == "slurmhealth_gpu_clock_event_active":  # a series only while it holds
                    out.write("".join(f"{head} {const}{stamps[i]}" for i in hot))
                    continue
                gpu = int(head.split('gpu="', 1)[1].split('"', 1)[0]) if 'gpu="' in head else 0
                if name in values:
                    vs = values[name](gpu)
                    out.write("".join([f"{head} {v}{t}" for v, t in zip(vs, stamps, strict=True)]))
                else:
                    out.write(f"{head} {const}".join(["", *stamps]))
        out.write(_published(job, nodes, gpus, samples, step, start, path.parent, job_labels))
        out.write("# EOF\n")
    return start


def build(
    data_dir: Path, job: str, nodes: int, gpus: int, days: float, step: float,
    job_labels: str = "series",
) -> dict[str, float]:  # fmt: skip
    """Backfill the job (ending an hour ago, within Prometheus' retention) into
    ``data_dir``/tsdb unless it holds it already; returns the job's window and set-up times."""
    marker = data_dir / "job-final.txt"  # (job.txt: data without the published stats)
    if marker.exists():
        start, end = map(float, marker.read_text().split())
        return {"start": start, "end": end, "generate_s": 0.0, "backfill_s": 0.0}
    data_dir.mkdir(parents=True, exist_ok=True)
    samples = int(days * 86400 / step)
    end = float(int(time.time() - 3600) // 60 * 60)
    t0 = time.perf_counter()
    om = data_dir / "job.om"
    start = write_job(om, job, nodes, gpus, samples, step, end, job_labels)
    t1 = time.perf_counter()
    from tests.support.prom_backfill import backfill

    backfill(om, data_dir / "tsdb")
    t2 = time.perf_counter()
    om.unlink()
    marker.write_text(f"{start} {end}\n")
    return {"start": start, "end": end, "generate_s": t1 - t0, "backfill_s": t2 - t1}


def server_cpu(url: str) -> float:
    """Prometheus' own CPU seconds so far (its ``process_cpu_seconds_total``): what a
    report costs it, whatever else the machine runs."""
    from tests.prometheus_util import get_text

    for line in get_text(f"{url}/metrics").splitlines():
        if line.startswith("process_cpu_seconds_total "):
            return float(line.split()[1])
    return math.nan


def print_figures(r: dict[str, Any]) -> None:
    print(
        f"{r['gpus']} GPUs on {r['nodes']} nodes ({r.get('job_labels', 'series')}), "
        f"{r['days']:g} days, one scrape every "
        f"{r['step_s']:g} s ({r['samples_per_series']} samples per series; generated in "
        f"{r['generate_s']} s, backfilled in {r['backfill_s']} s); {r['runs']} runs each "
        f"(target <= 2 s):"
    )
    for key, what in (("gpu_stats", "PromSource.gpu_stats"),
                      ("report_process", "the report process (JSON)")):  # fmt: skip
        x = r[key]
        print(f"  {what}: median {x['median_s']} s (min {x['min_s']}, max {x['max_s']})")
    print(f"  CPU per gpu_stats: Prometheus {r['prometheus_cpu_s']} s, client "
          f"{r['client_cpu_s']} s (load average {r['load_average']:.1f} on {os.cpu_count()} "
          f"cores)")  # fmt: skip
    x = r["from_series"]
    print(
        f"  without published stats (every node's computed from its series): gpu_stats "
        f"median {x['median_s']} s (min {x['min_s']}, max {x['max_s']})"
    )
    off = {k: v for k, v in r["series_vs_published"].items() if v > 0}
    print(f"  published vs computed from the series, largest relative difference: {off or 0}")
    if r["skipped"]:
        print(f"  not computed from the series at this size: {', '.join(r['skipped'])}")


def report_json(url: str, job: str, start: float, end: float) -> str:
    """What ``slurmhealth report JOB --json`` prints when Prometheus is its only source of
    per-GPU stats: the job's facts from ``PromSource``, diagnosed and assembled by the
    report's own code (the accounting side, sacct/AdminComment, adds the job's rows)."""
    import json

    from slurmhealth.config import load_config
    from slurmhealth.diagnose.engine import diagnose
    from slurmhealth.diagnose.facts import Facts, NodeFacts
    from slurmhealth.report import build
    from slurmhealth.report.prometheus import PromSource
    from slurmhealth.report.render import to_json

    stats = PromSource(url, 60.0).gpu_stats(job, start, end)
    facts = Facts(
        Job(job_id=job, node_names=tuple(stats), start_ts=start, end_ts=end, state="completed"),
        tuple(NodeFacts(node=node, gpus=gpus) for node, gpus in stats.items()),
    )
    cfg = load_config(os.devnull, env={})
    report = build.assemble(facts, diagnose(facts), build.Read((), (), (), ()),
                            straggler_ratio=cfg.sidecar.straggler_ratio, window_s=None,
                            now=time.time())  # fmt: skip
    return json.dumps(to_json(report))


if __name__ == "__main__":  # python benchmarks/prom_job.py URL JOB START END
    print(report_json(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])))
