"""`slurmhealth healthcheck` (slurm.conf's HealthCheckProgram): the decision over a recording
Slurm backend, the simulated NVML library, a history in tmp_path and a scripted answer of
the local slurmd; then the command as slurmd runs it.

Slurm's side (slurmd running it every HealthCheckInterval, the drain showing in sinfo) is
the integration tests' part."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Sequence
from pathlib import Path

import pytest

from slurmhealth.errors import SchemaTooNew
from slurmhealth.history import History
from slurmhealth.hooks.healthcheck import HealthcheckResult, run_healthcheck
from slurmhealth.hooks.prolog import Adapters
from slurmhealth.slurm import REASON_PREFIX, NodeInfo, parse_listpids
from tests.conftest import run_cli
from tests.support.recording_slurm import RecordingSlurm
from tests.unit.test_hooks_decisions import NODE, _cluster, _config, _gpu, _rows

LISTPIDS_HEADER = "PID      JOBID    STEPID   LOCALID GLOBALID\n"


def _run(
    tmp_path: Path,
    scenario: str,
    slurm: RecordingSlurm,
    *answers: Sequence[str] | None,
    **flags: object,
) -> HealthcheckResult:
    """One health check; ``answers``: what the local slurmd says of the node's jobs, call
    after call (the last one repeats; default: no jobs)."""
    cfg = _config(tmp_path, scenario, **flags)
    said = list(answers or [[]])

    def local_jobs() -> Sequence[str] | None:
        return said.pop(0) if len(said) > 1 else said[0]

    with History(tmp_path / "history.db", spool_path=tmp_path / "spool.jsonl") as history:
        adapters = Adapters(slurm, lambda _timeout: _gpu(cfg, tmp_path), history)
        return run_healthcheck(cfg, NODE, adapters, local_jobs)


def test_healthy_idle_node_is_checked_in_full_and_left_alone(tmp_path: Path) -> None:
    slurm = RecordingSlurm(_cluster())
    result = _run(tmp_path, "healthy", slurm)
    assert (result.check.status, result.idle, result.skipped, result.drain) == (
        "ok", True, (), None)  # fmt: skip
    assert slurm.drains == [] and slurm.resumes == []
    (run,) = _rows(tmp_path / "history.db", "check_runs")
    assert (run["phase"], run["status"], run["job_id"]) == ("healthcheck", "ok", None)
    assert json.loads(run["gpus"]) == list(range(8))  # every GPU, not a job's


def test_gpu_failing_on_an_idle_node_drains_it_with_the_prologs_reason(tmp_path: Path) -> None:
    slurm = RecordingSlurm(_cluster())
    result = _run(tmp_path, "nvlink-down", slurm)
    ((node, reason),) = slurm.drains
    assert node == NODE and reason.startswith(f"{REASON_PREFIX} nvlink_inactive gpu3 ")
    assert result.drain is not None and result.drain.state == "drained"
    (row,) = _rows(tmp_path / "history.db", "drains")
    assert (row["state"], row["reason"], row["actor"]) == (
        "drained", reason, "slurmhealth healthcheck")  # fmt: skip
    assert row["run_id"] == result.check.run_id and row["job_id"] is None


def test_leftovers_drain_an_idle_node(tmp_path: Path) -> None:
    slurm = RecordingSlurm(_cluster())
    _run(tmp_path, "stale-process", slurm)
    ((_, reason),) = slurm.drains
    assert reason.startswith(f"{REASON_PREFIX} stale_job gpu2 ")


@pytest.mark.parametrize(
    "answers",
    [(["77"],), (None,), ([], ["77"])],
    ids=["job-running", "slurmd-silent", "job-started-during-the-check"],
)
def test_a_running_jobs_own_processes_are_never_taken_for_leftovers(
    tmp_path: Path, answers: tuple[Sequence[str] | None, ...]
) -> None:
    slurm = RecordingSlurm(_cluster())
    result = _run(tmp_path, "stale-process", slurm, *answers)
    assert slurm.drains == [] and result.check.status == "ok"
    assert result.skipped == ("stale_job", "mig_instance") and not result.idle
    (note,) = [n for n in result.check.notes if "skipped" in n]
    assert "stale_job" in note and ("77" in note if answers[-1] else "did not say" in note)
    (run,) = _rows(tmp_path / "history.db", "check_runs")
    assert run["phase"] == "healthcheck"


def test_a_busy_node_is_still_drained_for_a_broken_gpu(tmp_path: Path) -> None:
    slurm = RecordingSlurm(_cluster())
    result = _run(tmp_path, "ecc-uncorrectable", slurm, ["77"])
    ((_, reason),) = slurm.drains  # DRAIN: the running job finishes, no new one starts
    assert reason.startswith(f"{REASON_PREFIX} ecc_uncorrectable gpu1 ")
    assert result.jobs == ("77",)


def test_circuit_breaker_suppresses_and_records(tmp_path: Path) -> None:
    slurm = RecordingSlurm(_cluster(n5=f"{REASON_PREFIX} gpu_lost gpu0"))
    _run(tmp_path, "nvlink-down", slurm, **{"policy.drain_max_share": 0.1})
    assert slurm.drains == []
    (row,) = _rows(tmp_path / "history.db", "drains")
    assert row["state"] == "suppressed" and "circuit breaker" in row["detail"]


def test_an_admins_drain_is_kept_and_not_recorded_each_interval(tmp_path: Path) -> None:
    slurm = RecordingSlurm(_cluster(n1="rack 7 maintenance"))
    for _ in range(2):
        result = _run(tmp_path, "nvlink-down", slurm)
        assert result.drain is not None and result.drain.state == "held"
    assert slurm.drains == [] and slurm.table[NODE].reason == "rack 7 maintenance"
    assert _rows(tmp_path / "history.db", "drains") == []
    assert len(_rows(tmp_path / "history.db", "check_runs")) == 2


def test_a_node_it_drained_is_never_resumed_when_healthy_again(tmp_path: Path) -> None:
    ours = NodeInfo(NODE, "drained", f"{REASON_PREFIX} nvlink_inactive gpu3", "root", 1.0)
    slurm = RecordingSlurm([ours, *_cluster()[1:]])
    result = _run(tmp_path, "healthy", slurm)
    assert result.check.status == "ok" and result.drain is None
    assert slurm.resumes == [] and slurm.table[NODE].drained


def test_a_history_of_a_newer_release_is_refused_before_anything_runs(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "history.db")
    conn.execute("PRAGMA user_version = 999")
    conn.close()
    slurm = RecordingSlurm(_cluster())
    with pytest.raises(SchemaTooNew):
        _run(tmp_path, "nvlink-down", slurm)
    assert slurm.drains == []


def test_listpids_answers() -> None:
    none = "No job steps exist on this node.\n"
    assert parse_listpids(1, LISTPIDS_HEADER, none) == []
    rows = "4711 77 batch 0 0\n4712 77 0 0 0\n-1 80 extern 0 0\n"
    assert parse_listpids(0, LISTPIDS_HEADER + rows, "") == ["77", "80"]
    unknown_node = "scontrol: error: Domain socket directory /x/n9: No such file\n" + none
    assert parse_listpids(1, LISTPIDS_HEADER, unknown_node) is None
    assert parse_listpids(0, LISTPIDS_HEADER, "") is None  # exit 0 without a row: unsure
    assert parse_listpids(0, "something else\n", "") is None


@pytest.fixture
def slurmd_idle(tmp_path: Path) -> str:
    """A PATH whose scontrol answers like a slurmd without jobs (listpids only)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "scontrol"
    fake.write_text(f"#!/bin/sh\nprintf '{LISTPIDS_HEADER}'\necho 'No job steps exist on this "
                    "node.' >&2\nexit 1\n")  # fmt: skip
    fake.chmod(0o755)
    return f"{bin_dir}:{os.environ.get('PATH', '')}"


