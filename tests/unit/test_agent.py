"""The node agent answers the prolog's thin client over its root-only socket with the same
decision the in-process prolog makes; a burst of prologs shares one GPU read; another
protocol version, a missing agent or an agent killed mid-decision make the prolog fall
back, loudly, and still decide within its budget. Real sockets and processes; waits are on
conditions with generous deadlines."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from slurmhealth.agent import client, protocol
from slurmhealth.agent.server import Agent
from slurmhealth.config import Config, load_config
from tests.support.skips import unavailable

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
DEADLINE_S = 60.0
BASE = 720_000_000 + os.getpid() % 100_000 * 100


def _config(tmp: Path, scenario: str = "healthy", **gpu: str) -> Path:
    missing = tmp / "absent"
    path = tmp / "config.toml"
    extra = "".join(f"{k} = {v}\n" for k, v in gpu.items())
    path.write_text(f"""
[node]
name = "n1"
[gpu]
backend = "sim"
sim_scenario = "{SCENARIOS / f"{scenario}.toml"}"
sim_kernel_log = "{tmp / "kmsg"}"
{extra}[paths]
db = "{tmp / "history.db"}"
evidence_dir = "{tmp / "evidence"}"
run_dir = "{tmp / "run"}"
[sidecar]
enabled = false
[evidence]
scontrol = "{missing}"
nvidia_smi = "{missing}"
py_spy = "{missing}"
[report]
admin_comment = false
""")
    return path


def _env(config: Path, job: int, gpus: str = "0,1", **more: str) -> dict[str, str]:
    """A prolog's environment as Slurm 23.02+ gives it (account and comment: no squeue)."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SLURMHEALTH"))}
    return {**keep, "SLURMHEALTH_CONFIG": str(config), "SLURM_JOB_ID": str(BASE + job),
            "SLURMD_NODENAME": "n1", "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1000",
            "SLURM_JOB_GPUS": gpus, "SLURM_JOB_ACCOUNT": "acct", "SLURM_JOB_COMMENT": "",
            **more}  # fmt: skip


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[Agent, Config, Path]]:
    config = _config(tmp_path)
    cfg = load_config(str(config), env={})
    running = Agent(lambda: (cfg, True), snapshot_max_age_s=600.0)
    assert running.start()
    yield running, cfg, config
    running.stop()


def _runs(tmp: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(tmp / "history.db")
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("select * from check_runs order by rowid")]
    finally:
        conn.close()


def test_the_prolog_gets_the_agents_decision_and_it_is_recorded(
    agent: tuple[Agent, Config, Path], tmp_path: Path
) -> None:
    running, _cfg, config = agent
    assert os.stat(running.path).st_mode & 0o777 == 0o600
    answer = client.ask(running.path, "prolog", _env(config, 1))
    assert answer["exit_code"] == 0 and answer["status"] == "ok"
    assert any("judged on NVML snapshot #1" in line for line in answer["log"])
    (run,) = _runs(tmp_path)
    assert (run["job_id"], run["phase"], run["status"]) == (str(BASE + 1), "prolog", "ok")


