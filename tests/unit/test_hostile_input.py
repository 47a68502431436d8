"""What a job's user controls, used against root (DESIGN.md 5b, docs/threat-model.md):
Slurm environment values that are not UTF-8, and the step folder on /run."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from slurmhealth.hooks.job import clean_env, job_from_env
from slurmhealth.sidecar.task import TaskReader
from tests.support.skips import root_only, unavailable

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


# -- the step folder on /run: the job's user writes it, root's RAM holds it -----------------


def _step(step: int) -> str:
    return json.dumps({"ts": 1.7e9 + step, "rank": 0, "step": step, "step_seconds": 0.5,
                       "samples": 32}) + "\n"  # fmt: skip


@root_only("mounting a tmpfs needs root")
def test_the_step_folder_is_a_tmpfs_of_its_cap(user: str) -> None:
    import pwd
    import shutil
    import tempfile

    from slurmhealth.sidecar.files import make_job_dir, release_job_dir

    uid = pwd.getpwnam(user).pw_uid
    top = Path(tempfile.mkdtemp(prefix="slurmhealth-jobs-"))
    top.chmod(0o755)  # as /run/slurmhealth/jobs: the job's user reaches its own folder
    folder = top / "9"
    try:
        if make_job_dir(str(folder), uid, 1 << 20) != "tmpfs":
            unavailable("no tmpfs mount here (a container without CAP_SYS_ADMIN)")
        assert folder.stat().st_uid == uid and os.path.ismount(folder)
        proc = subprocess.run(["runuser", "-u", user, "--", "dd", "if=/dev/zero",
                               f"of={folder}/fill", "bs=1M", "count=5"],
                              capture_output=True, text=True, check=False)  # fmt: skip
        assert proc.returncode != 0 and "No space left" in proc.stderr, proc.stderr
        assert (folder / "fill").stat().st_size <= 1 << 20
    finally:
        release_job_dir(str(folder))
        assert not folder.exists()
        shutil.rmtree(top)


def test_without_a_tmpfs_the_reader_removes_what_is_over_the_cap(tmp_path: Path) -> None:
    (tmp_path / "steps-0.jsonl").write_text("".join(_step(i) for i in range(1, 11)))
    (tmp_path / "junk.bin").write_bytes(os.urandom(3 << 20))
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "more.bin").write_bytes(os.urandom(1 << 20))
    outside = tmp_path.parent / f"{tmp_path.name}-keep.txt"
    outside.write_text("not the job's folder\n")
    (tmp_path / "link").symlink_to(outside)
    reader = TaskReader(str(tmp_path), None, 1, uid=os.geteuid(), max_dir_bytes=1 << 20)
    stats = reader.read(1.7e9 + 20)
    assert stats is not None and stats.steps_total == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["steps-0.jsonl"]
    assert outside.read_text() == "not the job's folder\n"  # the link went, not its target
    outside.unlink()


def test_a_rank_file_read_to_its_end_is_emptied_and_read_on(tmp_path: Path) -> None:
    from slurmhealth.sidecar.task import COMPACT_BYTES

    path = tmp_path / "steps-0.jsonl"
    n = COMPACT_BYTES // len(_step(1)) + 10
    with open(path, "a") as fh:  # as slurmhealth.job writes it: appending
        fh.write("".join(_step(i) for i in range(1, n + 1)))
        fh.flush()
        reader = TaskReader(str(tmp_path), None, 1, uid=os.geteuid())
        while (stats := reader.read(1.7e9)) is None or stats.steps_total < n:
            pass  # each read takes at most its byte budget
        assert path.stat().st_size == 0  # emptied once all of it was read
        fh.write(_step(n + 1))
        fh.flush()
        stats = reader.read(1.7e9)
    assert stats is not None and stats.steps_total == n + 1
    assert stats.samples_per_second == 64.0  # the window survived the emptying