def test_command_prints_versioned_json_and_exits_0(sim_env, slurmd_idle: str) -> None:
    proc = run_cli("healthcheck", "--json", env=sim_env("healthy", PATH=slurmd_idle))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert (data["schema"], data["phase"], data["status"]) == (
        "slurmhealth.healthcheck/1", "healthcheck", "ok")  # fmt: skip
    assert data["jobs"] == [] and data["drain"] is None


def test_command_fails_open_in_one_line(sim_env, slurmd_idle: str, tmp_path: Path) -> None:
    env = sim_env("nvlink-down", PATH=slurmd_idle)
    assert run_cli("history", env=env).returncode == 0  # the history exists
    conn = sqlite3.connect(tmp_path / "history.db")
    conn.execute("PRAGMA user_version = 999")
    conn.close()
    proc = run_cli("healthcheck", env=env)
    assert proc.returncode == 0 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert "slurmhealth healthcheck" in line and "schema version 999" in line
    assert "node left as it is" in line


WRAPPER = Path(__file__).resolve().parents[2] / "healthcheck" / "slurmhealth-healthcheck"


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("echo 'slurmhealth healthcheck[node=n1]: INFO: fail; drained: x' >&2; exit 0",
         "drained: x"),
        ("exit 3", "exited 3 (internal error); ignoring"),
        ("exec sleep 30", "timed out after 1s; ignoring"),
    ],
    ids=["drained", "crashed", "hung"],
)  # fmt: skip
def test_wrapper_always_exits_0_and_logs(tmp_path: Path, body: str, said: str) -> None:
    """slurmd acts on nothing but a 0 (a newer one holds the node's registration for it)."""
    import subprocess

    fake = tmp_path / "slurmhealth"
    fake.write_text(f'#!/bin/sh\n[ "$1" = healthcheck ] || exit 9\n{body}\n')
    fake.chmod(0o755)
    log = tmp_path / "wrapper.log"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURMD_NODENAME": "n1",
           "SLURMHEALTH_ENV_FILE": str(tmp_path / "absent"), "SLURMHEALTH_BIN": str(fake),
           "SLURMHEALTH_HEALTHCHECK_TIMEOUT": "1", "SLURMHEALTH_LOG_FILE": str(log),
           "TMPDIR": str(tmp_path)}  # fmt: skip
    proc = subprocess.run([str(WRAPPER)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0
    assert said in log.read_text() and "slurmhealth-healthcheck[node=n1]" in log.read_text()
    assert list(tmp_path.glob("slurmhealth-healthcheck.*")) == []
