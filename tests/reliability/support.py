"""What the reliability tests share: a job's only effect, reads of a node's history, and
waits for what the prolog decided (the wrappers' log, a requeue, a drain)."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from pathlib import Path

from tests.integration.conftest import Cluster

NVLINK_DOWN_ON_N1 = """
name = "n1-nvlink-down"
[nodes.n1.gpu.3]
nvlink.7.state = "inactive"
"""
MARK = 'touch "$HOME/ran-$SLURM_JOB_ID-$SLURMD_NODENAME"'  # the job's only effect


def rows(db: Path, sql: str, *params: object) -> list[sqlite3.Row]:
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
        conn.row_factory = sqlite3.Row
        return list(conn.execute(sql, params))


def wait_rows(db: Path, sql: str, *params: object, timeout: float = 30) -> list[sqlite3.Row]:
    """The rows of ``sql`` once there are any: what the epilog's detached after-work writes
    (a dead sidecar's event, the job's summary) lands after the job has ended."""
    deadline = time.monotonic() + timeout
    while not (found := rows(db, sql, *params) if db.exists() else []):
        assert time.monotonic() < deadline, f"no rows after {timeout:g} s: {sql} {params}"
        time.sleep(0.1)
    return found


def wait_log(cluster: Cluster, offset: int, job_id: str, words: tuple[str, ...]) -> str:
    """The wrappers' log lines about ``job_id`` since ``offset``, once one holds any of
    ``words`` (the prolog's last line)."""
    deadline = time.monotonic() + 30
    while True:
        lines = [ln for ln in cluster.log_text()[offset:].splitlines() if f"job={job_id} " in ln]
        if any(w in ln for ln in lines for w in words):
            return "\n".join(lines)
        assert time.monotonic() < deadline, f"no prolog outcome for job {job_id}:\n{lines}"
        time.sleep(0.1)


def ensure_history(cluster: Cluster, node: str) -> None:
    if not cluster.node_db(node).exists():
        job = cluster.sbatch("-w", node, "--gres=gpu:1", "--wrap", "true")
        assert job.state == "COMPLETED"


def next_run_on(cluster: Cluster, node: str) -> None:
    """A later job on ``node`` (healthy again): its prolog ingests what was spooled."""
    cluster.wait_idle()
    cluster.set_scenario("healthy")
    cluster.resume_all()
    assert cluster.sbatch("-w", node, "--gres=gpu:1", "--wrap", "true").state == "COMPLETED"


def kept_off(cluster: Cluster, job_id: str, node: str) -> None:
    """The job did not run on ``node``: never started there, requeued (once Slurm has run
    the epilog of the failed launch), node out."""
    deadline = time.monotonic() + 30
    record = cluster.job(job_id)
    while record.get("JobState") != "PENDING" or int(record.get("Restarts", "0")) < 1:
        assert time.monotonic() < deadline, f"job {job_id} not requeued: {record}"
        time.sleep(0.2)
        record = cluster.job(job_id)
    assert not (cluster.home / f"ran-{job_id}-{node}").exists()
    deadline = time.monotonic() + 20
    while node not in cluster.sinfo_reasons():
        assert time.monotonic() < deadline, f"{node} not drained: {cluster.node_states()}"
        time.sleep(0.2)
