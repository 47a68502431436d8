"""The node agent's one ``squeue -w NODE`` per burst of prologs (Slurm 22.05 gives the
prolog no account or QOS) against the real cluster: a job array's tasks are found by the
id each task's prolog has (SLURM_JOB_ID, unique per task), not by ``123_4``, so a burst of
array tasks shares one call instead of one per task."""

from __future__ import annotations

import subprocess
import time

from slurmhealth.slurm import SlurmCli
from tests.integration.conftest import Cluster


def test_an_arrays_tasks_are_listed_by_the_job_id_their_prologs_have(healthy: Cluster) -> None:
    array = healthy.sbatch("-a", "1-3", "-w", "n1", "--gres=gpu:1", "-o", "/dev/null",
                           "--wrap", "sleep 30", wait=False)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        tasks: dict[str, str] = {}
        while len(tasks) < 3:  # each task's own job id, as scontrol shows it
            out = healthy.scontrol("show", "job", "-o", array.job_id)
            fields = [dict(f.split("=", 1) for f in line.split() if "=" in f)
                      for line in out.splitlines()]  # fmt: skip
            tasks = {f["JobId"]: f.get("ArrayTaskId", "") for f in fields
                     if f.get("JobState") == "RUNNING"}  # fmt: skip
            assert time.monotonic() < deadline, f"array {array.job_id} not running: {out}"
            time.sleep(0.5)
        listed = SlurmCli().jobs_on_node("n1")
        assert set(tasks) <= set(listed), (tasks, sorted(listed))
        for job_id in tasks:
            info = listed[job_id]
            assert info.user == healthy.user and info.account and info.partition, info
            assert info.nodes == "n1" and info.state == "running", info
    finally:
        subprocess.run(["scancel", array.job_id], check=False, timeout=30)
