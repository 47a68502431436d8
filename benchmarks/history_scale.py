"""A node's history after a year of default use: its size, the epilog summary of a
30-day job, and the report of a 3-node day.

Usage: python benchmarks/history_scale.py [--days 365] [--gpus 8] [--interval 10]
       [--busy 0.85] [--report-runs 5] [--json] [--keep DIR]

Writes, through the real writer (``History.write`` of ``Batch``es, one per simulated hour
of a job, so the rollups are kept as the sidecar's writes keep them), a node's year: a
realistic job mix (minutes-long debug runs to week-long trainings on 1, 2, 4 or 8 GPUs, a
third of them reporting step metrics through the task channel, prolog and epilog check
runs, a few findings and events) with the node busy ``--busy`` of the time, GPUs sampled
every ``--interval`` s. Retention runs as on a node: the bounded prune (default
``[history]``) after every job and once a simulated hour (the health check). The last job
is a 30-day 8-GPU training.

Measured, with the targets of issue 14: the database's size (< 2 GB a year), the epilog's
summary of the 30-day job (``evidence.summary.node_summary``, < 1 s), and
``slurmhealth report JOBID --json`` for 3 nodes x 24 h from local histories (the
``report_latency`` benchmark's data, whole process, median, <= 1 s). Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

NODE = "n1"
T0 = 1_700_000_000.0
DAY = 86400.0
HOUR = 3600.0
# (share of jobs, shortest s, longest s): debug runs, day jobs, week-long trainings
DURATIONS = ((0.45, 600, 2 * HOUR), (0.40, 2 * HOUR, DAY), (0.15, DAY, 7 * DAY))
GPU_COUNTS = ((8, 0.5), (4, 0.2), (2, 0.15), (1, 0.15))


def _sample(rng: random.Random, job: str, gpu: int, ts: float, i: int) -> dict[str, Any]:
    hot = i % 720 < 6  # a short HW thermal slowdown every two hours
    return {
        "ts": ts, "node": NODE, "job_id": job, "gpu": gpu, "uuid": f"GPU-{gpu:04d}",
        "util_pct": float(rng.randrange(85, 101)), "power_w": 550.0 + rng.random() * 150,
        "mem_used_bytes": 70 * 2**30, "temp_c": 60.0 + gpu, "margin_c": 25.0 - gpu,
        "clock_reasons": 0x40 if hot else 0, "pcie_gen": 5, "pcie_width": 16,
        "nvlink_active": 18, "nvlink_errors": 0, "pcie_replay": 0,
        "mem_util_pct": 40.0, "power_limit_w": 700.0, "energy_j": 650.0 * 10 * i,
        "sm_clock_mhz": 1980.0, "ecc_uncorrectable": 0, "remapped_uncorrectable": 0,
        "status": "ok",
    }  # fmt: skip


def _records(job: str, ts: float, gpus: int, phase: str, k: int) -> list[tuple[str, Any]]:
    run_id = f"{job}-{phase}"
    out: list[tuple[str, Any]] = [("check_runs", {
        "run_id": run_id, "ts": ts, "node": NODE, "job_id": job, "phase": phase,
        "gpus": list(range(gpus)), "status": "ok", "exit_code": 0, "duration_s": 0.4,
        "backend": "nvml"})]  # fmt: skip
    if k % 10 == 0:  # a warning now and then, and an event
        out.append(
            (
                "findings",
                {
                    "run_id": run_id,
                    "ts": ts,
                    "node": NODE,
                    "job_id": job,
                    "check_name": "pcie_link",
                    "severity": "warn",
                    "severity_value": 20,
                    "gpu": k % gpus,
                    "message": "PCIe link gen 4 below max 5",
                    "action": "warn",
                    "evidence": {},
                },
            )
        )
        out.append(
            (
                "events",
                {
                    "ts": ts,
                    "node": NODE,
                    "job_id": job,
                    "gpu": k % gpus,
                    "kind": "throttle",
                    "severity": "warn",
                    "message": "HW thermal slowdown",
                    "evidence": {"reasons": 64},
                },
            )
        )
    return out  # fmt: skip


def jobs(rng: random.Random, days: float, busy: float) -> Iterator[tuple[float, float, int]]:
    """(start, duration, GPUs) of each job until ``days`` minus the final 30-day job."""
    t, end = T0, T0 + max(0.0, days - 30) * DAY
    while True:
        r, acc = rng.random(), 0.0
        lo, hi = DURATIONS[-1][1:]
        for share, low, high in DURATIONS:
            acc += share
            if r <= acc:
                lo, hi = low, high
                break
        duration = rng.uniform(lo, hi)
        gpus = rng.choices([g for g, _ in GPU_COUNTS], [w for _, w in GPU_COUNTS])[0]
        if t + duration > end:
            return
        yield t, duration, gpus
        t += duration + duration * (1 - busy) / busy  # idle between jobs


class Node:
    """The simulated node: its history, its retention, counters."""

    def __init__(self, path: Path, gpus: int, interval: float) -> None:
        from slurmhealth.config import Config
        from slurmhealth.history import History
        from slurmhealth.history.retention import policy

        self.history = History(path)
        self.policy = policy(Config())
        self.gpus, self.interval = gpus, interval
        self.samples = self.pruned = self.prune_runs = 0
        self.prune_s: list[float] = []
        self.next_prune = T0 + HOUR

    def prune(self, now: float) -> None:
        result = self.history.prune(self.policy, now=now)
        self.pruned += result.total
        self.prune_runs += 1
        self.prune_s.append(result.seconds)

    def run_job(self, rng: random.Random, k: int, start: float, duration: float, gpus: int) -> str:
        from slurmhealth.history import Batch

        job = str(1000 + k)
        gpus = min(gpus, self.gpus)
        task = k % 3 == 0
        row = {"job_id": job, "node": NODE, "user": "u", "uid": 1000, "nodes": NODE,
               "gpus": list(range(gpus)), "start_ts": start, "state": "running"}  # fmt: skip
        self.history.write(Batch(inserts=_records(job, start, gpus, "prolog", k),
                                 upserts=[("jobs", row, "job_id")]))  # fmt: skip
        steps = int(duration // self.interval)
        per_batch = int(HOUR // self.interval)
        for first in range(0, steps, per_batch):
            inserts: list[tuple[str, Any]] = []
            for i in range(first, min(steps, first + per_batch)):
                ts = start + i * self.interval
                inserts += [("samples", _sample(rng, job, g, ts, i)) for g in range(gpus)]
                if task:
                    metrics = {"kind": "task", "steps_total": i, "step_seconds": 0.5,
                               "samples_per_second": 512.0, "mfu_ratio": 0.4}  # fmt: skip
                    inserts.append(("samples", {"ts": ts, "node": NODE, "job_id": job,
                                                "gpu": None, "metrics": metrics}))  # fmt: skip
            self.history.write(Batch(inserts=inserts))
            self.samples += sum(1 for t, r in inserts if r.get("gpu") is not None)
            now = start + min(steps, first + per_batch) * self.interval
            while self.next_prune <= now:  # the health check's prune
                self.prune(self.next_prune)
                self.next_prune += HOUR
        end = start + duration
        done = {**row, "end_ts": end, "state": "completed", "exit_code": "0:0"}
        self.history.write(Batch(inserts=_records(job, end, gpus, "epilog", k),
                                 upserts=[("jobs", done, "job_id")]))  # fmt: skip
        self.prune(end)  # the epilog's
        return job


def db_bytes(path: Path) -> dict[str, int]:
    import sqlite3

    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages, free, size = (conn.execute(f"PRAGMA {p}").fetchone()[0]
                             for p in ("page_count", "freelist_count", "page_size"))  # fmt: skip
        tables = dict(conn.execute("select name, sum(pgsize) from dbstat group by name"))
    except sqlite3.OperationalError:  # no dbstat in this sqlite build
        tables = {}
    finally:
        conn.close()
    return {"file": path.stat().st_size, "used": (pages - free) * size, "free": free * size,
            **{f"table:{k}": int(v) for k, v in tables.items()}}  # fmt: skip


def summary_time(path: Path, job: str, runs: int = 5) -> tuple[float, int]:
    """Median seconds of the epilog's summary of ``job`` (its facts from the history)."""
    from slurmhealth.config import Config, PathsConfig
    from slurmhealth.evidence.summary import node_summary

    cfg = Config(paths=PathsConfig(db=str(path)))
    times, samples = [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        facts, _uid = node_summary(cfg, job, NODE, {})
        times.append(time.perf_counter() - t0)
        samples = sum(g.samples for g in facts.gpus)
    return statistics.median(times), samples


def report_time(runs: int) -> float:
    """Median wall time of ``slurmhealth report JOB --json`` for 3 nodes x 24 h (the
    report_latency benchmark's histories)."""
    import report_latency as rl

    with tempfile.TemporaryDirectory(prefix="slurmhealth-scale-report-") as tmp:
        cfg = rl.build_history(Path(tmp), 24.0)
        cmd = [sys.executable, "-m", "slurmhealth", "--config", str(cfg), "report", rl.JOB,
               "--json"]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        return statistics.median(rl._time(cmd, env, runs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=float, default=365.0)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--busy", type=float, default=0.85)
    ap.add_argument("--report-runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--keep", help="Write the history here (kept) instead of a temp dir.")
    args = ap.parse_args()
    rng = random.Random(14)
    with tempfile.TemporaryDirectory(prefix="slurmhealth-scale-") as tmp:
        path = Path(args.keep or tmp) / "history.db"
        node = Node(path, args.gpus, args.interval)
        t0 = time.perf_counter()
        last_end, n = T0, 0
        for n, (start, duration, gpus) in enumerate(jobs(rng, args.days, args.busy), 1):
            node.run_job(rng, n, start, duration, gpus)
            last_end = start + duration
        start = max(last_end, T0 + (args.days - 30) * DAY)  # k % 3 == 0: task metrics too
        long_job = node.run_job(rng, 3 * (n + 1), start, 30 * DAY, args.gpus)
        build_s = time.perf_counter() - t0
        node.history.close()
        size = db_bytes(path)
        summary_s, summary_samples = summary_time(path, long_job)
    report_s = report_time(args.report_runs) if args.report_runs else None
    out = {
        "days": args.days, "jobs": n + 1, "gpu_samples_written": node.samples,
        "rows_pruned": node.pruned, "prune_runs": node.prune_runs,
        "prune_s_median": statistics.median(node.prune_s), "prune_s_max": max(node.prune_s),
        "db_bytes": size, "gb_per_year": size["file"] / 1e9 * 365 / args.days,
        "summary_30d_8gpu_s": summary_s, "summary_30d_samples": summary_samples,
        "report_3x24h_s": report_s, "build_s": build_s,
    }  # fmt: skip
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{args.days:g} days, {n + 1} jobs, {node.samples:,} GPU samples written, "
          f"{node.pruned:,} rows pruned in {node.prune_runs} runs "
          f"(median {out['prune_s_median'] * 1e3:.1f} ms, max {out['prune_s_max']:.2f} s); "
          f"built in {build_s:.0f} s")  # fmt: skip
    print(f"history: {size['file'] / 1e6:.1f} MB file ({size['used'] / 1e6:.1f} MB used, "
          f"{size['free'] / 1e6:.1f} MB free pages)  target < 2 GB/year")  # fmt: skip
    for key, value in sorted(size.items()):
        if key.startswith("table:") and value > 1e6:
            print(f"  {key[6:]:<32} {value / 1e6:9.1f} MB")
    print(f"epilog summary, 30-day {args.gpus}-GPU job ({summary_samples:,} samples): "
          f"{summary_s:.3f} s  target < 1 s")  # fmt: skip
    if report_s is not None:
        print(f"report 3 nodes x 24 h (whole process, median): {report_s:.3f} s  target <= 1 s")


if __name__ == "__main__":
    main()
