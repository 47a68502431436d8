"""What slurmhealth's hooks cost a site, on the local cluster, side by side with a bare Slurm.

Usage (root; the cluster lock held around it, as every cluster user does):

    flock /run/lock/slurmhealth-cluster.lock \\
        .venv/bin/python benchmarks/prolog_overhead.py --nhc /var/tmp/slurmhealth-nhc

It first runs ``scripts/cluster up`` with ``SLURMHEALTH_CLUSTER_SCHED=default`` (Slurm's
default scheduler parameters: the recipe's ``sched_interval=2`` would hide part of a
turnaround) and starts one node agent (``slurmhealth exporter --port 0``) per node. Then,
in ``--rounds`` interleaved rounds of three configurations (bare: no Prolog/Epilog, and
no EpilogSlurmctld in any; hooks with the agent; hooks without it), it times:

- idle-node start: ``srun -w NODE --gres=gpu:1 true`` on an idle node, end to end;
- back to back: ``--jobs`` such sruns one after another, per job;
- node turnaround: from an srun's return (the job's end) to the node showing idle again.

Then the prolog as one whole process (the wrapper slurmd runs, for a job id Slurm does
not know, with the account and comment in its environment as Slurm 23.02+ passes them)
interleaved with LBNL NHC (mej/nhc, ``--nhc DIR``: a checkout, with the 4-check config
``benchmarks/nhc-4checks.conf``), with and without the agent; each prolog's job gets its
epilog (untimed) so its sidecar stops. Last, 16 prolog processes at once on one node
through the agent: fail-opens and NVML reads. Prints medians and ratios; restores the
cluster recipe (``scripts/cluster up``) at the end. Not part of the test run.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STATE = Path(os.environ.get("SLURMHEALTH_CLUSTER_DIR", "/var/tmp/slurmhealth-cluster"))
ENV_FILE = Path("/etc/default/slurmhealth")
NODES = ("n1", "n2", "n3")
NHC_CONF = REPO / "benchmarks" / "nhc-4checks.conf"
FAKE_JOB = 990_000_000 + os.getpid() % 10_000 * 1000


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload, no-any-return]


def _cluster_up(**env: str) -> None:
    proc = _run([str(REPO / "scripts" / "cluster"), "up"], env={**os.environ, **env})
    if proc.returncode != 0:
        raise SystemExit(f"scripts/cluster up failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def _state(node: str) -> str:
    """The node's state as slurmctld holds it (``idle``, ``idle+completing``, ...). Not
    sinfo's ``%T``: after a job whose epilog answered quickly, sinfo showed the node
    ``mixed`` (one CPU allocated) for 3-90 s while slurmctld had it IDLE with no CPU
    allocated and scheduled the next job onto it (seen on 22.05 here)."""
    out = _run(["scontrol", "show", "node", "-o", node]).stdout
    found = re.search(r"\bState=(\S+)", out)
    return found.group(1).lower() if found else ""


def _wait_idle(node: str, timeout: float = 240.0) -> float:
    """Seconds until ``node`` shows idle (polled every 50 ms: a faster sinfo loop floods
    slurmctld, and a node then stayed completing for a minute)."""
    t0 = time.perf_counter()
    while _state(node) != "idle":
        if time.perf_counter() - t0 > timeout:
            jobs = _run(["squeue", "-h", "-w", node, "-o", "%i %u %T"]).stdout.strip()
            raise SystemExit(f"{node} did not come back idle: {_state(node)}; jobs: {jobs}")
        time.sleep(0.05)
    return time.perf_counter() - t0


def _srun(node: str) -> float:
    t0 = time.perf_counter()
    proc = _run(["srun", "-N1", "-w", node, "--gres=gpu:1", "true"])
    if proc.returncode != 0:
        raise SystemExit(f"srun failed: {proc.stderr.strip()}")
    return time.perf_counter() - t0


def _hooks(on: bool) -> None:
    """Prolog/Epilog in slurm.conf or not, as the cluster recipe writes it (EpilogSlurmctld
    is in neither), at Slurm's default scheduler parameters."""
    env = {
        "SLURMHEALTH_CLUSTER_SCHED": "default",
        "SLURMHEALTH_CLUSTER_HOOKS": "" if on else "none",
    }
    if _run(["grep", "-q", "^Prolog=", "/etc/slurm/slurm.conf"]).returncode != (0 if on else 1):
        # a reconfigure that adds or drops Prolog/Epilog left the next job's node completing
        # until the next reconfigure (22.05, several slurmd on one host): restart the daemons
        _cluster_up(**env)
        _run([str(REPO / "scripts" / "cluster"), "down"])
    _cluster_up(**env)
    for node in NODES:
        _wait_idle(node)


def _env_file() -> dict[str, str]:
    env = {}
    for line in ENV_FILE.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith("#"):
            env[key.strip()] = value.strip()
    return env