def test_sixteen_simultaneous_prologs_share_one_gpu_read_and_none_fails_open(
    agent: tuple[Agent, Config, Path], tmp_path: Path
) -> None:
    running, _cfg, config = agent
    answers: dict[int, dict[str, Any]] = {}
    go = threading.Event()

    def prolog(n: int) -> None:
        go.wait()
        answers[n] = client.ask(running.path, "prolog", _env(config, 10 + n, gpus=str(n % 8)))

    threads = [threading.Thread(target=prolog, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    go.set()
    for t in threads:
        t.join(DEADLINE_S)
    assert sorted(answers) == list(range(16))
    assert {a["exit_code"] for a in answers.values()} == {0}
    runs = _runs(tmp_path)
    assert len(runs) == 16 and {r["status"] for r in runs} == {"ok"}  # no failopen
    assert running.snapshots_taken == 1


def test_no_job_start_through_the_agent_checkpoints_the_history(
    agent: tuple[Agent, Config, Path], tmp_path: Path
) -> None:
    """The agent holds the node history open, so a hook's connection is never the last
    one: its close does not checkpoint the WAL (an fsync) on the job's path. What the
    prologs wrote is readable meanwhile, and is in the database once the agent stops."""
    running, _cfg, config = agent
    for n in range(3):
        assert client.ask(running.path, "prolog", _env(config, 30 + n))["exit_code"] == 0
    wal = tmp_path / "history.db-wal"
    assert wal.exists() and wal.stat().st_size > 0  # not checkpointed and removed
    assert [r["status"] for r in _runs(tmp_path)] == ["ok"] * 3
    running.stop()
    assert not wal.exists() or wal.stat().st_size == 0
    assert [r["status"] for r in _runs(tmp_path)] == ["ok"] * 3


def test_a_history_replaced_under_the_agent_is_held_open_anew(
    agent: tuple[Agent, Config, Path], tmp_path: Path
) -> None:
    """A history moved aside (as a corrupt one is) and made anew: the agent lets the old
    file go and holds the new one, so job starts still close without a checkpoint."""
    running, _cfg, config = agent
    assert client.ask(running.path, "prolog", _env(config, 50))["exit_code"] == 0
    for suffix in ("", "-wal", "-shm"):
        old = tmp_path / f"history.db{suffix}"
        if old.exists():
            old.rename(tmp_path / f"moved.db{suffix}")
    for n in (51, 52):
        assert client.ask(running.path, "prolog", _env(config, n))["exit_code"] == 0
    wal = tmp_path / "history.db-wal"
    assert wal.exists() and wal.stat().st_size > 0
    assert [r["job_id"] for r in _runs(tmp_path)] == [str(BASE + 51), str(BASE + 52)]


def test_a_history_overwritten_in_place_under_the_agent_is_found_corrupt_and_moved_aside(
    agent: tuple[Agent, Config, Path], tmp_path: Path
) -> None:
    """The file garbled where it lies (same inode: a bad disk, a stray write) and its -wal
    and -shm removed: the next prolog through the agent finds it corrupt, moves it aside
    and records into a fresh one (the agent's idle connection must not keep the old
    WAL index alive for it)."""
    running, _cfg, config = agent
    assert client.ask(running.path, "prolog", _env(config, 60))["exit_code"] == 0
    db = tmp_path / "history.db"
    for extra in ("-wal", "-shm"):
        (tmp_path / f"history.db{extra}").unlink(missing_ok=True)
    db.write_bytes(b"this is not a database\n" * 512)
    answer = client.ask(running.path, "prolog", _env(config, 61))
    assert answer["exit_code"] == 0 and answer["status"] == "ok"
    (aside,) = tmp_path.glob("history.db.corrupt-*")
    assert aside.read_bytes().startswith(b"this is not a database\n")
    assert [r["job_id"] for r in _runs(tmp_path)] == [str(BASE + 61)]


def test_another_protocol_version_is_refused_so_the_client_falls_back(
    agent: tuple[Agent, Config, Path],
) -> None:
    running, _cfg, _config = agent
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(running.path)
        sock.sendall(b'{"v": 99, "op": "prolog", "env": {}}\n')
        answer = protocol.LineReader(sock).read(time.monotonic() + DEADLINE_S)
    assert answer["error"] == "version" and answer["accepts"] == protocol.VERSION


def test_an_old_client_without_new_fields_still_gets_an_answer(
    agent: tuple[Agent, Config, Path],
) -> None:
    running, _cfg, config = agent
    env = protocol.hook_env(_env(config, 2))
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(running.path)
        sock.sendall(protocol.encode({"op": "prolog", "env": env, "from_the_future": 1}))
        reader = protocol.LineReader(sock)
        assert reader.read(time.monotonic() + DEADLINE_S)["ack"] is True
        assert reader.read(time.monotonic() + DEADLINE_S)["exit_code"] == 0


def test_a_user_that_is_not_root_gets_no_answer(agent: tuple[Agent, Config, Path]) -> None:
    running, _cfg, _config = agent
    if os.geteuid() != 0:
        unavailable("needs root to run a client as another user")
    code = ("import socket, sys; s = socket.socket(socket.AF_UNIX); "
            f"s.connect({running.path!r}); s.sendall(b'{{\"v\": 1, \"op\": \"ping\"}}\\n'); "
            "print(s.recv(100))")  # fmt: skip
    proc = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True,
                          user=65534, timeout=DEADLINE_S)  # fmt: skip
    assert proc.returncode != 0 and "PermissionError" in proc.stderr


def test_no_agent_means_the_prolog_runs_in_process_and_says_so(tmp_path: Path) -> None:
    config = _config(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "slurmhealth", "prolog"],
                          env=_env(config, 3), capture_output=True, text=True,
                          timeout=DEADLINE_S)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "node agent not used (no agent socket at" in proc.stderr
    assert [r["status"] for r in _runs(tmp_path)] == ["ok"]


