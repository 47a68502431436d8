"""Integration tests against a real local Slurm cluster (`scripts/cluster up`: n1..n3 on this
machine, fake H100 GRES, slurmhealth's prolog/epilog wired in).

Everything in tests/integration is marked `slurm`. The session fixture `cluster` starts the
cluster (idempotent; about a second when the packages are installed) and hands out helpers.
Without root, or without Slurm and apt-get, the tests are skipped; with CI=true they fail.
The cluster is stopped at the end only if this session started it (keep it with
SLURMHEALTH_KEEP_CLUSTER=1).
"""

from __future__ import annotations

import fcntl
import os
import pwd
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.skips import unavailable

REPO = Path(__file__).resolve().parent.parent.parent
CLUSTER_SCRIPT = REPO / "scripts" / "cluster"
SCENARIOS = REPO / "scenarios"
HERE = Path(__file__).resolve().parent
POLL_S = 0.2
# taken for a whole test session that uses the cluster (see `cluster`)
CLUSTER_LOCK = "/run/lock/slurmhealth-cluster.lock"
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
    }
)
# `scontrol show job -o` is one line of Key=Value pairs; values may contain '=' (TRES=cpu=1,..)
_KEY = re.compile(r"\s+(?=[A-Za-z][A-Za-z0-9:/_]*=)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`pytestmark = pytest.mark.slurm` for every test under tests/integration."""
    for item in items:
        if HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.slurm)


def _unavailable(reason: str) -> None:
    """Skip locally, fail in CI (where the cluster must work)."""
    unavailable(f"the Slurm cluster is unavailable: {reason}")