class Agents:
    """One ``slurmhealth exporter --port 0`` (the node agent) per node."""

    def __init__(self) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.bin = _env_file()["SLURMHEALTH_BIN"]

    def start(self) -> None:
        for node in NODES:
            if node in self.procs:
                continue
            env = {**os.environ, **_env_file(), "SLURMHEALTH_NODE_NAME": node}
            log = open(STATE / "log" / f"agent.{node}.log", "ab")  # noqa: SIM115
            self.procs[node] = subprocess.Popen([self.bin, "exporter", "--port", "0"], env=env,
                                                stdout=log, stderr=log)  # fmt: skip
        for node in NODES:
            sock = STATE / "nodes" / node / "run" / "agent.sock"
            deadline = time.monotonic() + 30
            while not sock.exists():
                if time.monotonic() > deadline:
                    raise SystemExit(f"the agent of {node} did not start")
                time.sleep(0.05)

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            proc.wait(30)
        self.procs = {}

    def rss_mib(self) -> list[float]:
        out = []
        for proc in self.procs.values():
            status = Path(f"/proc/{proc.pid}/status").read_text()
            kb = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
            out.append(kb / 1024)
        return out

    def cpu_s(self) -> float:
        total = 0.0
        for proc in self.procs.values():
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total


@contextmanager
def _config(name: str, agents: Agents) -> Iterator[None]:
    _hooks(name != "bare")
    if name == "hooks+agent":
        agents.start()
    else:
        agents.stop()
    # the first job after Prolog/Epilog come or go through `scontrol reconfigure` left n1
    # completing for a minute (22.05 here): warm up until a job's end is quick again
    for _ in range(3):
        _srun(NODES[0])
        if _wait_idle(NODES[0], timeout=180.0) < 5.0:
            break
    yield


def _turnaround(node: str, samples: int) -> tuple[list[float], list[float]]:
    """``samples`` (idle-start latency, end-to-idle turnaround) pairs."""
    starts, turns = [], []
    for _ in range(samples):
        _wait_idle(node)
        time.sleep(0.5)
        starts.append(_srun(node))
        turns.append(_wait_idle(node))
    return starts, turns


def _back_to_back(node: str, jobs: int) -> float:
    _wait_idle(node)
    t0 = time.perf_counter()
    for _ in range(jobs):
        _srun(node)
    return (time.perf_counter() - t0) / jobs


def _hook_env(job: int, gpus: str, agent: bool) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM")},
            "SLURM_JOB_ID": str(job), "SLURMD_NODENAME": "n1", "SLURM_JOB_USER": "root",
            "SLURM_JOB_UID": "0", "SLURM_JOB_GPUS": gpus, "SLURM_JOB_ACCOUNT": "bench",
            "SLURM_JOB_COMMENT": "", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_EXIT_CODE2": "0:0",
            "SLURMHEALTH_AGENT": "" if agent else "off"}  # fmt: skip


def _wrapper(hook: str) -> str:
    return str(STATE / "install" / "usr" / "lib" / "slurmhealth" / f"slurmhealth-{hook}")


def _timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int]:
    t0 = time.perf_counter()
    proc = _run(argv, env=env)
    return time.perf_counter() - t0, proc.returncode


def _settle() -> None:
    """No after-work left on n1 (the previous epilog's)."""
    pending = STATE / "nodes" / "n1" / "run" / "pending"
    deadline = time.monotonic() + 60
    while any(pending.glob("*.json")) if pending.is_dir() else False:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)


def _processes(nhc: Path, samples: int, agents: Agents) -> dict[str, list[float]]:
    """The prolog (with, without the agent) and NHC as whole processes, interleaved."""
    agents.start()
    nhc_cmd = [str(nhc / "nhc"), "-D", str(nhc), "-c", str(NHC_CONF), "-l", "-",
               "NHC_RM=slurm", "MARK_OFFLINE=0"]  # fmt: skip
    out: dict[str, list[float]] = {"prolog, agent": [], "prolog, no agent": [], "nhc": []}
    for i in range(samples):
        for name, agent in (("prolog, agent", True), ("prolog, no agent", False)):
            env = _hook_env(FAKE_JOB + 2 * i + agent, str(i % 8), agent)
            took, rc = _timed([_wrapper("prolog")], env)
            if rc != 0:
                raise SystemExit(f"the prolog exited {rc}")
            out[name].append(took)
            _timed([_wrapper("epilog")], env)  # stops its sidecar
            _settle()
        took, rc = _timed(nhc_cmd)
        if rc != 0:
            raise SystemExit(f"nhc exited {rc}: check {NHC_CONF} on this machine")
        out["nhc"].append(took)
    return out


def _agent_reads(node: str) -> int:
    """The NVML reads the node's agent made so far (its ``ping``)."""
    import socket

    from slurmhealth.agent import protocol

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(STATE / "nodes" / node / "run" / "agent.sock"))
        protocol.send(sock, {"op": "ping"})
        reader = protocol.LineReader(sock)
        reader.read(time.monotonic() + 10)
        return int(reader.read(time.monotonic() + 10)["snapshots"])


