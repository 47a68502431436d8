"""`report` on a history it cannot read says which file and why, in one line, and leaves
the file as it is (only writers move a corrupt database aside)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmhealth.history import Batch, History


def _report(tmp: Path, db: Path, job: str) -> subprocess.CompletedProcess[str]:
    (tmp / "config.toml").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SLURMHEALTH"))}
    env |= {
        "SLURMHEALTH_CONFIG": str(tmp / "config.toml"),
        "SLURMHEALTH_EVIDENCE_DIR": str(tmp / "evidence"),
        "SLURMHEALTH_NODE_NAME": "n1",
    }
    return subprocess.run([sys.executable, "-m", "slurmhealth", "--db", str(db), "report", job],
                          env=env, capture_output=True, text=True, check=False)  # fmt: skip


def _malformed(db: Path) -> None:
    """A history whose job row survives but whose samples' pages do not."""
    rows = [("samples", {"ts": float(i), "node": "n1", "job_id": "7", "gpu": i % 8,
                         "util_pct": 50.0}) for i in range(5000)]  # fmt: skip
    job = ("jobs", {"job_id": "7", "node": "n1", "user": "root", "uid": 0}, "job_id")
    with History(db) as history:
        history.write(Batch(inserts=rows, upserts=[job]))
    size = db.stat().st_size
    with open(db, "r+b") as fh:
        fh.seek(size // 2)
        fh.write(b"\xff" * (size - size // 2))


@pytest.mark.parametrize("damage", ["not a database", "malformed"])
def test_an_unreadable_history_is_one_line_naming_the_file(tmp_path: Path, damage: str) -> None:
    db = tmp_path / "history.db"
    if damage == "malformed":
        _malformed(db)
    else:
        db.write_bytes(os.urandom(8192))
    before = db.read_bytes()
    proc = _report(tmp_path, db, "7")
    assert proc.returncode == 3, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"slurmhealth: error: history {db} cannot be read: ")
    assert ("malformed" if damage == "malformed" else "file is not a database") in line
    assert db.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if ".corrupt-" in p.name] == []
