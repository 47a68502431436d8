"""No sidecar outlives its job on the node: the epilog stops every sidecar of the job there
(also one still starting, one without a pid file, one that ignores SIGTERM) and removes
its series file; a sidecar whose job never showed up, or whose job's processes are gone,
ends by itself. Real processes; each test waits for a condition, never a fixed time."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurmhealth.config import Config, load_config
from slurmhealth.model_records import Job
from slurmhealth.sidecar.lifecycle import RUN_DIR_ENV, start_sidecar, stop_sidecar
from slurmhealth.sidecar.presence import JobPresence
from tests.support.sim_config import sidecar_config, sidecar_env

DEADLINE_S = 60.0
# job ids no other process on this machine carries (presence scans every process)
BASE = 700_000_000 + os.getpid() % 100_000 * 100

HEALTHY = """
name = "healthy"
[all_gpus]
utilization_gpu = 50
"""


def _job(n: int) -> str:
    return str(BASE + n)


def _config(tmp: Path, **sidecar: object) -> Config:
    return load_config(str(sidecar_config(tmp, HEALTHY, **sidecar)), env={})


def _wait_for(what: str, ready: Callable[[], object]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not ready():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.05)


def _alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def _stubborn(tmp: Path, job: str, run_dir: str, name: str) -> subprocess.Popen[bytes]:
    """A process that looks like ``job``'s sidecar, started by the prolog for ``run_dir``
    ("": by an older one, which did not say), and ignores SIGTERM."""
    ready = tmp / f"{name}.ready"
    code = (
        "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open({str(ready)!r}, 'w').close(); time.sleep(600)"
    )
    env = {"PATH": os.environ.get("PATH", ""), RUN_DIR_ENV: run_dir}
    proc = subprocess.Popen([sys.executable, "-c", code, "sidecar", "--job", job], env=env)
    _wait_for(f"{name} to ignore SIGTERM", ready.exists)
    return proc


def test_the_epilog_kills_a_sidecar_that_ignores_sigterm_and_drops_its_series(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    mapping = tmp_path / "dcgm"
    cfg = _config(tmp_path, stop_grace_s=0.3, dcgm_job_mapping_dir=f'"{mapping}"')
    job = _job(1)
    run = tmp_path / "run"
    (run / "export").mkdir(parents=True)
    mapping.mkdir(parents=True)
    (mapping / "0").write_text(f"{job}\n")  # the job's GPU 0 in dcgm-exporter's job mapping
    (mapping / "1").write_text("42\n")  # another job's GPU
    with_pid_file = _stubborn(tmp_path, job, "", "a")  # found by its pid file only
    without = _stubborn(tmp_path, job, str(run), "b")  # a second start overwrote its pid
    other_node = _stubborn(tmp_path, job, str(tmp_path / "run-of-node2"), "c")
    procs += [with_pid_file, without, other_node]
    (run / f"sidecar-{job}.pid").write_text(f"{with_pid_file.pid}\n")
    (run / "export" / f"job-{job}.json").write_text("{}")
    (run / "export" / f".job-{job}.json.{with_pid_file.pid}.tmp").write_text("{")  # half

    t0 = time.monotonic()
    outcome = stop_sidecar(cfg, "node1", job)

    assert time.monotonic() - t0 < 0.3 + 2.0  # the grace, then SIGKILL at once
    assert with_pid_file.wait(5) == -9 and without.wait(5) == -9
    first, second = sorted([with_pid_file.pid, without.pid])
    assert outcome == f"sidecar {first} killed after 0.3 s; sidecar {second} killed after 0.3 s"
    assert _alive(other_node)  # the same job's sidecar of another node on this host
    assert list(run.glob("sidecar-*")) == [] and list((run / "export").iterdir()) == []
    assert [p.name for p in mapping.iterdir()] == ["1"]


def test_a_job_that_ends_while_its_sidecar_starts_leaves_nothing_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sbatch --wrap true``: the epilog comes before the sidecar has done anything."""
    cfg = _config(tmp_path)
    monkeypatch.setenv("SLURMHEALTH_CONFIG", str(tmp_path / "config.toml"))
    monkeypatch.setenv("SLURMHEALTH_LOG_FILE", str(tmp_path / "sidecar.log"))
    job = Job(job_id=_job(2), node="node1", gpus=(0, 1))
    run = tmp_path / "run"

    pid = start_sidecar(cfg, job)
    assert pid is not None
    assert (run / f"sidecar-{job.job_id}.pid").read_text() == f"{pid}\n"  # before it runs
    outcome = stop_sidecar(cfg, "node1", job.job_id)

    assert outcome == f"sidecar {pid} stopped"  # SIGTERM while starting ends it at once
    cmdline = Path(f"/proc/{pid}/cmdline")
    assert not cmdline.exists() or not cmdline.read_bytes()  # gone (or a zombie of ours)
    assert list(run.glob("sidecar-*")) == []
    assert not (run / "export" / f"job-{job.job_id}.json").exists()


