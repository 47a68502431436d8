"""Faults of the per-job sidecar on the real cluster: killed with SIGKILL while its job runs,
and a job's user abusing the task channel. The node is never drained for it, the samples
up to the death are kept (at most one interval lost), the death is recorded by the epilog."""

from __future__ import annotations

import os
import signal
import time

from tests.integration.conftest import Cluster
from tests.reliability.support import rows, wait_rows

INTERVAL_S = 1.0  # [sidecar] interval_s in the cluster's config


def _sidecar_pid(job_id: str, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    argv = fh.read().split(b"\0")
            except OSError:
                continue
            if b"sidecar" in argv and b"--job" in argv and job_id.encode() in argv:
                return int(pid)
        time.sleep(0.1)
    raise AssertionError(f"no sidecar for job {job_id}")


def _samples(cluster: Cluster, node: str, job_id: str) -> list[float]:
    sql = "select ts from samples where job_id = ? order by ts"
    return [r["ts"] for r in rows(cluster.node_db(node), sql, job_id)]


def test_sidecar_killed_mid_job_loses_at_most_one_interval_and_is_recorded(
    healthy: Cluster,
) -> None:
    job = healthy.sbatch("-w", "n1", "--gres=gpu:2", "--wrap", "sleep 12", wait=False)
    healthy.wait_job(job.job_id, states=frozenset({"RUNNING"}), timeout=30)
    pid = _sidecar_pid(job.job_id)
    time.sleep(5 * INTERVAL_S)  # a few samples taken
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    done = healthy.wait_job(job.job_id, timeout=60)
    assert done.state == "COMPLETED", done.record
    assert healthy.sinfo_reasons() == {}
    samples = _samples(healthy, "n1", job.job_id)
    assert samples and max(samples) >= killed_at - 2 * INTERVAL_S, (samples, killed_at)
    sql = "select * from events where job_id = ? and kind = 'sidecar_died'"
    (died,) = wait_rows(healthy.node_db("n1"), sql, job.job_id)  # the detached after-work
    assert str(pid) in died["message"]
    phases = rows(
        healthy.node_db("n1"), "select phase, status from check_runs where job_id = ?", job.job_id
    )
    assert sorted(tuple(r) for r in phases) == [("epilog", "ok"), ("prolog", "ok")]


ABUSE = r"""#!/bin/bash
set -e
dir="$NODES/$SLURMD_NODENAME/run/jobs/$SLURM_JOB_ID"
sleep 2
python3 -c "print('[' * 100000)" > "$dir/steps-0.jsonl"
python3 -c "print('{\"step\": ' + '9' * 400 + '}')" >> "$dir/steps-0.jsonl"
mkfifo "$dir/steps-1.jsonl"
ln -s /etc/shadow "$dir/steps-2.jsonl"
for i in $(seq 3 2002); do
    echo "{\"ts\": $(date +%s), \"rank\": $i, \"step\": 1, \"step_seconds\": 0.1}" \
        > "$dir/steps-$i.jsonl"
done
head -c 50000000 /dev/zero | tr '\0' 'x' > "$dir/steps-2003.jsonl"
sleep 6
touch "$HOME/ran-$SLURM_JOB_ID"
"""


def test_task_channel_abuse_never_kills_the_sidecar_nor_drains_the_node(
    healthy: Cluster,
) -> None:
    script = healthy.home / "abuse.sh"
    script.write_text(ABUSE)
    script.chmod(0o755)
    job = healthy.sbatch(
        "-w", "n2", "--gres=gpu:1", f"--export=ALL,NODES={healthy.dir / 'nodes'}", str(script),
        wait=False,
    )  # fmt: skip
    healthy.wait_job(job.job_id, states=frozenset({"RUNNING"}), timeout=30)
    pid = _sidecar_pid(job.job_id)
    deadline = time.monotonic() + 120
    while not (healthy.home / f"ran-{job.job_id}").exists():  # the abuse is over
        assert time.monotonic() < deadline, "the job never finished its abuse"
        time.sleep(0.2)
    os.kill(pid, 0)  # the sidecar lived through all of it (ProcessLookupError if not)
    done = healthy.wait_job(job.job_id, timeout=120)
    assert done.state == "COMPLETED", (done.record, done.output())
    assert (healthy.home / f"ran-{job.job_id}").exists()
    assert healthy.sinfo_reasons() == {}
    db = healthy.node_db("n2")
    died = rows(db, "select * from events where job_id = ? and kind = 'sidecar_died'", job.job_id)
    assert died == [], [dict(r) for r in died]
    samples = _samples(healthy, "n2", job.job_id)
    assert samples and max(samples) - min(samples) >= 6 * INTERVAL_S, samples  # kept sampling
    log = [ln for ln in healthy.log_text().splitlines() if f"job={job.job_id} " in ln]
    assert not [ln for ln in log if "Traceback" in ln or "died" in ln], log
    assert len([ln for ln in log if "task channel" in ln]) <= 4, log  # one line per kind