def _wait_for(what: str, ready: Callable[[], object]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not ready():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.01)


def test_kill_9_of_the_agent_during_a_prolog_still_decides_within_the_budget(
    tmp_path: Path,
) -> None:
    # GPU 6 hangs: the agent's first read (all GPUs) waits out its deadline, mid-decision
    config = _config(tmp_path, "gpu-hang", snapshot_timeout_s="3.0")
    env = _env(config, 4)
    agent_proc = subprocess.Popen([sys.executable, "-m", "slurmhealth", "exporter", "--port", "0"],
                                  env=env, stderr=subprocess.DEVNULL)  # fmt: skip
    sock = tmp_path / "run" / "agent.sock"
    try:
        _wait_for("the agent's socket", sock.exists)
        started = time.time()
        hook = subprocess.Popen([sys.executable, "-m", "slurmhealth", "prolog"],
                                env={**env, "SLURMHEALTH_PROLOG_STARTED": str(started)},
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        _wait_for("the agent to take the prolog", lambda: list((tmp_path / "run").glob("prolog.*")))
        os.kill(agent_proc.pid, signal.SIGKILL)
        _, stderr = hook.communicate(timeout=DEADLINE_S)
        took = time.time() - started
    finally:
        if agent_proc.poll() is None:
            agent_proc.kill()
        agent_proc.wait()
    assert hook.returncode == 0, stderr
    assert "node agent not used (agent: connection closed)" in stderr
    cfg = load_config(str(config), env={})
    assert took < cfg.slurm.prolog_budget_s + 1.0  # the in-process fallback kept the budget
    runs = [r for r in _runs(tmp_path) if r["job_id"] == str(BASE + 4)]
    assert [r["status"] for r in runs] == ["ok"]  # decided (GPUs 0,1: healthy), not failopen


class _Squeue:
    """A Slurm backend whose node listing is what ``squeue -h -w NODE -o FORMAT`` printed."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.calls: list[str] = []

    def jobs_on_node(self, node: str) -> dict[str, Any]:
        from slurmhealth.slurm import parse_node_jobs

        self.calls.append(f"squeue -w {node}")
        return parse_node_jobs(self.out)

    def job(self, job_id: str) -> None:
        self.calls.append(f"squeue -j {job_id}")


def test_a_burst_of_prologs_on_slurm_22_05_shares_one_squeue_of_the_node() -> None:
    from slurmhealth.agent.views import NodeJobs

    out = "".join(f"{100 + k}|alice|acct{k}|gpu|normal|10|n1|CONFIGURING|\n" for k in range(16))
    slurm = _Squeue(out)
    jobs = NodeJobs()
    arrived = time.monotonic()
    views = [jobs.view(slurm, "n1", arrived) for _ in range(16)]  # type: ignore[arg-type]
    found = [v.job(str(100 + k)) for k, v in enumerate(views)]
    assert [f.account for f in found if f is not None] == [f"acct{k}" for k in range(16)]
    assert slurm.calls == ["squeue -w n1"]  # one Slurm call for the sixteen jobs
    # a prolog that arrives after that listing began needs a new one: its job may be new
    later = jobs.view(slurm, "n1", time.monotonic())  # type: ignore[arg-type]
    later.job("100")
    assert slurm.calls == ["squeue -w n1", "squeue -w n1"]


def test_a_comment_that_fakes_another_jobs_line_makes_both_ask_alone() -> None:
    from slurmhealth.agent.views import NodeJobs

    # job 7's comment holds a newline and a line for job 8 with the opt-out token
    forged = "7|eve|a|gpu|normal|10|n1|RUNNING|x\n8|alice|a|gpu|normal|1|n1|R|slurmhealth=off\n"
    real = "8|alice|acct|gpu|normal|10|n1|CONFIGURING|\n"
    slurm = _Squeue(forged + real)
    view = NodeJobs().view(slurm, "n1", time.monotonic())  # type: ignore[arg-type]
    assert view.job("8") is None  # listed twice: not trusted, asked for alone
    assert slurm.calls == ["squeue -w n1", "squeue -j 8"]


def test_the_prologs_happy_path_imports_only_the_standard_library(
    agent: tuple[Agent, Config, Path],
) -> None:
    _running, _cfg, config = agent
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "slurmhealth", "prolog"],
                          env=_env(config, 5), capture_output=True, text=True,
                          timeout=DEADLINE_S)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "(node agent)" in proc.stderr and "node agent not used" not in proc.stderr
    lines = [ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines()
             if ln.startswith("import time:")]  # fmt: skip
    imported = {name.split(".")[0] for name in lines}
    assert not imported & {"click", "rich", "pynvml", "prometheus_client", "sqlite3"}
    ours = {name for name in lines if name.startswith("slurmhealth")}
    assert ours <= {"slurmhealth", "slurmhealth.cli", "slurmhealth.agent",
                    "slurmhealth.agent.protocol", "slurmhealth.agent.client", "slurmhealth.hooks",
                    "slurmhealth.hooks.wrapper_log"}  # fmt: skip


@pytest.mark.parametrize(("scenario", "status"), [("healthy", "ok"), ("nvlink-down", "fail")])
def test_the_fallback_decides_as_the_cli_does_without_loading_click(
    tmp_path: Path, scenario: str, status: str
) -> None:
    """No agent: the in-process prolog runs without click (it is on the job's path then too)
    and decides and records as before, with the CLI's one-line errors."""
    config = _config(tmp_path, scenario)
    for job in (6, 7):  # the first creates the node's history (with sqlite-utils, once)
        env = _env(config, job, "3", SLURMHEALTH_POLICY="warn")  # records, never drains
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "slurmhealth",
                               "prolog"], env=env, capture_output=True, text=True,
                              timeout=DEADLINE_S)  # fmt: skip
        assert proc.returncode == 0, proc.stderr  # policy warn: the job may start
    assert "node agent not used (no agent socket at" in proc.stderr
    imported = {ln.rsplit("|", 1)[-1].strip().split(".")[0] for ln in proc.stderr.splitlines()
                if ln.startswith("import time:")}  # fmt: skip
    assert "slurmhealth" in imported and not imported & {"click", "rich", "prometheus_client"}
    runs = _runs(tmp_path)
    assert [(r["phase"], r["status"]) for r in runs] == [("prolog", status)] * 2, runs
    summary = [ln for ln in proc.stderr.splitlines() if "INFO:" in ln]
    assert summary[-1].startswith(f"slurmhealth prolog[job={BASE + 7} node=n1]: INFO: {status}")
    config.write_text(config.read_text() + "[bogus]\n")  # a config error: one line, exit 2
    bad = subprocess.run([sys.executable, "-m", "slurmhealth", "prolog"], env=env,
                         capture_output=True, text=True, timeout=DEADLINE_S)  # fmt: skip
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.splitlines()[-1].startswith("slurmhealth: error: ")
    assert "Traceback" not in bad.stderr