def _run(
    cmd: list[str], *, timeout: float = 30, check: bool = True, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\n"
            f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def parse_scontrol_line(line: str) -> dict[str, str]:
    """Parse one `scontrol show ... -o` line into a dict (first occurrence of a key wins)."""
    record: dict[str, str] = {}
    for token in _KEY.split(line.strip()):
        key, sep, value = token.partition("=")
        if sep and key not in record:
            record[key] = value
    return record


def expand_hostlist(hostlist: str) -> list[str]:
    """`n[1-3]` -> ['n1', 'n2', 'n3'] (via scontrol, which knows every hostlist form)."""
    if not hostlist or hostlist == "(null)":
        return []
    out = _run(["scontrol", "show", "hostnames", hostlist]).stdout
    return out.split()


@dataclass
class JobResult:
    """A submitted job; `state` and `nodes` are final when it was waited for."""

    job_id: str
    state: str
    nodes: list[str]
    record: dict[str, str] = field(default_factory=dict)

    @property
    def stdout_path(self) -> Path | None:
        path = self.record.get("StdOut")
        return Path(path) if path else None

    def output(self) -> str:
        """The job's stdout file (slurm-ID.out in the submitter's home by default)."""
        path = self.stdout_path
        return path.read_text() if path and path.exists() else ""


class Cluster:
    """Helpers for the local cluster whose state lives in `dir`."""

    def __init__(self, state_dir: Path, user: str = "shuser") -> None:
        self.dir = state_dir
        self.user = user

    # ------------------------------------------------------------------ files

    @property
    def scenario_path(self) -> Path:
        return self.dir / "scenario.toml"

    def set_scenario(self, scenario: str | Path) -> None:
        """Atomically replace DIR/scenario.toml (what every node's simulated GPUs show).

        Accepts scenario text, a path to a scenario file, or a name from scenarios/
        ("nvlink-down").
        """
        if isinstance(scenario, Path):
            text = scenario.read_text()
        elif "\n" in scenario or "=" in scenario or "[" in scenario:
            text = scenario
        elif Path(scenario).is_file():
            text = Path(scenario).read_text()
        elif (SCENARIOS / f"{scenario}.toml").is_file():
            text = (SCENARIOS / f"{scenario}.toml").read_text()
        else:
            raise FileNotFoundError(f"no scenario {scenario!r} (not a file nor scenarios/*.toml)")
        tmp = self.dir / f".scenario.toml.{os.getpid()}.tmp"
        tmp.write_text(text)
        tmp.chmod(0o644)
        os.replace(tmp, self.scenario_path)
        self._outlive_snapshot_caches()

    def _outlive_snapshot_caches(self) -> None:
        """Wait until no node's shared prolog snapshot (hooks/snapshot_cache.py) is recent
        enough to be reused: a prolog may serve a GPU state read up to MAX_AGE_S before the
        scenario changed, as on a real node a fault that appeared in the last seconds is
        seen by the next prolog that reads the GPUs, not by one served from the cache."""
        from slurmhealth.hooks.snapshot_cache import MAX_AGE_S

        for cache in self.dir.glob("nodes/*/run/snapshot.json"):
            try:
                age = time.time() - cache.stat().st_mtime
            except FileNotFoundError:
                continue
            if age <= MAX_AGE_S:
                time.sleep(MAX_AGE_S - age + 0.1)

    def node_db(self, node: str) -> Path:
        """The history database slurmhealth keeps for `node` (n1..n3)."""
        return self.dir / "nodes" / node / "history.db"

    def node_dir(self, node: str) -> Path:
        return self.dir / "nodes" / node

    @property
    def log_path(self) -> Path:
        return self.dir / "log" / "slurmhealth.log"

    def log_text(self) -> str:
        """Everything the prolog/epilog wrappers (and slurmhealth's stderr) logged so far."""
        try:
            return self.log_path.read_text()
        except FileNotFoundError:
            return ""

    def wait_after_work(self, node: str = "*", timeout: float = 60) -> None:
        """Wait until the epilogs' detached after-work on ``node`` (every node by default)
        is done: its journal entries gone, so no process of a finished job still holds the
        node's history (or its job's step folder) open. A worker killed mid-way leaves its
        entry: the wait ends at ``timeout`` then."""
        deadline = time.monotonic() + timeout
        while any((self.dir / "nodes").glob(f"{node}/run/pending/*.json")):
            if time.monotonic() > deadline:
                return
            time.sleep(POLL_S)

    def reset_node_data(self) -> None:
        """Forget every node's slurmhealth data (history, kernel-log cursor, run dir, evidence)
        and start a fresh slurmhealth.log (the old one is kept as slurmhealth.log.1).

        Call it only while no job runs: a prolog/epilog may be writing these files. It
        waits for the epilogs' detached after-work (their journal entries gone: the sidecar
        stopped and its job's step folder, a tmpfs, unmounted), and unmounts what a killed
        one left.
        """
        self.wait_after_work()
        for node_dir in sorted((self.dir / "nodes").glob("*")):
            if node_dir.is_dir():
                for job_dir in (node_dir / "run" / "jobs").glob("*"):
                    if job_dir.is_mount():
                        _run(["umount", "-l", str(job_dir)], check=False)
                shutil.rmtree(node_dir)
                (node_dir / "run").mkdir(parents=True)
        evidence = self.dir / "evidence"
        if evidence.is_dir():
            shutil.rmtree(evidence)
        evidence.mkdir(exist_ok=True)
        if self.log_path.exists():
            os.replace(self.log_path, self.log_path.with_name("slurmhealth.log.1"))
        self.log_path.touch()
        self.log_path.chmod(0o644)

    # ------------------------------------------------------------------ jobs

    @property
    def home(self) -> Path:
        return Path(pwd.getpwnam(self.user).pw_dir)

    def _as_user(
        self, user: str, cmd: list[str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        return _run(
            ["runuser", "-u", user, "--", *cmd],
            timeout=timeout,
            check=False,
            cwd=pwd.getpwnam(user).pw_dir,
        )

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job -o ID` as a dict ({} once Slurm forgot the job)."""
        proc = _run(["scontrol", "show", "job", "-o", job_id], check=False)
        line = proc.stdout.strip().splitlines()
        return parse_scontrol_line(line[0]) if proc.returncode == 0 and line else {}

    def wait_job(
        self, job_id: str, timeout: float = 60, states: frozenset[str] = TERMINAL_STATES
    ) -> JobResult:
        """Poll until the job reaches one of `states`; fail the test after `timeout` s."""
        deadline = time.monotonic() + timeout
        record: dict[str, str] = {}
        while True:
            record = self.job(job_id)
            state = record.get("JobState", "")
            if state in states:
                return JobResult(job_id, state, expand_hostlist(record.get("NodeList", "")), record)
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"job {job_id} still {state or 'unknown'} after {timeout}s "
                    f"(Reason={record.get('Reason')}, Restarts={record.get('Restarts')})\n"
                    f"sinfo -R: {self.sinfo_reasons()}"
                )
            time.sleep(POLL_S)

    def sbatch(
        self, *args: str, user: str | None = None, wait: bool = True, timeout: float = 60
    ) -> JobResult:
        """Submit `sbatch --parsable ARGS` as the unprivileged user (from their home dir).

        With wait=True, poll until the job ends (COMPLETED, FAILED, ...) and return the final
        state and node list; otherwise return at once with state PENDING.
        """
        proc = self._as_user(user or self.user, ["sbatch", "--parsable", *args], timeout=30)
        if proc.returncode != 0:
            raise AssertionError(f"sbatch {' '.join(args)} failed: {proc.stderr.strip()}")
        job_id = proc.stdout.strip().split(";")[0]
        if not wait:
            return JobResult(job_id, "PENDING", [], {})
        return self.wait_job(job_id, timeout=timeout)

    def srun(
        self, *args: str, user: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """Run `srun ARGS` as the unprivileged user; the caller checks returncode/stdout."""
        return self._as_user(user or self.user, ["srun", *args], timeout=timeout)

    # ------------------------------------------------------------------ nodes

    def node_states(self) -> dict[str, str]:
        """node -> long state (idle, allocated, drained, draining, mixed, down*, ...)."""
        out = _run(["sinfo", "-h", "-N", "-o", "%N|%T"]).stdout
        states: dict[str, str] = {}
        for line in out.splitlines():
            node, _, state = line.partition("|")
            states[node.strip()] = state.strip()
        return states

    def sinfo_reasons(self) -> dict[str, str]:
        """node -> reason for every node that is down/drained/failing with a reason.

        `-N` gives one line per node, and `%N` is the node name (`%n` would be its
        hostname, the same machine for all three nodes here).
        """
        out = _run(["sinfo", "-R", "-h", "-N", "-o", "%N|%E|%H"]).stdout
        reasons: dict[str, str] = {}
        for line in out.splitlines():
            node, _, rest = line.partition("|")
            reason, _, _when = rest.rpartition("|")
            reasons[node.strip()] = reason.strip()
        return reasons

    def scontrol(self, *args: str) -> str:
        return _run(["scontrol", *args]).stdout

    def wait_idle(self, timeout: float = 60) -> None:
        """Wait until no job is pending, running or completing (leftovers of a previous run
        are cancelled, and cancelled again while they show: a job whose prolog failed is
        requeued after a moment, and a scancel during its requeue does not take)."""
        deadline = time.monotonic() + timeout
        while True:
            out = _run(["squeue", "-h", "-o", "%i %T"], check=False).stdout.strip()
            if not out:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"jobs still in the queue after {timeout}s:\n{out}")
            if "PENDING" in out or "RUNNING" in out:
                _run(["scancel", "--state=PENDING"], check=False)
                _run(["scancel", "--state=RUNNING"], check=False)
            time.sleep(POLL_S)

    def resume_all(self, timeout: float = 15) -> None:
        """Resume every drained/down node and wait until none is (test isolation)."""
        bad = [n for n, s in self.node_states().items() if _needs_resume(s)]
        for node in bad:
            _run(["scontrol", "update", f"nodename={node}", "state=resume"], check=False)
        deadline = time.monotonic() + timeout
        while True:
            states = self.node_states()
            bad = [n for n, s in states.items() if _needs_resume(s)]
            if not bad:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"nodes not resumed after {timeout}s: {states}")
            time.sleep(POLL_S)


def _needs_resume(state: str) -> bool:
    return any(word in state for word in ("drain", "down", "fail")) or state.endswith("*")


_HOLDER = "SLURMHEALTH_TEST_CLUSTER_LOCK_PID"
_HELD: list[object] = []  # this process's hold on CLUSTER_LOCK (one, however many conftests)


def _hold_cluster_lock() -> None:
    """One machine has one cluster (/etc/slurm, fixed ports): a test session of another
    checkout waits here until the first is done with it instead of rewriting it under it.
    Taken once per process and kept until it exits: tests/reliability reuses this fixture
    through its own conftest, a second instance in the same session, and a second flock on a
    new descriptor in one process would wait for itself."""
    # pytest may import this conftest twice (as itself and through the reliability one):
    # the process's hold is marked in its environment, which both copies share
    if _HELD or os.environ.get(_HOLDER) == str(os.getpid()):
        return
    lock = open(CLUSTER_LOCK, "a")  # noqa: SIM115 (held until the process exits)
    fcntl.flock(lock, fcntl.LOCK_EX)
    _HELD.append(lock)
    os.environ[_HOLDER] = str(os.getpid())


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The local 3-node Slurm cluster, started by `scripts/cluster up` (needs root)."""
    if os.geteuid() != 0:
        _unavailable("the Slurm integration tests need root (scripts/cluster up starts daemons)")
    had_slurm = all(shutil.which(c) for c in ("slurmctld", "slurmd", "sbatch", "munged"))
    if not had_slurm and shutil.which("apt-get") is None:
        _unavailable("Slurm is not installed and apt-get is not available to install it")
    for tool in ("runuser", "flock", "mknod"):
        if shutil.which(tool) is None:
            _unavailable(f"{tool} is not available")

    _hold_cluster_lock()
    state_dir = Path(os.environ.get("SLURMHEALTH_CLUSTER_DIR", "/var/tmp/slurmhealth-cluster"))
    was_up = (
        had_slurm and _run([str(CLUSTER_SCRIPT), "status"], check=False, timeout=30).returncode == 0
    )
    proc = _run([str(CLUSTER_SCRIPT), "up"], check=False, timeout=600)
    if proc.returncode != 0:
        detail = f"scripts/cluster up exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        if not had_slurm:
            # most likely apt-get could not install the packages (no network, no mirror)
            _unavailable(f"could not install Slurm: {detail}")
        pytest.fail(detail)

    c = Cluster(state_dir)
    c.wait_idle()
    c.resume_all()
    c.set_scenario("healthy")
    # each session starts with empty per-node histories (job ids may repeat after a purge)
    c.reset_node_data()
    yield c
    if not was_up and os.environ.get("SLURMHEALTH_KEEP_CLUSTER", "") != "1":
        _run([str(CLUSTER_SCRIPT), "down"], check=False, timeout=120)


@pytest.fixture
def healthy(cluster: Cluster) -> Iterator[Cluster]:
    """Every test starts and ends on a healthy, fully resumed cluster with no job left."""
    cluster.wait_idle()
    cluster.set_scenario("healthy")
    cluster.resume_all()
    yield cluster
    cluster.wait_idle()  # requeued jobs must not leak into the next test
    cluster.set_scenario("healthy")
    cluster.resume_all()
