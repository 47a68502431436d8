"""Shared helpers of the history tests: batches, raw reads, concurrent writer processes."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from slurmhealth.history import Batch

REPO = Path(__file__).resolve().parents[3]


def run_batch(run_id: str, ts: float, node: str = "n1", job: str | None = "42") -> Batch:
    run = {"run_id": run_id, "ts": ts, "node": node, "job_id": job, "phase": "prolog",
           "gpus": [0, 1], "status": "fail", "exit_code": 1, "duration_s": 0.5}  # fmt: skip
    finding = {"run_id": run_id, "ts": ts, "node": node, "job_id": job, "check_name": "xid",
               "severity": "fail", "severity_value": 30, "gpu": 1, "message": "Xid 79",
               "action": "drain", "evidence": {"xid": 79}}  # fmt: skip
    return Batch(inserts=[("check_runs", run), ("findings", finding)])


def query(db: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def spooled_run_ids(spool: Path) -> list[str]:
    lines = spool.read_text().splitlines()
    return [Batch.from_json(line).inserts[0][1]["run_id"] for line in lines]


WRITER = """
import os, sys, time
from slurmhealth.history import Batch, History
db, tag, go, n, spool = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
open(f"{go}.{tag}", "w").close()
while not os.path.exists(go):
    time.sleep(0.001)
history, ok = History(db, spool_path=spool or None), 0
for i in range(n):
    run_id = f"{tag}-{i}"
    row = {"run_id": run_id, "ts": time.time(), "node": "n1", "status": "ok"}
    finding = {"run_id": run_id, "ts": row["ts"], "check_name": "c", "severity": "ok"}
    ok += history.write(Batch(inserts=[("check_runs", row), ("findings", finding)]))
print(ok)
"""


def start_writers(
    db: Path, tags: list[str], n: int, spool: Path | None = None
) -> list[subprocess.Popen[str]]:
    """Start one writer process per tag and release them together once all are waiting."""
    go = db.parent.parent / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-c", WRITER, str(db)]
    procs = []
    for tag in tags:
        with open(db.parent.parent / f"stderr.{tag}", "w") as err:  # warnings: one per spool
            cmd = [*argv, tag, str(go), str(n), str(spool or "")]
            procs.append(
                subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
            )
    deadline = time.monotonic() + 30
    while not all(Path(f"{go}.{t}").exists() for t in tags) and time.monotonic() < deadline:
        time.sleep(0.005)
    go.touch()  # all are imported and waiting: start them together
    return procs


def run_writers(db: Path, tags: list[str], n: int) -> list[str]:
    """Run writers to completion; return what each printed (its number of written batches)."""
    procs = start_writers(db, tags, n)
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    errs = [(db.parent.parent / f"stderr.{tag}").read_text()[-2000:] for tag in tags]
    assert [p.returncode for p in procs] == [0] * len(tags), errs
    return outs