def test_the_gpu_library_stays_open_across_config_reloads_and_reopens_on_a_change(
    tmp_path: Path,
) -> None:
    from slurmhealth.agent.views import SharedGpu

    config = _config(tmp_path)
    opened: list[str] = []

    def opener(cfg: Config) -> Any:
        from slurmhealth.gpu import open_backend

        opened.append(cfg.gpu.sim_scenario)
        return open_backend(cfg)

    shared = SharedGpu(opener, max_age_s=0.0)
    for _ in range(3):  # a fresh load each time, as the agent reads one per hook
        shared.snapshot(load_config(str(config), env={}), "1", [0], fresh=True)
    assert len(opened) == 1 and shared.taken == 3
    config.write_text(config.read_text().replace("healthy.toml", "gpu-lost.toml"))
    shared.snapshot(load_config(str(config), env={}), "1", [0], fresh=True)
    assert len(opened) == 2 and opened[-1].endswith("gpu-lost.toml")
    shared.close()


def test_a_config_that_stops_loading_sends_the_hook_in_process_to_fail_open(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    cfg = load_config(str(config), env={})
    running = Agent(lambda: (cfg, True), load=lambda: load_config(str(config), env={}))
    assert running.start()
    try:
        config.write_text(config.read_text() + "\n[gpu\n")  # a typo saved just now
        with pytest.raises(client.Unavailable, match="the config does not load"):
            client.ask(running.path, "prolog", _env(config, 6))
    finally:
        running.stop()
    assert not (tmp_path / "history.db").exists()  # nothing judged with the old config


def test_the_agents_start_migrates_an_older_history_so_prologs_write_it(tmp_path: Path) -> None:
    from slurmhealth.history.schema import latest_version
    from tests.unit.history.test_schema_version import _db_at

    config = _config(tmp_path)
    cfg = load_config(str(config), env={})
    _db_at(tmp_path / "history.db", 1)  # a history of an older release
    running = Agent(lambda: (cfg, True), snapshot_max_age_s=600.0)
    assert running.start()
    try:
        answer = client.ask(running.path, "prolog", _env(config, 7))
    finally:
        running.stop()
    conn = sqlite3.connect(tmp_path / "history.db")
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (latest_version(),)
    finally:
        conn.close()
    assert (tmp_path / "history.db.bak-v1").exists()  # backed up first, as every migration
    assert answer["exit_code"] == 0
    assert [r["job_id"] for r in _runs(tmp_path) if r["phase"] == "prolog"][-1] == str(BASE + 7)
    assert not list(tmp_path.glob("*.spool.jsonl"))  # written, not spooled


WRAPPER = Path(__file__).resolve().parents[2] / "prolog" / "slurmhealth-prolog"


@pytest.mark.parametrize("with_agent", [True, False])
def test_through_its_wrapper_the_prolog_logs_each_line_once_in_the_wrappers_format(
    tmp_path: Path, with_agent: bool
) -> None:
    """The hook writes its own lines to the wrappers' log file (stamped and tagged as the
    wrapper stamps its own), so the wrapper starts no logger, date or awk after it: each
    line is there once, whether the agent or the in-process fallback decided."""
    config = _config(tmp_path)
    running = None
    if with_agent:
        cfg = load_config(str(config), env={})
        running = Agent(lambda: (cfg, True), snapshot_max_age_s=600.0)
        assert running.start()
    bin_path = tmp_path / "slurmhealth"
    bin_path.write_text(f'#!/bin/sh\nexec {sys.executable} -m slurmhealth "$@"\n')
    bin_path.chmod(0o755)
    log = tmp_path / "wrapper.log"
    env = _env(config, 40, SLURMHEALTH_BIN=str(bin_path), SLURMHEALTH_LOG_FILE=str(log),
               SLURMHEALTH_ENV_FILE=str(tmp_path / "absent"), TMPDIR=str(tmp_path))  # fmt: skip
    try:
        proc = subprocess.run([str(WRAPPER)], env=env, capture_output=True, text=True,
                              timeout=DEADLINE_S)  # fmt: skip
    finally:
        if running is not None:
            running.stop()
    assert proc.returncode == 0, proc.stderr
    tag = f"slurmhealth-prolog[job={BASE + 40} node=n1]"
    lines = log.read_text().splitlines()
    ok = [
        ln for ln in lines if ln.endswith(": INFO: ok (node agent)" if with_agent else ": INFO: ok")
    ]
    assert len(ok) == 1, lines
    stamp, rest = ok[0].split(" ", 1)
    assert time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ") and rest.startswith(
        f"{tag}: | slurmhealth prolog["
    )
    assert ("node agent not used" in log.read_text()) is not with_agent
    assert ok[0].split(" | ", 1)[1] in proc.stderr  # and on the wrapper's stderr, for slurmd
    assert list(tmp_path.glob("slurmhealth-prolog.*")) == []
