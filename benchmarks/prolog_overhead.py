"""Job start latency on the local cluster with and without the slurmhealth prolog/epilog.

Usage (root, after `scripts/cluster up`): python benchmarks/prolog_overhead.py [--jobs 15]

Times `srun -N1 --gres=gpu:1 true` end to end (submit, allocate, prolog, launch, epilog)
for --jobs jobs in each configuration in one run: first with Prolog/Epilog as configured,
then with both lines removed from slurm.conf (`scontrol reconfigure`), then restores the
file. Prints medians, the difference and the ratio. Target: under +0.5 s per job.
Not part of the test run.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path

CONF = Path("/etc/slurm/slurm.conf")


def _reconfigure(text: str) -> None:
    CONF.write_text(text)
    subprocess.run(["scontrol", "reconfigure"], check=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, check=True
        ).stdout.split()
        if out and all(s == "idle" for s in out):
            return
        time.sleep(0.2)
    raise SystemExit("nodes did not come back idle after reconfigure")


def _time_jobs(n: int, node: str) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        proc = subprocess.run(
            ["srun", "-N1", "-w", node, "--gres=gpu:1", "true"],
            capture_output=True,
            text=True,
            check=False,
        )
        times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"srun failed: {proc.stderr.strip()}")
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=15)
    ap.add_argument("--node", default="n1")
    args = ap.parse_args()
    if shutil.which("srun") is None or not CONF.exists():
        raise SystemExit("no local cluster: run scripts/cluster up first")
    original = CONF.read_text()
    if not re.search(r"^Prolog=", original, re.M):
        raise SystemExit("slurm.conf has no Prolog= line: nothing to compare")
    bare = re.sub(r"^(Prolog|Epilog)=.*\n", "", original, flags=re.M)
    try:
        _time_jobs(2, args.node)  # warm-up: page cache, munge, first history migration
        with_hooks = _time_jobs(args.jobs, args.node)
        _reconfigure(bare)
        _time_jobs(2, args.node)
        without = _time_jobs(args.jobs, args.node)
    finally:
        _reconfigure(original)
    a, b = statistics.median(with_hooks), statistics.median(without)
    print(f"job start-to-end latency, median of {args.jobs} jobs on {args.node}:")
    print(f"  with slurmhealth prolog+epilog: {a:.3f} s (p90 {_p90(with_hooks):.3f} s)")
    print(f"  without:                        {b:.3f} s (p90 {_p90(without):.3f} s)")
    print(f"  difference {a - b:+.3f} s per job, ratio {a / b:.2f}x (target: < +0.5 s)")


def _p90(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=10)[-1] if len(xs) >= 2 else xs[0]


if __name__ == "__main__":
    main()
