"""The hooks as whole processes on one simulated node, no Slurm needed: what the node pays
per job start and end, side by side with LBNL NHC and with an older slurmhealth.

Usage (root): .venv/bin/python benchmarks/hook_processes.py --nhc DIR [--baseline DIR]

Every sample runs the wrappers slurmd runs (slurmhealth-prolog, slurmhealth-epilog) with a
Slurm 23.02+ environment (account and comment set: no Slurm call) on the healthy 8-GPU
scenario, with the sidecar on, in a private state dir. Interleaved, per round:

- the prolog with the node agent (``slurmhealth exporter --port 0`` running), without it
  (``SLURMHEALTH_AGENT=off``), and NHC (``DIR/nhc`` with benchmarks/nhc-4checks.conf);
- the epilog of a job that ends 0.3 s after its prolog (its sidecar still starting: the
  case that cost 0.9 s in stop_sidecar) with the agent, without it, and, with
  ``--baseline DIR`` (an older checkout, e.g. ``git archive d3535e1 | tar -x -C DIR``),
  that release's prolog (in-process) and epilog: the epilog is the node's turnaround
  between two jobs.

Then 16 prologs at once through the agent (fail-opens, NVML reads) and the agent's RSS and
idle CPU. Prints medians and ratios. Not part of the test run.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NHC_CONF = REPO / "benchmarks" / "nhc-4checks.conf"
JOB0 = 980_000_000 + os.getpid() % 10_000 * 1000


class Node:
    """A private state dir with its config and env file, for one code tree."""

    def __init__(self, base: Path, tree: Path, name: str) -> None:
        self.dir = base / name
        self.dir.mkdir(mode=0o700)
        self.tree = tree
        (self.dir / "run").mkdir(mode=0o755)
        self.config = self.dir / "config.toml"
        self.config.write_text(f"""
[node]
name = "n1"
[gpu]
backend = "sim"
sim_scenario = "{tree / "scenarios" / "healthy.toml"}"
sim_kernel_log = "{self.dir / "kmsg"}"
[paths]
db = "{self.dir / "history.db"}"
run_dir = "{self.dir / "run"}"
evidence_dir = "{self.dir / "evidence"}"
[sidecar]
interval_s = 1.0
{"[report]" + chr(10) + "admin_comment = false" if tree == REPO else ""}
[metrics]
port = 0
fail_open_log = "{self.dir / "fail-open.log"}"
""")
        bin_path = self.dir / "slurmhealth"
        bin_path.write_text(
            f"#!/bin/sh\ncd /\nPYTHONPATH={tree}\nexport PYTHONPATH\n"  # (-m: the cwd first)
            f'exec {sys.executable} -m slurmhealth "$@"\n'
        )
        bin_path.chmod(0o755)
        self.env_file = self.dir / "env"
        fail_open = self.dir / "fail-open.log"
        self.env_file.write_text(f"SLURMHEALTH_CONFIG={self.config}\n"
                                 f"SLURMHEALTH_BIN={bin_path}\n"
                                 f"SLURMHEALTH_FAIL_OPEN_LOG={fail_open}\n")  # fmt: skip
        self.agent: subprocess.Popen[bytes] | None = None

    def env(self, job: int, gpus: str, agent: bool = True) -> dict[str, str]:
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "PYTHON"))}
        return {**keep, "SLURMHEALTH_ENV_FILE": str(self.env_file), "SLURM_JOB_ID": str(job),
                "SLURMD_NODENAME": "n1", "SLURM_JOB_USER": "root", "SLURM_JOB_UID": "0",
                "SLURM_JOB_GPUS": gpus, "SLURM_JOB_ACCOUNT": "bench", "SLURM_JOB_COMMENT": "",
                "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_EXIT_CODE2": "0:0",
                "SLURMHEALTH_AGENT": "" if agent else "off"}  # fmt: skip

    def hook(self, hook: str, env: dict[str, str]) -> float:
        wrapper = self.tree / "slurmhealth" / "wrappers" / f"slurmhealth-{hook}"
        t0 = time.perf_counter()
        proc = subprocess.run([str(wrapper)], env=env, capture_output=True, text=True)
        took = time.perf_counter() - t0
        if proc.returncode != 0 or "failing open" in proc.stderr:
            raise SystemExit(f"{hook} of {env['SLURM_JOB_ID']}: {proc.returncode} {proc.stderr}")
        return took

    def start_agent(self) -> None:
        env = {**self.env(0, ""), "SLURMHEALTH_CONFIG": str(self.config),
               "SLURMHEALTH_NODE_NAME": "n1"}  # fmt: skip
        with open(self.dir / "agent.log", "ab") as log:
            self.agent = subprocess.Popen(
                [str(self.dir / "slurmhealth"), "exporter", "--port", "0"],
                env=env, stdout=log, stderr=log)  # fmt: skip
        os.setpriority(os.PRIO_PROCESS, self.agent.pid, -5)  # as its systemd unit's Nice=-5
        deadline = time.monotonic() + 30
        while not (self.dir / "run" / "agent.sock").exists():
            if time.monotonic() > deadline:
                raise SystemExit("the agent did not start")
            time.sleep(0.05)

    def stop_agent(self) -> None:
        if self.agent is not None:
            self.agent.terminate()
            self.agent.wait(30)
            self.agent = None

    def settle(self) -> None:
        """No after-work pending and no sidecar left (the last epilog's)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pending = list((self.dir / "run" / "pending").glob("*.json"))
            sidecars = _run_text(["pgrep", "-f", f"sidecar --job {JOB0 // 1000}"])
            if not pending and not sidecars.strip():
                return
            time.sleep(0.05)

    def agent_reads(self) -> int:
        sys.path.insert(0, str(REPO))
        from slurmhealth.agent import protocol

        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(self.dir / "run" / "agent.sock"))
            protocol.send(sock, {"op": "ping"})
            reader = protocol.LineReader(sock)
            reader.read(time.monotonic() + 10)
            return int(reader.read(time.monotonic() + 10)["snapshots"])


