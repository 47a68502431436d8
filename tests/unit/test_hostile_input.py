"""What a job's user controls, used against root (DESIGN.md 5b, docs/threat-model.md):
Slurm environment values that are not UTF-8, and files in the places root reads."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from slurmhealth.hooks.job import clean_env, job_from_env

BAD = os.fsdecode(b"gpu-\xff\xfe-part")  # how Python hands a non-UTF-8 value over


def test_invalid_utf8_in_the_environment_becomes_replacement_characters() -> None:
    job = job_from_env({"SLURM_JOB_ID": "5", "SLURM_JOB_PARTITION": BAD,
                        "SLURM_JOB_USER": os.fsdecode(b"\xc3")}, "n1")  # fmt: skip
    assert job.partition == "gpu-\ufffd\ufffd-part"
    assert job.user == "\ufffd"
    job.partition.encode()  # what crashed the prolog: UnicodeEncodeError
    assert clean_env({"HOME": BAD})["HOME"] == BAD  # not Slurm's: left as it came


def test_prolog_with_invalid_utf8_partition_runs_and_records_the_job(
    sim_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    env = sim_env()
    with open(env["SLURMHEALTH_CONFIG"], "a") as fh:
        fh.write("[sidecar]\nenabled = false\n")
    env.update(SLURM_JOB_ID="31", SLURM_JOB_UID=str(os.getuid()), SLURM_JOB_USER="alice",
               SLURM_JOB_ACCOUNT="a", SLURM_JOB_COMMENT="", SLURM_JOB_GPUS="0,1",
               SLURMD_NODENAME="node1", SLURM_JOB_PARTITION=BAD, SLURM_JOB_NAME=BAD,
               SLURM_SCRIPT_CONTEXT="prolog_slurmd")  # fmt: skip
    proc = subprocess.run([sys.executable, "-m", "slurmhealth", "prolog"], env=env,
                          capture_output=True, timeout=120, check=False)  # fmt: skip
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "internal error" not in err, err
    assert "SLURM_JOB_PARTITION" in err  # one warning names what was changed
    with sqlite3.connect(env["SLURMHEALTH_DB"]) as db:
        rows = db.execute("SELECT partition FROM jobs WHERE job_id = '31'").fetchall()
    assert rows == [("gpu-\ufffd\ufffd-part",)]
