"""A burst of real jobs on the local cluster: does slurmhealth hold under load?

Usage (root, after `scripts/cluster up`, healthy scenario):
    python benchmarks/load_jobs.py [--jobs 1000] [--at-once 16] [--sleep 1] [--json]

Submits --jobs jobs as two job arrays (a share of 8-GPU jobs, the rest 1-GPU), at most
--at-once running together across the three nodes (`--array=1-N%K` per array), waits for
all of them, then reports from the nodes' histories, the wrappers' log file and Slurm:
wall time, p50/p99 prolog duration (check_runs.duration_s: wrapper start to decision),
prolog timeouts and fail-opens, nodes drained (sinfo -R), jobs with no prolog or no epilog
row, sidecars still running and files left in the nodes' run dirs once every job is gone.
Target: 0 drained, 0 timeouts, 0 fail-opens, 0 missing rows, 0 orphans.
Not part of the test run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


@dataclass
class Task:
    job_id: str  # the raw job id the prolog sees (squeue %A)
    state: str = "PENDING"
    node: str = ""


@dataclass
class Report:
    jobs: int
    at_once: int
    wall_s: float = 0.0
    states: dict[str, int] = field(default_factory=dict)
    prolog_p50_s: float | None = None
    prolog_p99_s: float | None = None
    prolog_max_s: float | None = None
    prolog_timeouts: int = 0
    prolog_failopens: int = 0
    wrapper_failopens: int = 0
    drained: dict[str, str] = field(default_factory=dict)
    missing_prolog: list[str] = field(default_factory=list)
    missing_epilog: list[str] = field(default_factory=list)
    orphan_sidecars: list[str] = field(default_factory=list)
    orphan_files: list[str] = field(default_factory=list)
    max_load_1m: float = 0.0
    spooled: int = 0  # check runs found in the spool, not yet in the db


def _run(cmd: list[str], check: bool = True) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=60)
    if check and proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _submit(user: str, count: int, gpus: int, limit: int, sleep_s: float) -> str:
    out = _run(
        ["runuser", "-u", user, "--", "sbatch", "--parsable", f"--array=1-{count}%{limit}",
         f"--gres=gpu:{gpus}", "-o", "/dev/null", "-e", "/dev/null", "-J", f"load{gpus}g",
         "--wrap", f"sleep {sleep_s:g}"]
    )  # fmt: skip
    return out.strip().split(";")[0]


def _poll(arrays: list[str], tasks: dict[str, Task]) -> None:
    out = _run(["squeue", "-h", "-r", "-t", "all", "-j", ",".join(arrays), "-o", "%i|%A|%T|%N"])
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) != 4 or "[" in parts[0]:
            continue
        task_id, job_id, state, node = parts
        if state != "PENDING":
            tasks[task_id] = Task(job_id, state, node)
        else:
            tasks.setdefault(task_id, Task(job_id))


def _rows(db: Path, since: float) -> list[dict[str, Any]]:
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    conn.row_factory = sqlite3.Row
    try:
        query = "SELECT job_id, phase, status, duration_s FROM check_runs WHERE ts >= ?"
        return [dict(r) for r in conn.execute(query, (since - 1,))]
    finally:
        conn.close()


def _spooled(db: Path, since: float) -> list[dict[str, Any]]:
    """check_runs rows still in the spool (the db was busy beyond a prolog's budget): they
    are recorded, and the next write to the history ingests them."""
    rows = []
    for spool in db.parent.glob(f"{db.name}.spool.jsonl*"):
        for line in spool.read_text(errors="replace").splitlines():
            try:
                inserts = json.loads(line).get("inserts", [])
            except (ValueError, AttributeError):
                continue
            for table, row in inserts:
                if table == "check_runs" and float(row.get("ts") or 0) >= since - 1:
                    rows.append(
                        {k: row.get(k) for k in ("job_id", "phase", "status", "duration_s")}
                    )
    return rows


def _percentile(values: list[float], pct: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def _sidecars() -> list[str]:
    out = _run(["ps", "-eo", "pid=,args="], check=False)
    return [line.strip() for line in out.splitlines() if re.search(r"slurmhealth\S* sidecar", line)]


def _wait_settled(state_dir: Path, timeout: float) -> None:
    """Epilogs are done when the jobs are; sidecars get a few seconds to exit."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _sidecars():
        time.sleep(1.0)


def measure(args: argparse.Namespace) -> Report:
    state_dir = Path(args.state_dir)
    log_path = state_dir / "log" / "slurmhealth.log"
    log_offset = log_path.stat().st_size if log_path.exists() else 0
    n8 = round(args.jobs * args.share_8gpu)
    n1 = args.jobs - n8
    limit8 = max(1, round(args.at_once * args.share_8gpu)) if n8 else 0
    limit1 = args.at_once - limit8
    report = Report(jobs=args.jobs, at_once=args.at_once)
    t0 = time.time()
    arrays = [_submit(args.user, n1, 1, limit1, args.sleep)] if n1 else []
    if n8:
        arrays.append(_submit(args.user, n8, 8, limit8, args.sleep))
    tasks: dict[str, Task] = {}
    deadline = time.monotonic() + args.timeout
    while True:
        _poll(arrays, tasks)
        report.max_load_1m = max(report.max_load_1m, os.getloadavg()[0])
        done = sum(t.state in TERMINAL for t in tasks.values())
        if done >= args.jobs:
            break
        if time.monotonic() > deadline:
            print(f"timeout: {done} of {args.jobs} jobs finished", file=sys.stderr)
            break
        time.sleep(args.poll)
    report.wall_s = time.time() - t0
    _wait_settled(state_dir, 30)
    for t in tasks.values():
        report.states[t.state] = report.states.get(t.state, 0) + 1
    rows = []
    for node_dir in sorted((state_dir / "nodes").glob("*")):
        rows += _rows(node_dir / "history.db", t0) + _spooled(node_dir / "history.db", t0)
    report.spooled = sum(
        1
        for node_dir in (state_dir / "nodes").glob("*")
        for _ in _spooled(node_dir / "history.db", t0)
    )
    prologs = [r for r in rows if r["phase"] == "prolog"]
    durations = [float(r["duration_s"]) for r in prologs if r["duration_s"] is not None]
    report.prolog_p50_s = _percentile(durations, 50)
    report.prolog_p99_s = _percentile(durations, 99)
    report.prolog_max_s = max(durations, default=None)
    report.prolog_failopens = sum(r["status"] == "failopen" for r in prologs)
    with_prolog = {r["job_id"] for r in prologs}
    with_epilog = {r["job_id"] for r in rows if r["phase"] == "epilog"}
    ran = sorted({t.job_id for t in tasks.values() if t.state in TERMINAL}, key=int)
    report.missing_prolog = [j for j in ran if j not in with_prolog]
    report.missing_epilog = [j for j in ran if j not in with_epilog]
    log_text = ""
    if log_path.exists():
        with log_path.open("rb") as fh:
            fh.seek(log_offset)
            log_text = fh.read().decode(errors="replace")
    report.prolog_timeouts = len(re.findall(r"slurmhealth-prolog\[.*timed out after", log_text))
    report.wrapper_failopens = len(re.findall(r"slurmhealth-prolog\[.*failing open", log_text))
    for line in _run(["sinfo", "-R", "-h", "-N", "-o", "%N|%E"]).splitlines():
        node, _, reason = line.partition("|")
        report.drained[node.strip()] = reason.strip()
    report.orphan_sidecars = _sidecars()
    for run_dir in sorted((state_dir / "nodes").glob("*/run")):
        # the node's shared snapshot and its lock stay by design (hooks/snapshot_cache.py)
        for path in sorted(run_dir.rglob("*")):
            kept = path.parent == run_dir and path.name in ("snapshot.json", "snapshot.lock")
            # a finished job's published stats, served for final_linger_s (300 s) by design
            kept |= (
                path.parent.name == "export"
                and path.name.startswith("done-")
                and (time.time() - path.stat().st_mtime < 300 + 60)
            )
            if path.is_file() and not kept:
                report.orphan_files.append(str(path))
    return report


def _print(report: Report) -> None:
    def s(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f} s"

    print(f"jobs: {report.jobs} (at most {report.at_once} at once)  states: {report.states}")
    print(f"wall time: {report.wall_s:.1f} s  max 1-min load average: {report.max_load_1m:.1f}")
    print(f"prolog duration p50 {s(report.prolog_p50_s)}  p99 {s(report.prolog_p99_s)}  "
          f"max {s(report.prolog_max_s)}")  # fmt: skip
    print(f"prolog timeouts (wrapper): {report.prolog_timeouts}  fail-opens: history "
          f"{report.prolog_failopens}, wrapper {report.wrapper_failopens}")  # fmt: skip
    print(f"check runs still in the spool (db busy beyond a budget): {report.spooled}")
    print(f"nodes drained: {len(report.drained)} {report.drained or ''}")
    print(f"jobs without a prolog row: {len(report.missing_prolog)} {report.missing_prolog[:10]}")
    print(f"jobs without an epilog row: {len(report.missing_epilog)} {report.missing_epilog[:10]}")
    print(f"orphan sidecars: {len(report.orphan_sidecars)}  files left in run dirs: "
          f"{len(report.orphan_files)} {report.orphan_files[:10]}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--at-once", type=int, default=16)
    ap.add_argument("--share-8gpu", type=float, default=0.25, help="share of 8-GPU jobs")
    ap.add_argument("--sleep", type=float, default=1.0, help="each job's run time (s)")
    ap.add_argument("--user", default="shuser")
    ap.add_argument("--state-dir", default="/var/tmp/slurmhealth-cluster")
    ap.add_argument("--poll", type=float, default=2.0)
    ap.add_argument("--timeout", type=float, default=7200.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (it submits as --user and reads the nodes' histories)")
    if not 0 < args.share_8gpu < 1 or args.jobs < 1 or args.at_once < 2:
        raise SystemExit("--jobs >= 1, --at-once >= 2, 0 < --share-8gpu < 1")
    report = measure(args)
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        _print(report)


if __name__ == "__main__":
    main()