def _run_text(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=False).stdout


def _nhc(nhc: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([str(nhc / "nhc"), "-D", str(nhc), "-c", str(NHC_CONF), "-l", "-",
                           "NHC_RM=slurm", "MARK_OFFLINE=0"], capture_output=True)  # fmt: skip
    if proc.returncode != 0:
        raise SystemExit(f"nhc exited {proc.returncode}: check {NHC_CONF} on this machine")
    return time.perf_counter() - t0


def _burst(node: Node, n: int = 16) -> str:
    before = node.agent_reads()
    log_at = len((node.dir / "agent.log").read_text(errors="replace"))
    procs = [subprocess.Popen([str(node.tree / "slurmhealth/wrappers/slurmhealth-prolog")],
                              env=node.env(JOB0 + 900 + k, str(k % 8)), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for k in range(n)]  # fmt: skip
    results = [(p.wait(60), p.stderr.read() if p.stderr else "") for p in procs]
    reads = node.agent_reads() - before
    log = (node.dir / "agent.log").read_text(errors="replace")
    shared = sorted(set(re.findall(r"judged on NVML snapshot #(\d+)", log[log_at:])), key=int)
    for k in range(n):
        node.hook("epilog", node.env(JOB0 + 900 + k, str(k % 8)))
    node.settle()
    fail_opens = (node.dir / "fail-open.log").read_text().count("\n") if (
        node.dir / "fail-open.log").exists() else 0  # fmt: skip
    return (f"{n} prologs at once through the agent: exit codes "
            f"{sorted({rc for rc, _ in results})}, {fail_opens} fail-opens, "
            f"{sum('failing open' in e for _, e in results)} failing-open lines, "
            f"{sum('node agent not used' in e for _, e in results)} fell back; NVML reads "
            f"{reads} (agent log: snapshots #{', #'.join(shared)})")  # fmt: skip


def _proc_stat(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    rss = int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1))  # type: ignore[union-attr]
    return cpu, rss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nhc", type=Path, required=True, help="an LBNL NHC checkout")
    ap.add_argument("--baseline", type=Path, help="an older slurmhealth tree, for the epilog")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--short-job-s", type=float, default=0.3)
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="slurmhealth-bench-", dir="/var/tmp"))
    new = Node(base, REPO, "new")
    old = Node(base, args.baseline, "old") if args.baseline else None
    t: dict[str, list[float]] = {}
    try:
        new.start_agent()
        for i in range(args.rounds):
            for label, agent in (("agent", True), ("no agent", False)):
                env = new.env(JOB0 + 2 * i + agent, str(i % 8), agent)
                t.setdefault(f"prolog, {label}", []).append(new.hook("prolog", env))
                time.sleep(args.short_job_s)
                t.setdefault(f"epilog, {label}", []).append(new.hook("epilog", env))
                new.settle()
            t.setdefault("nhc", []).append(_nhc(args.nhc))
            if old is not None:
                env = old.env(JOB0 + 500 + i, str(i % 8), False)
                took = old.hook("prolog", env)
                t.setdefault("prolog, no agent, before this change", []).append(took)
                time.sleep(args.short_job_s)
                t.setdefault("epilog, before this change", []).append(old.hook("epilog", env))
                old.settle()
        assert new.agent is not None
        cpu0, t0 = _proc_stat(new.agent.pid)[0], time.monotonic()
        time.sleep(30)
        cpu1, rss = _proc_stat(new.agent.pid)
        idle = (cpu1 - cpu0) / (time.monotonic() - t0) * 60
        burst = _burst(new)
    finally:
        new.stop_agent()
    nhc = statistics.median(t["nhc"])
    print(f"whole processes on one node, medians of {args.rounds} interleaved rounds:")
    for name, xs in t.items():
        m = statistics.median(xs)
        print(f"  {name:28s} {m:.3f} s" + (f"  = {m / nhc:.2f}x NHC" if "prolog" in name else ""))
    print(f"agent: RSS {rss:.0f} MiB, idle CPU {idle:.2f} s per minute")
    print(burst)


if __name__ == "__main__":
    main()
