"""A job's processes are found by the SLURM_JOB_ID in their environment."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from slurmhealth.sidecar.procs import job_pids


def test_finds_the_jobs_python_processes_only() -> None:
    env = {**os.environ, "SLURM_JOB_ID": "777001"}
    sleeper = [sys.executable, "-c", "import time; time.sleep(30)"]
    job = subprocess.Popen(sleeper, env=env)
    other = subprocess.Popen(sleeper, env={**os.environ, "SLURM_JOB_ID": "777002"})
    shell = subprocess.Popen(["sleep", "30"], env=env)  # not Python: no py-spy stack
    ours = subprocess.Popen([*sleeper, "slurmhealth", "sidecar"], env=env)
    try:
        time.sleep(0.3)
        assert job_pids("777001") == [job.pid]
        assert job_pids("777001", python_only=False) == sorted([job.pid, shell.pid])
        assert job_pids("777002") == [other.pid]
        assert job_pids("999999999") == []
    finally:
        for p in (job, other, shell, ours):
            p.kill()
            p.wait()