def _sidecar(tmp: Path, job: str, log: str) -> subprocess.Popen[bytes]:
    with open(tmp / log, "wb") as err:
        argv = [sys.executable, "-m", "slurmhealth", "sidecar", "--job", job, "--gpus", "0"]
        return subprocess.Popen(argv, env=sidecar_env(tmp / "config.toml"), stderr=err)


def test_a_sidecar_whose_job_never_shows_up_ends_after_the_grace(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    """No epilog comes (slurmd restarted): a job never seen ends its sidecar after
    ``unseen_grace_s``; a job seen running keeps its own until its processes are gone."""
    _config(tmp_path, job_check_interval_s=1, unseen_grace_s=3)
    never, running = _job(3), _job(4)
    the_job = subprocess.Popen(
        ["sleep", "600"], env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": running}
    )
    procs.append(the_job)
    t0 = time.monotonic()
    orphan, watched = _sidecar(tmp_path, never, "never.log"), _sidecar(tmp_path, running, "run.log")
    procs += [orphan, watched]

    _wait_for("the unseen job's sidecar to end", lambda: not _alive(orphan))
    assert orphan.returncode == 0 and time.monotonic() - t0 >= 3
    assert "stopped (job gone)" in (tmp_path / "never.log").read_text()
    run = tmp_path / "run"
    assert not (run / f"sidecar-{never}.pid").exists()
    assert not (run / "export" / f"job-{never}.json").exists()
    assert _alive(watched)  # its job runs: the grace is not a time limit

    the_job.kill()
    the_job.wait()
    _wait_for("the gone job's sidecar to end", lambda: not _alive(watched))
    assert watched.returncode == 0 and not (run / f"sidecar-{running}.pid").exists()


def test_presence_counts_a_job_never_seen_as_ended_only_after_the_grace(tmp_path: Path) -> None:
    now = [0.0]
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    proc.mkdir()
    cg.mkdir()
    presence = JobPresence(
        "5", unseen_grace_s=30, proc=str(proc), cgroup_root=str(cg), clock=lambda: now[0]
    )
    checks = []
    for t in (0, 10, 29.9, 30):
        now[0] = t
        checks.append(presence.ended())
    assert checks == [False, False, False, True]


def test_the_prolog_starts_and_the_epilog_stops_without_the_prometheus_client() -> None:
    """Loading it costs every prolog a quarter of a second on a busy node."""
    code = (
        "import sys\n"
        "from slurmhealth.config import Config\n"
        "from slurmhealth.sidecar.lifecycle import stop_sidecar\n"
        "from slurmhealth.sidecar.files import SidecarFiles\n"
        "SidecarFiles.of(Config(), 'n1', '5')\n"
        "assert 'prometheus_client' not in sys.modules, 'loaded'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


HANGING_GPU0 = """
name = "gpu0-hang"
[gpu.0]
hang = true
hang_s = 120.0
"""


def test_sigterm_while_the_first_snapshot_hangs_ends_the_sidecar_at_once(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    """Nothing is sampled yet, so nothing waits for the GPU's deadline or a final flush."""
    sidecar_config(tmp_path, HANGING_GPU0)
    job = _job(7)
    with open(tmp_path / "err", "wb") as err:
        argv = [sys.executable, "-m", "slurmhealth", "sidecar", "--job", job, "--gpus", "0"]
        env = sidecar_env(tmp_path / "config.toml", SLURMHEALTH_SNAPSHOT_TIMEOUT="4.0")
        proc = subprocess.Popen(argv, env=env, stderr=err)
    procs.append(proc)
    pid_file = tmp_path / "run" / f"sidecar-{job}.pid"
    _wait_for("the sidecar to announce itself", pid_file.exists)  # then its first snapshot
    proc.send_signal(subprocess.signal.SIGTERM)
    assert proc.wait(DEADLINE_S) == 0
    assert "stopped while starting (SIGTERM)" in (tmp_path / "err").read_text()
    assert not pid_file.exists()
    db = tmp_path / "db" / "history.db"
    if not db.exists():  # SIGTERM came before the sidecar opened its history: nothing sampled
        return
    with sqlite3.connect(db) as conn:  # nothing half-sampled
        tables = {row[0] for row in conn.execute("select name from sqlite_master")}
        assert "samples" not in tables or conn.execute(
            "select count(*) from samples"
        ).fetchone() == (0,)
