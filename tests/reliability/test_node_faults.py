"""Faults of the node under the prolog, on the real cluster: a corrupt history, a full disk,
an NVML that is slow or hangs. A bad node never runs the job; a healthy node is never
drained; what the prolog decided reaches the history (at once or through a spool)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator

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
from tests.support.skips import unavailable

PROLOG_RUN = "select phase, status from check_runs where job_id = ? and phase = 'prolog'"


def _corrupt(cluster: Cluster, node: str) -> None:
    """Garble the node's history where it lies, its -wal and -shm removed. First the last
    job's after-work must be done: a process that holds the history open across the
    garbling checkpoints its WAL into the file when it closes, and so writes the valid
    pages back (seen in CI: the next prolog then found nothing corrupt to move aside)."""
    cluster.wait_after_work(node)
    db = cluster.node_db(node)
    for extra in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{db}{extra}")
    db.write_bytes(b"this is not a database\n" * 512)


def _aside(cluster: Cluster, node: str) -> list[str]:
    return sorted(p.name for p in cluster.node_dir(node).glob("history.db.corrupt-*"))


def _mount_tmpfs(target: str, size: str) -> None:
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", target],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        unavailable(f"cannot mount a tmpfs here ({proc.stderr.strip()}): no full-disk test")


@contextlib.contextmanager
def _disk_full(cluster: Cluster, node: str) -> Iterator[Callable[[], None]]:
    """The node's history folder on a small filesystem filled to the last byte (as
    /var/lib on a node whose disk filled up), its run dir on another one (as /run, a tmpfs).
    Yields ``free()``, which deletes the filler. Everything is put back on exit; what the
    node wrote meanwhile stays on the small filesystem and is dropped with it."""
    cluster.wait_idle()
    home = cluster.node_dir(node)
    staging = cluster.dir / f"staging-{node}"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(home, staging, symlinks=True)
    used = sum(f.stat().st_size for f in staging.rglob("*") if f.is_file())
    _mount_tmpfs(str(home), f"{used // 1024 + 1024}k")
    mounted = [str(home)]
    try:
        shutil.copytree(staging, home, symlinks=True, dirs_exist_ok=True)
        _mount_tmpfs(str(home / "run"), "16m")
        mounted.append(str(home / "run"))
        filler = home / "filler"
        with open(filler, "wb") as fh, contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        with contextlib.suppress(OSError), open(filler, "ab") as fh:
            while True:  # the last partial blocks too
                fh.write(b"\0" * 512)
                fh.flush()
        assert shutil.disk_usage(home).free < 4096, shutil.disk_usage(home)
        yield lambda: filler.unlink(missing_ok=True)
    finally:
        cluster.wait_idle()
        for target in reversed(mounted):
            subprocess.run(["umount", "-l", target], check=False)
        shutil.rmtree(staging, ignore_errors=True)


def test_corrupt_history_on_a_healthy_node_is_moved_aside_and_the_job_runs(
    healthy: Cluster,
) -> None:
    ensure_history(healthy, "n1")
    before = _aside(healthy, "n1")
    _corrupt(healthy, "n1")
    job = healthy.sbatch("-w", "n1", "--gres=gpu:8", "--wrap", MARK)
    assert job.state == "COMPLETED" and (healthy.home / f"ran-{job.job_id}-n1").exists()
    assert healthy.sinfo_reasons() == {}
    assert len(_aside(healthy, "n1")) == len(before) + 1  # kept for forensics
    db = healthy.node_db("n1")
    assert [tuple(r) for r in rows(db, PROLOG_RUN, job.job_id)] == [("prolog", "ok")]
    (count,) = rows(db, "select value from kv where key = 'history_corrupt_total'")
    assert int(count["value"]) >= 1
    assert "is corrupt" in healthy.log_text()


def test_corrupt_history_on_a_bad_node_keeps_the_job_off_and_records_the_drain(
    healthy: Cluster,
) -> None:
    ensure_history(healthy, "n1")
    _corrupt(healthy, "n1")
    healthy.set_scenario(NVLINK_DOWN_ON_N1)
    offset = len(healthy.log_text())
    job = healthy.sbatch("-w", "n1", "--gres=gpu:8", "--wrap", MARK, wait=False)
    log = wait_log(healthy, offset, job.job_id, ("node unhealthy", "failing open"))
    assert "failing open" not in log, log
    kept_off(healthy, job.job_id, "n1")
    reason = healthy.sinfo_reasons()["n1"]
    assert reason.startswith("slurmhealth: nvlink_inactive gpu3 "), reason
    (drain,) = rows(healthy.node_db("n1"), "select * from drains where job_id = ?", job.job_id)
    assert (drain["state"], drain["reason"]) == ("drained", reason)


def test_full_disk_on_a_healthy_node_runs_the_job_and_keeps_the_record(healthy: Cluster) -> None:
    ensure_history(healthy, "n1")
    with _disk_full(healthy, "n1") as free:
        offset = len(healthy.log_text())
        job = healthy.sbatch("-w", "n1", "--gres=gpu:8", "--wrap", MARK)
        assert job.state == "COMPLETED" and (healthy.home / f"ran-{job.job_id}-n1").exists()
        assert healthy.sinfo_reasons() == {}
        log = healthy.log_text()[offset:]
        assert "batch kept in" in log and "record lost" not in log, log
        assert "Traceback" not in log and "died" not in log, log
        free()
        next_run_on(healthy, "n1")
        db = healthy.node_db("n1")
        phases = rows(db, "select phase, status from check_runs where job_id = ?", job.job_id)
        assert sorted(tuple(r) for r in phases) == [("epilog", "ok"), ("prolog", "ok")]
        assert not list((healthy.node_dir("n1") / "run").glob("history.spool.jsonl*"))


def test_full_disk_on_a_bad_node_keeps_the_job_off_and_keeps_the_drain(healthy: Cluster) -> None:
    ensure_history(healthy, "n1")
    with _disk_full(healthy, "n1") as free:
        healthy.set_scenario(NVLINK_DOWN_ON_N1)
        offset = len(healthy.log_text())
        job = healthy.sbatch("-w", "n1", "--gres=gpu:8", "--wrap", MARK, wait=False)
        log = wait_log(healthy, offset, job.job_id, ("node unhealthy", "failing open"))
        assert "failing open" not in log, log
        kept_off(healthy, job.job_id, "n1")
        reason = healthy.sinfo_reasons()["n1"]
        assert reason.startswith("slurmhealth: nvlink_inactive gpu3 "), reason
        free()
        next_run_on(healthy, "n1")
        sql = "select * from drains where job_id = ?"
        (drain,) = rows(healthy.node_db("n1"), sql, job.job_id)
        assert (drain["state"], drain["reason"]) == ("drained", reason)


def test_nvml_call_that_times_out_within_the_deadline_never_drains(healthy: Cluster) -> None:
    """One GPU's NVML calls stall 0.3 s and then answer NVML_ERROR_TIMEOUT: a warning on
    the record, the job runs."""
    healthy.set_scenario('name = "slow"\n[nodes.n1.gpu.6]\nhang = true\nhang_s = 0.3\n')
    job = healthy.sbatch("-w", "n1", "--gres=gpu:8", "--wrap", MARK)
    assert job.state == "COMPLETED" and (healthy.home / f"ran-{job.job_id}-n1").exists()
    assert healthy.sinfo_reasons() == {}
    runs = rows(healthy.node_db("n1"), PROLOG_RUN, job.job_id)
    assert [r["status"] for r in runs] == ["warn"]


def test_nvml_hang_past_the_deadline_drains_naming_the_gpu_and_keeps_the_job_off(
    healthy: Cluster,
) -> None:
    healthy.set_scenario('name = "hung"\n[nodes.n1.gpu.6]\nhang = true\nhang_s = 30.0\n')
    offset = len(healthy.log_text())
    job = healthy.sbatch("-w", "n1", "--gres=gpu:8", "--wrap", MARK, wait=False)
    log = wait_log(healthy, offset, job.job_id, ("node unhealthy", "failing open"))
    assert "failing open" not in log and "timed out" not in log, log
    kept_off(healthy, job.job_id, "n1")
    reason = healthy.sinfo_reasons()["n1"]
    assert reason.startswith("slurmhealth: gpu_unresponsive gpu6 "), reason
