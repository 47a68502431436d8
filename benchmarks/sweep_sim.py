"""The pairwise sweep at scale, simulated: jobs, rounds, a wall-time estimate, and how well
the verdict names a single bad node or link under noise.

Usage: python benchmarks/sweep_sim.py [--sizes 64,256,1024] [--trials 40] [--noise 0.03]
       [--glitch 0.01] [--severity 0.6] [--job-s 60] [--sched-s 5] [--max-jobs 64] [--json]

Each trial runs the sweep's own loop (``sweep.plan.drive``: base rounds, judge, follow-ups)
with the real verdict, on ``tests.support.sweep_fabric.Fabric``: 480 GB/s alone and 370 GB/s
across two nodes (the recorded H100 nccl-tests outputs), healthy nodes spread 1 %, every
test +-``noise`` (sd) and with probability ``glitch`` a transient dip to 50-80 % (another
job's traffic). Faults: one node whose pairs all run at ``severity``; one link (a pair the
plan tests) at ``severity``; none. Precision: suspects that name the fault (right kind,
right nodes) over all suspects; recall: trials whose fault was named. A random link among
all N(N-1)/2 pairs is only seen when the plan tests that pair: "link coverage" says how
often that is.

Wall time: each round's jobs run together, ``max_jobs`` at a time, each wave taking
``job_s`` (the test) plus ``sched_s`` (submission, prolog, epilog, scheduling).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support

from slurmhealth.sweep import plan
from slurmhealth.sweep.model import Planned, Result
from slurmhealth.sweep.verdict import Verdict, judge
from tests.support.sweep_fabric import Fabric


def _trial(n: int, fault: str, args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    nodes = [f"gpu{i:04d}" for i in range(1, n + 1)]
    fabric = Fabric(nodes, rng=rng, noise=args.noise, glitch=args.glitch)
    base = plan.base_plan(nodes, ["nccl"])
    tested = [t.nodes for r in base[1:] for t in r]
    target: tuple[str, ...] = ()
    if fault == "node":
        target = (rng.choice(nodes),)
        fabric.node_fault[target[0]] = args.severity
    elif fault == "link":
        target = rng.choice(tested)
        fabric.link_fault[target] = args.severity
    rounds: list[int] = []

    def measure(batch: list[Planned]) -> list[Result]:
        rounds.append(len(batch))
        return fabric.measure(batch)

    t0 = time.perf_counter()
    driven = plan.drive(nodes, ["nccl"], None, measure, lambda rs: judge(rs))
    judged_s = time.perf_counter() - t0
    return {"verdict": driven.verdict, "target": target, "jobs": driven.jobs,
            "rounds": driven.rounds, "wall_s": _wall(rounds, args), "cpu_s": judged_s}  # fmt: skip


def _wall(rounds: list[int], args: argparse.Namespace) -> float:
    return sum(math.ceil(k / args.max_jobs) * (args.job_s + args.sched_s) for k in rounds)


def _score(fault: str, target: tuple[str, ...], v: Verdict) -> tuple[int, int, int]:
    """(suspects naming the fault, other suspects, 1 when the fault was named)."""
    right = [s for s in v.suspects if s.kind == fault and s.nodes == target]
    return len(right), len(v.suspects) - len(right), 1 if right else 0


def run_size(n: int, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed + n)
    out: dict[str, Any] = {"nodes": n, "all_pairs": n * (n - 1) // 2}
    for fault in ("none", "node", "link"):
        tp = fp = found = 0
        jobs, rounds, walls, cpu = [], [], [], []
        for _ in range(args.trials):
            t = _trial(n, fault, args, rng)
            a, b, c = _score(fault, t["target"], t["verdict"])
            tp, fp, found = tp + a, fp + b, found + c
            jobs.append(t["jobs"])
            rounds.append(t["rounds"])
            walls.append(t["wall_s"])
            cpu.append(t["cpu_s"])
        out[fault] = {
            "jobs_median": statistics.median(jobs), "rounds_median": statistics.median(rounds),
            "wall_min_median": round(statistics.median(walls) / 60, 1),
            "precision": None if fault == "none" or tp + fp == 0 else round(tp / (tp + fp), 3),
            "recall": None if fault == "none" else round(found / args.trials, 3),
            "false_suspects_per_sweep": round(fp / args.trials, 3),
            "verdict_cpu_s_median": round(statistics.median(cpu), 3),
        }  # fmt: skip
    base_pairs = sum(len(r) for r in plan.base_plan([str(i) for i in range(n)], ["nccl"])[1:])
    out["link_coverage"] = round(base_pairs / out["all_pairs"], 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="64,256,1024")
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--noise", type=float, default=0.03)
    ap.add_argument("--glitch", type=float, default=0.01)
    ap.add_argument("--severity", type=float, default=0.6)
    ap.add_argument("--job-s", type=float, default=60.0)
    ap.add_argument("--sched-s", type=float, default=5.0)
    ap.add_argument("--max-jobs", type=int, default=64)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    results = [run_size(int(s), args) for s in args.sizes.split(",")]
    if args.json:
        print(json.dumps({"settings": vars(args), "sizes": results}, indent=2))
        return
    print(f"noise sd {args.noise:.0%}, glitch {args.glitch:.0%}, fault at {args.severity:.0%}, "
          f"{args.trials} trials per cell, job {args.job_s:g} s + {args.sched_s:g} s, "
          f"max {args.max_jobs} jobs at once")  # fmt: skip
    print(f"{'nodes':>6} {'fault':>5} {'jobs':>6} {'all pairs':>9} {'rounds':>6} {'wall min':>8} "
          f"{'precision':>9} {'recall':>6} {'false/sweep':>11} {'verdict s':>9}")  # fmt: skip
    for r in results:
        for fault in ("none", "node", "link"):
            c = r[fault]
            print(f"{r['nodes']:>6} {fault:>5} {c['jobs_median']:>6} {r['all_pairs']:>9} "
                  f"{c['rounds_median']:>6} {c['wall_min_median']:>8} "
                  f"{_f(c['precision']):>9} {_f(c['recall']):>6} "
                  f"{c['false_suspects_per_sweep']:>11} "
                  f"{c['verdict_cpu_s_median']:>9}")  # fmt: skip
        print(f"{'':>6} link coverage of a random pair: {r['link_coverage']:.2%}")


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


if __name__ == "__main__":
    main()
