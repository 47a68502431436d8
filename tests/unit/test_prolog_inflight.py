"""A prolog the wrapper kills still leaves a record: its marker in the node's run dir is
turned into a ``failopen`` check run by the next prolog, naming the stage it died in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from slurmhealth.hooks.budget import Budget
from slurmhealth.hooks.inflight import InFlight, killed_runs
from tests.unit.test_hooks_decisions import JOB, RecordingSlurm, _cluster, _rows
from tests.unit.test_prolog_budget import _prolog

KILLED = """
import os, sys
from slurmhealth.hooks.inflight import InFlight
marker = InFlight(sys.argv[1], "4100", "n1")
marker.stage("gpu snapshot", 6.25)
os._exit(137)  # killed: no finally, no done()
"""


def _killed_prolog(run_dir: Path) -> None:
    subprocess.run([sys.executable, "-c", KILLED, str(run_dir)], check=False, timeout=60)


def test_a_killed_prolog_becomes_a_failopen_run_naming_its_stage(tmp_path: Path) -> None:
    _killed_prolog(tmp_path / "run")
    (row,) = killed_runs(str(tmp_path / "run"), "sim")
    assert (row["job_id"], row["node"], row["status"], row["phase"]) == (
        "4100",
        "n1",
        "failopen",
        "prolog",
    )
    assert "'gpu snapshot'" in row["error"] and "6.25 s" in row["error"]
    assert killed_runs(str(tmp_path / "run"), "sim") == []  # recorded once


def test_a_prolog_still_running_is_left_alone(tmp_path: Path) -> None:
    marker = InFlight(str(tmp_path / "run"), "4101", "n1")
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        text = Path(marker.path).read_text().replace(f'"pid": {marker.doc["pid"]}',
                                                     f'"pid": {sleeper.pid}')  # fmt: skip
        Path(marker.path).write_text(text)
        assert killed_runs(str(tmp_path / "run"), "sim") == []
    finally:
        sleeper.kill()
        sleeper.wait()
    marker.done()
    assert list((tmp_path / "run").iterdir()) == []


def test_a_planted_symlink_is_neither_written_through_nor_read(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    target = tmp_path / "root-only-file"
    target.write_text("keep me")
    (run / "prolog.4102.inflight").symlink_to(target)
    marker = InFlight(str(run), "4102", "n1")
    marker.stage("checks", 0.5)
    marker.done()
    assert target.read_text() == "keep me"
    assert killed_runs(str(run), "sim") == []


def test_the_next_prolog_records_the_killed_one(tmp_path: Path) -> None:
    _killed_prolog(tmp_path / "run")
    result = _prolog(tmp_path, "healthy", RecordingSlurm(_cluster()), Budget(5.0))
    assert result.exit_code == 0
    runs = {r["job_id"]: r for r in _rows(tmp_path / "history.db", "check_runs")}
    assert runs[JOB]["status"] == "ok"
    assert runs["4100"]["status"] == "failopen" and "killed" in runs["4100"]["error"]
