"""The real sidecar keeps its samples through a kill -9 (at most the interval in progress
is lost) and through a database locked when it stops (they wait in the spool), and logs
its start, stop and death with the job id. No test here waits on the clock: each waits for
a condition, with generous deadlines, so a loaded machine only makes it slower."""

from __future__ import annotations

import errno
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurmhealth.config import Config, load_config
from slurmhealth.history import History
from slurmhealth.model_records import Job
from slurmhealth.sidecar import run as sidecar_run
from slurmhealth.sidecar.lifecycle import stop_sidecar
from slurmhealth.sidecar.run import Sidecar
from tests.support.sim_config import sidecar_config, sidecar_env

HEALTHY = """
name = "healthy"
[all_gpus]
utilization_gpu = 90
clock_event_reasons = []
"""
DEADLINE_S = 120.0


def _config(tmp: Path, stop_grace_s: float = 2.0) -> Path:
    return sidecar_config(tmp, HEALTHY, flush_every=10000, stop_grace_s=stop_grace_s)


def _start(tmp: Path, job: str) -> subprocess.Popen[bytes]:
    env = sidecar_env(_config(tmp), SLURM_JOB_ID=job)
    with open(tmp / "stderr", "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "slurmhealth", "sidecar", "--job", job, "--gpus", "0-7"],
            env=env,
            stderr=err,
        )


def _wait_for(what: str, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not ready():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.1)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _buffer(tmp: Path, pid: int) -> Path:
    return tmp / "db" / f"history.db.spool.jsonl.buffer.{pid}"


def _samples(tmp: Path) -> int:
    with sqlite3.connect(tmp / "db" / "history.db") as conn:
        return int(conn.execute("select count(*) from samples").fetchone()[0])


def _leftovers(tmp: Path) -> list[str]:
    return sorted(p.name for p in (tmp / "db").iterdir() if ".buffer." in p.name
                  or ".ingesting." in p.name)  # fmt: skip


def test_kill_9_keeps_every_interval_before_it_and_the_epilog_notices(tmp_path: Path) -> None:
    proc = _start(tmp_path, "601")
    buffer = _buffer(tmp_path, proc.pid)
    _wait_for("three intervals on disk", lambda: len(_lines(buffer)) >= 3)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    on_disk = len(_lines(buffer))  # every interval it finished before it died
    assert _samples(tmp_path) == 0  # flush_every 10000: none reached the db by itself

    cfg = load_config(str(tmp_path / "config.toml"), env={})
    outcome = stop_sidecar(cfg, "node1", "601")  # what the epilog does

    assert outcome == f"sidecar {proc.pid} died before the epilog"
    assert _samples(tmp_path) == 8 * on_disk  # 8 GPUs per interval, nothing lost
    with sqlite3.connect(tmp_path / "db" / "history.db") as conn:
        died = conn.execute("select job_id, node from events where kind = 'sidecar_died'")
        assert died.fetchall() == [("601", "node1")]
    assert _leftovers(tmp_path) == []
    assert not (tmp_path / "run" / "sidecar-601.pid").exists()


def test_locked_db_at_stop_keeps_the_samples_in_the_spool(tmp_path: Path) -> None:
    proc = _start(tmp_path, "602")
    _wait_for("two intervals on disk", lambda: len(_lines(_buffer(tmp_path, proc.pid))) >= 2)
    locker = sqlite3.connect(tmp_path / "db" / "history.db", isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        spool = tmp_path / "db" / "history.db.spool.jsonl"
        spooled = _lines(spool)
        assert spooled and _leftovers(tmp_path) == []  # no buffer, no stale claim
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert _samples(tmp_path) == 0
    with History(tmp_path / "db" / "history.db") as history:
        assert history.ingest_spool() == len(spooled)
    assert _samples(tmp_path) >= 8 * 2 and not spool.exists()
    log = (tmp_path / "stderr").read_text()
    assert f"job 602 node node1: sidecar {proc.pid} started for GPUs 0,1,2,3,4,5,6,7" in log
    assert f"job 602 node node1: sidecar {proc.pid} stopped (SIGTERM)" in log


@pytest.fixture
def keep_signal_handlers() -> Iterator[None]:
    """An in-process sidecar installs its own SIGTERM/SIGINT/SIGHUP handlers."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _in_process(tmp: Path, job: str) -> tuple[Config, Sidecar]:
    cfg = load_config(str(_config(tmp)), env={})
    return cfg, Sidecar(cfg, Job(job_id=job, node="node1"), (0, 1))


@pytest.mark.usefixtures("keep_signal_handlers")
def test_a_full_disk_at_start_is_logged_with_the_job_and_leaves_no_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _, sidecar = _in_process(tmp_path, "603")
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path / "run")):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(sidecar_run.os, "write", full)
    with caplog.at_level(logging.INFO, logger="slurmhealth.sidecar"):
        assert sidecar.run() == 1
    died = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(died) == 1 and died[0].startswith(f"job 603 node node1: sidecar {os.getpid()}")
    assert "died: OSError" in died[0] and "No space left" in died[0]
    assert list((tmp_path / "run").iterdir()) == []  # no pid file, no .tmp
