"""Faults while the prolog decides, on the real cluster: the history locked by another
process, slurmctld not answering at drain time. A bad node never runs the job; a healthy
node is never drained; the prolog never reaches the wrapper's timeout; nothing is lost."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.integration.conftest import Cluster
from tests.reliability.support import (
    MARK,
    NVLINK_DOWN_ON_N1,
    ensure_history,
    kept_off,
    next_run_on,
    rows,
    wait_log,
)

# the same, plus GPU 6 that answers only at the snapshot deadline (2 s in the cluster's
# config): a bad node whose prolog decides two seconds after it starts, which leaves time
# to stop slurmctld before the drain call
NVLINK_DOWN_AND_SLOW_ON_N1 = (
    NVLINK_DOWN_ON_N1
    + """
[nodes.n1.gpu.6]
hang = true
hang_s = 4.0
"""
)
LOCK_S = 30.0


@contextlib.contextmanager
def _db_locked(db: Path) -> Iterator[None]:
    """Another process holds an exclusive transaction on ``db`` (for at most LOCK_S)."""
    code = (
        "import sqlite3, sys, time\n"
        "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "c.execute('BEGIN EXCLUSIVE')\n"
        "print('locked', flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(db), str(LOCK_S)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield
    finally:
        holder.kill()
        holder.wait()


@contextlib.contextmanager
def _slurmctld_stopped_when_allocated(cluster: Cluster, job_id: str) -> Iterator[None]:
    """SIGSTOP slurmctld as soon as ``job_id`` leaves PENDING (its prolog is starting):
    every sinfo/squeue/scontrol then waits for an answer that does not come, as with a
    hung or unreachable controller. SIGCONT on exit, always."""
    pid = int((cluster.dir / "run" / "slurmctld.pid").read_text().split()[0])
    deadline = time.monotonic() + 30
    while cluster.job(job_id).get("JobState", "PENDING") == "PENDING":
        assert time.monotonic() < deadline, f"job {job_id} never allocated"
        time.sleep(0.05)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_locked_history_on_a_bad_node_keeps_the_job_off_and_loses_nothing(
    healthy: Cluster,
) -> None:
    ensure_history(healthy, "n1")
    healthy.set_scenario(NVLINK_DOWN_ON_N1)
    offset = len(healthy.log_text())
    with _db_locked(healthy.node_db("n1")):
        job = healthy.sbatch("-w", "n1", "--gres=gpu:8", "--wrap", MARK, wait=False)
        log = wait_log(healthy, offset, job.job_id, ("node unhealthy", "failing open"))
        assert "timed out" not in log and "failing open" not in log, log
        kept_off(healthy, job.job_id, "n1")
        reason = healthy.sinfo_reasons()["n1"]
        assert reason.startswith("slurmhealth: nvlink_inactive gpu3 "), reason
    next_run_on(healthy, "n1")
    db = healthy.node_db("n1")
    runs = rows(db, "select * from check_runs where job_id = ? and phase = 'prolog'", job.job_id)
    assert [r["status"] for r in runs] == ["fail"]
    (drain,) = rows(db, "select * from drains where job_id = ?", job.job_id)
    assert (drain["state"], drain["reason"]) == ("drained", reason)


def test_locked_history_on_a_healthy_node_runs_the_job_and_records_it(healthy: Cluster) -> None:
    ensure_history(healthy, "n1")
    offset = len(healthy.log_text())
    with _db_locked(healthy.node_db("n1")):
        job = healthy.sbatch("-w", "n1", "--gres=gpu:1", "--wrap", MARK)
        assert job.state == "COMPLETED" and (healthy.home / f"ran-{job.job_id}-n1").exists()
        assert healthy.sinfo_reasons() == {}
    log = healthy.log_text()[offset:]
    assert "timed out" not in log and "failing open" not in log, log
    next_run_on(healthy, "n1")
    db = healthy.node_db("n1")
    phases = rows(db, "select phase, status from check_runs where job_id = ?", job.job_id)
    assert sorted((r["phase"], r["status"]) for r in phases) == [("epilog", "ok"), ("prolog", "ok")]


def test_slurmctld_not_answering_at_drain_time_still_keeps_the_job_off(
    healthy: Cluster,
) -> None:
    healthy.set_scenario(NVLINK_DOWN_AND_SLOW_ON_N1)
    offset = len(healthy.log_text())
    job = healthy.sbatch("-w", "n1", "--gres=gpu:8", "--wrap", MARK, wait=False)
    with _slurmctld_stopped_when_allocated(healthy, job.job_id):
        log = wait_log(healthy, offset, job.job_id, ("node unhealthy", "failing open"))
    assert "node unhealthy" in log and "timed out" not in log, log
    kept_off(healthy, job.job_id, "n1")
    sql = "select * from drains where job_id = ? and actor = 'slurmhealth prolog'"
    (drain,) = rows(healthy.node_db("n1"), sql, job.job_id)
    assert drain["state"] == "failed" and drain["reason"].startswith("slurmhealth: ")
    assert "did not answer" in drain["detail"]
    # Slurm took the node out for the failed prolog, with its own reason: not overwritten
    assert not healthy.sinfo_reasons()["n1"].startswith("slurmhealth:")


def test_slurmctld_not_answering_never_drains_a_healthy_node(healthy: Cluster) -> None:
    offset = len(healthy.log_text())
    job = healthy.sbatch("-w", "n1", "--gres=gpu:8", "--wrap", MARK, wait=False)
    with _slurmctld_stopped_when_allocated(healthy, job.job_id):
        log = wait_log(healthy, offset, job.job_id, ("INFO: ok", "failing open", "unhealthy"))
    assert "INFO: ok" in log and "timed out" not in log, log
    done = healthy.wait_job(job.job_id, timeout=60)
    assert done.state == "COMPLETED" and (healthy.home / f"ran-{job.job_id}-n1").exists()
    assert healthy.sinfo_reasons() == {}
    runs = rows(
        healthy.node_db("n1"),
        "select status from check_runs where job_id = ? and phase = 'prolog'",
        job.job_id,
    )
    assert [r["status"] for r in runs] == ["ok"]
