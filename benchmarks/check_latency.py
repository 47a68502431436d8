"""Whole-process wall time of `slurmhealth check` on the healthy 8-GPU simulated node.

Usage: python benchmarks/check_latency.py [--runs 30] [--rdma ndr8]
--rdma PRESET gives the node a generated RDMA sysfs tree (slurmhealth.rdma.simtree) and an
[rdma] section expecting it, so the network checks run too. Prints the median (and p10/p90)
of --runs timed runs after a warm-up, for the table and the --json output, then the slowest
imports from `python -X importtime`. Target: median <= 0.25 s on a 2-core machine. Not part
of the test run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _env(tmp: str, rdma: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURMHEALTH_")}
    cfg = Path(tmp, "config.toml")
    cfg.write_text(_rdma_config(tmp, rdma) if rdma else "")
    env.update(
        SLURMHEALTH_CONFIG=str(cfg),
        SLURMHEALTH_GPU_BACKEND="sim",
        SLURMHEALTH_SIM_SCENARIO=str(REPO / "scenarios" / "healthy.toml"),
        SLURMHEALTH_SIM_KERNEL_LOG=str(Path(tmp, "kmsg")),
        SLURMHEALTH_DB=str(Path(tmp, "history.db")),
    )
    return env


def _rdma_config(tmp: str, preset: str) -> str:
    """A generated tree of ``preset`` under ``tmp`` and the [rdma] section that checks it."""
    from slurmhealth.rdma import simtree

    root = Path(tmp, "sys")
    spec = simtree.preset(preset)
    simtree.write_tree(str(root), spec)
    layer = "Ethernet" if preset.startswith("roce") else "InfiniBand"
    return (f'[rdma]\nsysfs_root = "{root}"\nexpected_hcas = {len(spec.hcas)}\n'
            f'expected_rate_gbps = 400\nlink_layer = "{layer}"\n')  # fmt: skip


def _time(cmd: list[str], env: dict[str, str], runs: int) -> list[float]:
    subprocess.run(cmd, env=env, capture_output=True, check=False)  # warm-up (and migrations)
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, check=False)
        out.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.decode()}")
    return out


def _slowest_imports(env: dict[str, str], n: int) -> list[tuple[int, str]]:
    code = "import sys; from slurmhealth.cli import main; sys.argv=['slurmhealth','check']; main()"
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], env=env, capture_output=True, text=True
    )
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cum_us, name = line.split("|", 2)
        rows.append((int(cum_us), name[1:]))  # nested imports keep their leading spaces
    top = [(us, name) for us, name in rows if not name.startswith(" ")]
    return sorted(top, reverse=True)[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--imports", type=int, default=8)
    ap.add_argument("--rdma", default="", help="an RDMA preset (ndr4, ndr8, roce8): network on")
    args = ap.parse_args()
    exe = str(Path(sys.executable).with_name("slurmhealth"))
    # measure what a deployed install runs: byte-compiled modules (pip compiles on install)
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(REPO / "slurmhealth")], check=True
    )
    with tempfile.TemporaryDirectory() as tmp:
        env = _env(tmp, args.rdma)
        for label, cmd in (("table", [exe, "check"]), ("json", [exe, "check", "--json"])):
            times = _time(cmd, env, args.runs)
            q = statistics.quantiles(times, n=10)
            print(
                f"slurmhealth check ({label}): median {statistics.median(times):.3f} s, "
                f"p10 {q[0]:.3f} s, p90 {q[-1]:.3f} s over {args.runs} runs"
            )
        base = _time([sys.executable, "-c", "pass"], env, 10)
        print(f"python -c pass: median {statistics.median(base):.3f} s (interpreter floor)")
        print("slowest top-level imports (cumulative):")
        for us, name in _slowest_imports(env, args.imports):
            print(f"  {us / 1000:7.1f} ms  {name}")


if __name__ == "__main__":
    main()
