"""What a job's sidecar costs the node: CPU per sampling interval, memory, scrape latency.

Usage: python benchmarks/sidecar_overhead.py [--seconds 30] [--interval 1]
Runs the real `slurmhealth sidecar` process for a job on the healthy 8x H100 simulated node
(no Slurm needed), then reads its CPU time and RSS from /proc and times what the node's
exporter does per scrape (read the job's state file, render the node's exposition).
Reported: CPU % of one core (the simulator answers NVML calls in Python, so a real GPU node
spends less in the library and more in the driver), ms of CPU per sample of 8 GPUs, RSS, and
the median scrape time and size. Not part of the test run.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurmhealth.agent.exporter import ConfigWatch, registry_for
from slurmhealth.config import load_config
from slurmhealth.metrics.exposition import render

REPO = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp, "config.toml")
        cfg.write_text(
            f"""
[gpu]
backend = "sim"
sim_scenario = "{REPO}/scenarios/healthy.toml"
sim_kernel_log = "{tmp}/kmsg"
[paths]
db = "{tmp}/history.db"
run_dir = "{tmp}/run"
[sidecar]
interval_s = {args.interval}
job_check_interval_s = 100000
"""
        )
        env = {**os.environ, "SLURMHEALTH_CONFIG": str(cfg), "SLURMD_NODENAME": "bench"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "slurmhealth", "sidecar", "--job", "4242", "--gpus", "0-7"],
            env=env,
            stderr=subprocess.DEVNULL,
        )
        state_file = Path(tmp, "run", "export", "job-4242.json")
        deadline = time.monotonic() + 20
        while not state_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2 * args.interval)  # past start-up and the first samples
        cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
        time.sleep(args.seconds)
        cpu1, t1 = _cpu_seconds(proc.pid), time.monotonic()
        rss = _rss_mib(proc.pid)
        scrapes, size = [], 0
        watch = ConfigWatch(lambda: load_config(str(cfg), env=env))
        registry = registry_for(watch.current)
        for _ in range(50):  # what the node's exporter does per scrape
            s0 = time.perf_counter()
            body = render(registry)
            scrapes.append(time.perf_counter() - s0)
            size = len(body)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
    cpu_share = (cpu1 - cpu0) / (t1 - t0)
    per_sample_ms = (cpu1 - cpu0) / ((t1 - t0) / args.interval) * 1000
    print(f"sidecar, 8 simulated GPUs, interval {args.interval:g} s, {args.seconds:g} s measured:")
    print(f"  CPU {cpu_share * 100:.1f}% of one core, {per_sample_ms:.1f} ms CPU per interval")
    print(f"  RSS {rss:.0f} MiB")
    print(f"  exporter scrape median {statistics.median(scrapes) * 1000:.1f} ms, {size} bytes")


if __name__ == "__main__":
    main()
