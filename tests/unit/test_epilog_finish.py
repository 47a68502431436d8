"""The epilog decides and returns; its after-work (sidecar flush, evidence, summary.json,
AdminComment) runs detached from a journal entry in the root-only run dir, and a worker
killed with SIGKILL leaves the entry for the next agent start, which finishes it. Real
processes for the kill; each test waits for a condition, never a fixed time."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from slurmhealth.config import Config, load_config
from slurmhealth.gpu.nvml import NvmlBackend
from slurmhealth.gpu.scenario import load_scenario
from slurmhealth.gpu.sim import SimulatedNvml
from slurmhealth.history import History
from slurmhealth.history.read import Reader, job_row_counts
from slurmhealth.hooks import finish
from slurmhealth.hooks.job import job_from_env
from slurmhealth.hooks.prolog import Adapters, run_hook
from slurmhealth.sidecar.lifecycle import RUN_DIR_ENV
from slurmhealth.slurm import NodeInfo, SlurmCli
from tests.support.recording_slurm import RecordingSlurm

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
DEADLINE_S = 60.0
JOB = str(710_000_000 + os.getpid() % 100_000 * 10)


def _config(tmp: Path, *, sidecar: bool = False, admin_comment: bool = False) -> Path:
    missing = tmp / "absent"
    path = tmp / "config.toml"
    path.write_text(f"""