def _burst(agents: Agents, n: int = 16) -> str:
    agents.start()
    from slurmhealth.agent.views import MAX_AGE_S  # a snapshot this recent is shared

    time.sleep(MAX_AGE_S + 0.5)  # a burst after a quiet spell: no recent snapshot left
    reads_before = _agent_reads("n1")
    fail_log = STATE / "nodes" / "n1" / "fail-open.log"
    before = fail_log.read_text().count("\n") if fail_log.exists() else 0
    agent_log = STATE / "log" / "agent.n1.log"
    log_before = agent_log.stat().st_size if agent_log.exists() else 0
    base = FAKE_JOB + 500
    procs = [subprocess.Popen([_wrapper("prolog")], env=_hook_env(base + k, str(k % 8), True),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for k in range(n)]  # fmt: skip
    results = [(p.wait(60), p.stderr.read() if p.stderr else "") for p in procs]
    reads = _agent_reads("n1") - reads_before  # the prologs' reads (the epilogs read afresh)
    with open(agent_log, "rb") as fh:
        fh.seek(log_before)
        text = fh.read().decode(errors="replace")
    jobs = "|".join(str(base + k) for k in range(n))
    shared = sorted(set(re.findall(rf"job (?:{jobs}) judged on NVML snapshot #(\d+)", text)))
    for k in range(n):
        _run([_wrapper("epilog")], env=_hook_env(base + k, str(k % 8), True))
    _settle()
    after = fail_log.read_text().count("\n") if fail_log.exists() else 0
    fell_back = sum("node agent not used" in err for _, err in results)
    return (f"{n} prologs at once on n1: exit codes {sorted({rc for rc, _ in results})}, "
            f"{after - before} fail-opens, {fell_back} fell back, NVML reads for them by the "
            f"agent {reads} (agent log: the {n} judged on snapshot(s) "
            f"#{', #'.join(shared)})")  # fmt: skip


def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10, help="back-to-back jobs per round")
    ap.add_argument("--idle", type=int, default=4, help="idle-start samples per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--processes", type=int, default=15, help="prolog/NHC process samples")
    ap.add_argument("--nhc", type=Path, help="an LBNL NHC checkout (its nhc and scripts/)")
    ap.add_argument("--node", default="n1")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root (it rewrites slurm.conf), under the cluster lock")
    _cluster_up(SLURMHEALTH_CLUSTER_SCHED="default")
    agents = Agents()
    figures: dict[str, dict[str, list[float]]] = {}
    names = ("bare", "hooks+agent", "hooks, no agent")
    try:
        for _ in range(args.rounds):
            for name in names:
                with _config(name, agents):
                    f = figures.setdefault(name, {"idle": [], "b2b": [], "turn": []})
                    starts, turns = _turnaround(args.node, args.idle)
                    f["idle"] += starts
                    f["turn"] += turns
                    f["b2b"].append(_back_to_back(args.node, args.jobs))
        _hooks(True)
        agents.start()
        cpu0, t0 = agents.cpu_s(), time.monotonic()
        time.sleep(20)
        idle_cpu = (agents.cpu_s() - cpu0) / (time.monotonic() - t0) * 60 / len(NODES)
        rss = agents.rss_mib()
        procs = _processes(args.nhc, args.processes, agents) if args.nhc else {}
        burst = _burst(agents)
    finally:
        agents.stop()
        _cluster_up()  # the recipe as the tests want it (sched_interval=2)
    _report(figures, procs, burst, idle_cpu, rss, args)


def _report(
    figures: dict[str, dict[str, list[float]]],
    procs: dict[str, list[float]],
    burst: str,
    idle_cpu: float,
    rss: list[float],
    args: argparse.Namespace,
) -> None:
    bare = figures["bare"]
    print(f"Slurm default scheduler parameters, node {args.node}, {args.rounds} interleaved "
          f"rounds; medians (bare | hooks+agent | hooks, no agent)")  # fmt: skip
    for key, what in (("idle", "idle-node start"), ("b2b", "back-to-back, per job"),
                      ("turn", "node turnaround (job end to idle)")):  # fmt: skip
        row = [_med(figures[n][key]) for n in figures]
        diffs = "  ".join(f"{r - _med(bare[key]):+.3f} s" for r in row[1:])
        print(f"  {what:36s} " + " | ".join(f"{r:.3f} s" for r in row) + f"   ({diffs})")
    print(f"agent: RSS {', '.join(f'{r:.0f}' for r in rss)} MiB; idle CPU "
          f"{idle_cpu:.2f} s per minute per agent")  # fmt: skip
    if procs:
        nhc = _med(procs["nhc"])
        print(f"whole processes, medians of {args.processes} interleaved: NHC {nhc:.3f} s")
        for name in ("prolog, agent", "prolog, no agent"):
            m = _med(procs[name])
            print(f"  {name:18s} {m:.3f} s  = {m / nhc:.2f}x NHC")
    print(burst)


if __name__ == "__main__":
    main()