[node]
name = "n1"
[gpu]
backend = "sim"
sim_scenario = "{SCENARIOS / "healthy.toml"}"
sim_kernel_log = "{tmp / "kmsg"}"
[paths]
db = "{tmp / "history.db"}"
evidence_dir = "{tmp / "evidence"}"
run_dir = "{tmp / "run"}"
[sidecar]
enabled = {str(sidecar).lower()}
stop_grace_s = 14.0
[evidence]
scontrol = "{missing}"
nvidia_smi = "{missing}"
py_spy = "{missing}"
budget_s = 1.0
[report]
admin_comment = {str(admin_comment).lower()}
""")
    return path


def _env(**more: str) -> dict[str, str]:
    return {"SLURM_JOB_ID": JOB, "SLURMD_NODENAME": "n1", "SLURM_JOB_USER": "alice",
            "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_GPUS": "0,1", **more}  # fmt: skip


def _epilog(cfg: Config, tmp: Path, slurm: object, detached: list[str], **env: str) -> None:
    environ = _env(**env)
    history = History(tmp / "history.db", spool_path=tmp / "spool.jsonl")

    def gpu(_timeout: float) -> NvmlBackend:
        lib = SimulatedNvml(load_scenario(cfg.gpu.sim_scenario), "n1",
                            kernel_log_path=str(tmp / "kmsg"))  # fmt: skip
        return NvmlBackend(lib, node="n1", timeout_s=1.0)

    adapters = Adapters(slurm, gpu, history, detached.append)  # type: ignore[arg-type]
    try:
        run_hook(cfg, job_from_env(environ, "n1"), environ, "epilog", adapters)
    finally:
        history.close()


def _summary(tmp: Path) -> Path:
    return tmp / "evidence" / JOB / "n1" / "summary.json"


def _wait_for(what: str, ready: Callable[[], object]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not ready():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.02)


def test_the_epilog_journals_and_the_after_work_writes_the_evidence(tmp_path: Path) -> None:
    cfg = load_config(str(_config(tmp_path)), env={})
    detached: list[str] = []
    _epilog(
        cfg,
        tmp_path,
        RecordingSlurm([NodeInfo("n1", "idle")]),
        detached,
        SLURM_JOB_EXIT_CODE2="3:0",
    )
    # the epilog returned with its decision only: the bundle is still to come
    assert len(detached) == 1 and os.path.exists(detached[0])
    assert not _summary(tmp_path).exists()
    pending = Path(detached[0]).parent
    assert pending == tmp_path / "run" / "pending" and pending.stat().st_mode & 0o777 == 0o700
    assert Path(detached[0]).stat().st_mode & 0o777 == 0o600
    assert json.loads(Path(detached[0]).read_text())["evidence_why"] == "job failed"
    finish.finish(cfg, detached[0], RecordingSlurm([NodeInfo("n1", "idle")]))
    assert _summary(tmp_path).exists()
    assert (tmp_path / "evidence" / JOB / "n1" / "manifest.json").exists()  # a failed job
    assert not os.path.exists(detached[0])
    # a job shorter than one sample interval: its summary has the epilog's snapshot
    with Reader(str(tmp_path / "history.db")) as db:
        assert job_row_counts(db, JOB, "n1")["samples"] == 2
    assert json.loads(_summary(tmp_path).read_text())["gpus"]


class _Sacctmgr(SlurmCli):
    def __init__(self) -> None:
        super().__init__(timeout_s=60.0)
        self.ran: list[Sequence[str]] = []

    def _run(self, argv: Sequence[str], time_format: str = "standard") -> str:
        self.ran.append(list(argv))
        return ""


def test_the_first_node_stores_the_admin_comment_after_its_epilog(tmp_path: Path) -> None:
    cfg = load_config(str(_config(tmp_path, admin_comment=True)), env={})
    detached: list[str] = []
    _epilog(
        cfg, tmp_path, RecordingSlurm([NodeInfo("n1", "idle")]), detached, SLURM_JOB_NODELIST="n1"
    )
    slurm = _Sacctmgr()
    finish.finish(cfg, detached[0], slurm, wait_s=0.0)
    (cmd,) = [c for c in slurm.ran if c[0] == "sacctmgr"]
    assert cmd[:6] == ["sacctmgr", "-i", "modify", "job", "where", f"jobid={JOB}"]
    value = cmd[-1].removeprefix("AdminComment=")
    assert value.startswith("sh1:") and value == value.lower()  # survives sacctmgr's lowercasing


def test_a_node_that_is_not_the_first_leaves_the_admin_comment_to_it(tmp_path: Path) -> None:
    cfg = load_config(str(_config(tmp_path, admin_comment=True)), env={})
    detached: list[str] = []
    _epilog(
        cfg,
        tmp_path,
        RecordingSlurm([NodeInfo("n1", "idle")]),
        detached,
        SLURM_JOB_NODELIST="n[0-1]",
    )
    slurm = _Sacctmgr()
    finish.finish(cfg, detached[0], slurm, wait_s=0.0)
    assert [c for c in slurm.ran if c[0] == "sacctmgr"] == []
    assert _summary(tmp_path).exists()


def _locked(path: str) -> bool:
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_killed_worker_leaves_its_entry_and_the_next_agent_start_finishes_it(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, sidecar=True)
    cfg = load_config(str(config), env={})
    detached: list[str] = []
    _epilog(cfg, tmp_path, RecordingSlurm([NodeInfo("n1", "idle")]), detached)
    # the job's sidecar ignores SIGTERM: the worker waits for it (stop_grace_s = 14)
    ready = tmp_path / "stubborn.ready"
    code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            f"open({str(ready)!r}, 'w').close(); time.sleep(600)")  # fmt: skip
    run_dir = cfg.expand(cfg.paths.run_dir, "n1")
    stubborn = subprocess.Popen([sys.executable, "-c", code, "sidecar", "--job", JOB],
                                env={"PATH": os.environ["PATH"], RUN_DIR_ENV: run_dir})  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SLURMHEALTH"))}
    worker = None
    try:
        _wait_for("the stubborn sidecar", ready.exists)
        worker = subprocess.Popen(
            [sys.executable, "-m", "slurmhealth", "epilog-finish", detached[0]],
            env={**env, "SLURMHEALTH_CONFIG": str(config)},
        )
        _wait_for("the worker to hold its entry", lambda: _locked(detached[0]))
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        assert os.path.exists(detached[0]) and not _locked(detached[0])
        assert not _summary(tmp_path).exists()
        stubborn.kill()
        stubborn.wait()
        # what `slurmhealth exporter` (the node agent) runs when it starts
        done = finish.finish_pending(cfg, "n1")
    finally:
        for proc in (stubborn, worker):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert list(done) == [detached[0]]
    assert _summary(tmp_path).exists()
    assert finish.entries(cfg, "n1") == []
