"""The prolog/epilog decision table and the circuit breaker, over a recording Slurm backend,
the simulated NVML library and a history in tmp_path.

Slurm's own behaviour (the drain taking effect, the requeue, the held job) is tested on the
real cluster in tests/integration; here every branch of our decision is: exit code, the
drain calls with their reasons, and the rows a user later reads with `slurmhealth history`.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from slurmhealth.config import Config, load_config
from slurmhealth.gpu import GpuBackend
from slurmhealth.gpu.nvml import NvmlBackend
from slurmhealth.gpu.scenario import load_scenario
from slurmhealth.gpu.sim import SimulatedNvml
from slurmhealth.history import Batch, History
from slurmhealth.hooks.job import job_from_env
from slurmhealth.hooks.prolog import Adapters, HookResult, run_hook
from slurmhealth.hooks.resume import resume
from slurmhealth.slurm import REASON_PREFIX, Job, NodeInfo
from tests.support.db_rows import table_rows
from tests.support.recording_slurm import CTLD_DOWN, JOB, RecordingSlurm
from tests.support.sim_config import hook_flags

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
NODE = "n1"


@pytest.fixture(scope="module")
def migrated_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty history with its schema, made once: each test starts from a copy."""
    path = tmp_path_factory.mktemp("template") / "history.db"
    with History(path) as history:
        assert history.write(Batch())
    return path


@pytest.fixture(autouse=True)
def _node_history(tmp_path: Path, migrated_db: Path) -> None:
    shutil.copy(migrated_db, tmp_path / "history.db")


def _cluster(size: int = 10, **drained: str) -> list[NodeInfo]:
    """``size`` idle nodes n1..; ``drained`` maps a node to its drain reason."""
    nodes = [NodeInfo(f"n{i}", "idle") for i in range(1, size + 1)]
    return [
        NodeInfo(n.name, "drained", drained[n.name], "root", 1.0e9) if n.name in drained else n
        for n in nodes
    ]


def _config(tmp_path: Path, scenario: str, **flags: Any) -> Config:
    cfg_file = tmp_path / "config.toml"
    cfg_file.write_text("")
    scenario_path = SCENARIOS / f"{scenario}.toml"
    return load_config(
        str(cfg_file), env={}, flags={**hook_flags(tmp_path, scenario_path), **flags}
    )


def _gpu(cfg: Config, tmp_path: Path, timeout_s: float = 1.0) -> GpuBackend:
    lib = SimulatedNvml(
        load_scenario(cfg.gpu.sim_scenario), NODE, kernel_log_path=str(tmp_path / "kmsg")
    )
    return NvmlBackend(lib, node=NODE, timeout_s=timeout_s)


def job_env(**env: str) -> dict[str, str]:
    """What slurmd passes the prolog of job JOB on NODE (all 8 GPUs), plus ``env``."""
    return {
        "SLURM_JOB_ID": JOB,
        "SLURMD_NODENAME": NODE,
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_UID": "1000",
        "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7",
        **env,
    }


def _hook(
    cfg: Config,
    tmp_path: Path,
    slurm: RecordingSlurm,
    phase: str = "prolog",
    *,
    db: Path | None = None,
    **env: str,
) -> HookResult:
    environ = job_env(**env)
    history = History(db or tmp_path / "history.db", spool_path=tmp_path / "spool.jsonl")
    adapters = Adapters(slurm, lambda _timeout: _gpu(cfg, tmp_path), history)
    try:
        return run_hook(cfg, job_from_env(environ, NODE), environ, phase, adapters)
    finally:
        history.close()


_rows = table_rows


def _drain_rows(tmp_path: Path) -> list[dict[str, Any]]:
    return _rows(tmp_path / "history.db", "drains")


def test_healthy_node_runs_the_job_and_records_it(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "healthy")
    slurm = RecordingSlurm(_cluster())
    result = _hook(cfg, tmp_path, slurm)
    assert (result.exit_code, result.status, result.drain) == (0, "ok", None)
    assert slurm.drains == []
    (run,) = _rows(tmp_path / "history.db", "check_runs")
    assert (run["phase"], run["status"], run["job_id"]) == ("prolog", "ok", JOB)
    assert _rows(tmp_path / "history.db", "findings") == []
    (job,) = _rows(tmp_path / "history.db", "jobs")  # completed by the one squeue call
    assert (job["state"], job["account"], job["qos"]) == ("running", "physics", "normal")
    assert _drain_rows(tmp_path) == []


def test_warning_only_runs_the_job_without_drain(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "pcie-downgraded")
    slurm = RecordingSlurm(_cluster())
    result = _hook(cfg, tmp_path, slurm)
    assert (result.exit_code, result.status, result.drain) == (0, "warn", None)
    assert slurm.drains == []
    findings = _rows(tmp_path / "history.db", "findings")
    assert [(f["check_name"], f["severity"], f["gpu"]) for f in findings] == [
        ("pcie_link", "warn", 4)
    ]
    assert _drain_rows(tmp_path) == []


def test_failing_gpu_drains_with_our_reason_and_requeues(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "nvlink-down")
    slurm = RecordingSlurm(_cluster())
    result = _hook(cfg, tmp_path, slurm)
    assert (result.exit_code, result.status) == (1, "fail")
    ((node, reason),) = slurm.drains
    assert node == NODE and reason.startswith(f"{REASON_PREFIX} nvlink_inactive gpu3 ")
    assert slurm.table[NODE].drained  # the recorder's own view: the node is out
    (row,) = _drain_rows(tmp_path)
    assert (row["state"], row["reason"], row["actor"]) == ("drained", reason, "slurmhealth prolog")
    assert row["run_id"] == result.run_id


def test_node_drained_by_an_admin_keeps_their_reason(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "nvlink-down")
    slurm = RecordingSlurm(_cluster(n1="rack 7 maintenance"))
    result = _hook(cfg, tmp_path, slurm)
    assert result.exit_code == 1  # the job is kept off the node it cannot use
    assert slurm.drains == []
    assert slurm.table[NODE].reason == "rack 7 maintenance"
    (row,) = _drain_rows(tmp_path)
    assert row["state"] == "held" and "rack 7 maintenance" in row["detail"]


def test_circuit_breaker_open_records_without_draining(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "nvlink-down", **{"policy.drain_max_share": 0.1})  # 1 of 10
    slurm = RecordingSlurm(_cluster(n5=f"{REASON_PREFIX} ecc_uncorrectable gpu1 DBE"))
    result = _hook(cfg, tmp_path, slurm)
    assert (result.exit_code, result.status) == (0, "fail")
    assert slurm.drains == []
    (row,) = _drain_rows(tmp_path)
    assert row["state"] == "suppressed" and row["reason"].startswith(REASON_PREFIX)
    assert "circuit breaker" in row["detail"] and "n5" in row["detail"]


def test_circuit_breaker_undoes_a_drain_that_lost_the_race(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "nvlink-down")
    slurm = RecordingSlurm(_cluster())
    racer = NodeInfo("n2", "drained", f"{REASON_PREFIX} gpu_lost gpu0", "root", 1.0)
    original = slurm.drain

    def drain_while_n2_drains(node: str, reason: str) -> None:
        original(node, reason)
        slurm.table["n2"] = racer  # another prolog drained first, at the same moment

    slurm.drain = drain_while_n2_drains  # type: ignore[method-assign]
    result = _hook(cfg, tmp_path, slurm)
    assert result.exit_code == 0 and slurm.resumes == [NODE]
    (row,) = _drain_rows(tmp_path)
    assert row["state"] == "suppressed" and "undone" in row["detail"]


def test_job_opted_out_is_skipped_without_touching_the_gpus(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "nvlink-down")
    slurm = RecordingSlurm(_cluster())
    slurm.jobs[JOB] = Job(JOB, user="alice", comment="benchmark slurmhealth=off")

    def no_gpu(timeout_s: float) -> GpuBackend:
        raise AssertionError("an opted-out job must not open the GPUs")

    history = History(tmp_path / "history.db")
    environ = {"SLURM_JOB_ID": JOB, "SLURMD_NODENAME": NODE}
    try:
        result = run_hook(
            cfg, job_from_env(environ, NODE), environ, "prolog", Adapters(slurm, no_gpu, history)
        )
    finally:
        history.close()
    assert (result.exit_code, result.status) == (0, "skipped")
    assert slurm.drains == []
    (run,) = _rows(tmp_path / "history.db", "check_runs")
    assert run["status"] == "skipped" and "slurmhealth=off" in run["error"]
    (job,) = _rows(tmp_path / "history.db", "jobs")
    assert job["state"] == "running (slurmhealth off)"


def test_warn_mode_records_but_never_drains(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "nvlink-down", **{"policy.mode": "warn"})
    slurm = RecordingSlurm(_cluster())
    result = _hook(cfg, tmp_path, slurm)
    assert (result.exit_code, result.status) == (0, "fail")
    assert slurm.drains == []
    (row,) = _drain_rows(tmp_path)
    assert row["state"] == "policy_warn" and row["reason"].startswith(
        f"{REASON_PREFIX} nvlink_inactive gpu3 "
    )


@pytest.mark.parametrize(
    "fail", [("drain",), ("nodes", "drain", "job")], ids=["drain-call", "slurmctld-down"]
)
def test_drain_that_fails_still_keeps_the_job_off(tmp_path: Path, fail: tuple[str, ...]) -> None:
    """Exit 1 lets Slurm drain the node with its own reason; our finding is recorded."""
    cfg = _config(tmp_path, "nvlink-down")
    slurm = RecordingSlurm(_cluster(), fail=fail)
    result = _hook(cfg, tmp_path, slurm)
    assert (result.exit_code, result.status) == (1, "fail")
    assert not slurm.table[NODE].drained
    (row,) = _drain_rows(tmp_path)
    assert row["state"] == "failed" and CTLD_DOWN in row["detail"]
    findings = _rows(tmp_path / "history.db", "findings")
    assert [(f["check_name"], f["gpu"]) for f in findings] == [("nvlink_inactive", 3)]


def test_unwritable_history_still_decides_and_spools(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "nvlink-down")
    slurm = RecordingSlurm(_cluster())
    (tmp_path / "blocked").write_text("a file where the history's directory should be")
    result = _hook(cfg, tmp_path, slurm, db=tmp_path / "blocked" / "history.db")
    assert result.exit_code == 1
    assert [node for node, _ in slurm.drains] == [NODE]
    with History(tmp_path / "history.db", spool_path=tmp_path / "spool.jsonl") as later:
        assert later.ingest_spool() == 1  # the check run and its drain: one batch
    (run,) = _rows(tmp_path / "history.db", "check_runs")
    assert (run["status"], run["job_id"]) == ("fail", JOB)
    (row,) = _drain_rows(tmp_path)
    assert (row["state"], row["reason"]) == ("drained", slurm.drains[0][1])


def _checked_before(tmp_path: Path) -> None:
    """A node slurmhealth checked before the fault: its kernel-log position is stored, so a
    fault logged after it is new (a node's very first run only records what the log holds)."""
    (tmp_path / "kmsg").touch()
    assert _hook(_config(tmp_path, "healthy"), tmp_path, RecordingSlurm(_cluster())).exit_code == 0
    # the GPUs change scenario now: drop the snapshot the prologs of the next 2 s would share
    shutil.rmtree(tmp_path / "run", ignore_errors=True)


def test_lost_gpu_drains_naming_the_gpu(tmp_path: Path) -> None:
    _checked_before(tmp_path)
    cfg = _config(tmp_path, "gpu-lost")
    slurm = RecordingSlurm(_cluster())
    result = _hook(cfg, tmp_path, slurm)
    assert result.exit_code == 1
    ((_, reason),) = slurm.drains  # the lost GPU (known from the last run) leads, its Xid tagged
    assert reason.startswith(f"{REASON_PREFIX} gpu_lost gpu5 ") and "[Xid 79]" in reason
    assert reason.endswith("(+1 more)")
    lost = [f for f in _rows(tmp_path / "history.db", "findings") if f["check_name"] == "gpu_lost"]
    assert [(f["gpu"], f["severity"]) for f in lost] == [(5, "critical")]
    (row,) = _drain_rows(tmp_path)
    named = json.loads(row["detail"])["findings"]
    assert ("gpu_lost", 5) in [(f["check"], f["gpu"]) for f in named]


def test_epilog_after_a_failed_prolog_does_not_repeat_the_drain(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "nvlink-down")
    slurm = RecordingSlurm(_cluster())
    assert _hook(cfg, tmp_path, slurm).exit_code == 1
    result = _hook(cfg, tmp_path, slurm, "epilog", SLURM_JOB_EXIT_CODE2="0:15")
    assert result.exit_code == 0  # a non-zero epilog would replace our reason
    assert result.drain is not None and result.drain.state == "already"
    assert len(slurm.drains) == 1 and slurm.table[NODE].ours
    assert [r["state"] for r in _drain_rows(tmp_path)] == ["drained"]  # the prolog's only
    runs = _rows(tmp_path / "history.db", "check_runs")
    assert [(r["phase"], r["status"]) for r in runs] == [("prolog", "fail"), ("epilog", "fail")]
    (job,) = _rows(tmp_path / "history.db", "jobs")
    assert (job["state"], job["exit_code"]) == ("failed", "0:15")
    assert (tmp_path / "evidence" / JOB / NODE / "manifest.json").exists()


def test_epilog_drains_for_a_fault_that_appeared_during_the_job(tmp_path: Path) -> None:
    slurm = RecordingSlurm(_cluster())
    assert _hook(_config(tmp_path, "healthy"), tmp_path, slurm).exit_code == 0
    cfg = _config(tmp_path, "ecc-uncorrectable")
    result = _hook(cfg, tmp_path, slurm, "epilog", SLURM_JOB_EXIT_CODE2="0:0")
    assert result.exit_code == 0
    ((_, reason),) = slurm.drains
    assert reason.startswith(f"{REASON_PREFIX} ecc_uncorrectable gpu1 ")
    (row,) = _drain_rows(tmp_path)
    assert (row["state"], row["actor"]) == ("drained", "slurmhealth epilog")


def test_resume_leaves_an_admins_drain_alone_unless_forced(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "healthy")
    slurm = RecordingSlurm(_cluster(n1="rack 7 maintenance"))
    with History(tmp_path / "history.db") as history:
        refused = resume(cfg, slurm, history, NODE, "fixed")
        assert refused.exit_code == 1 and "not by slurmhealth" in refused.message
        assert slurm.resumes == []
        forced = resume(cfg, slurm, history, NODE, "fixed", force=True)
    assert forced.exit_code == 0 and slurm.resumes == [NODE]
    rows = _drain_rows(tmp_path)
    assert [(r["state"], r["reason"]) for r in rows] == [
        ("resume_refused", "fixed"),
        ("resumed", "fixed"),
    ]
    assert '"forced": true' in rows[1]["detail"]


def test_resume_of_our_drain_needs_a_passing_validation(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "healthy")
    ours = NodeInfo(NODE, "drained", f"{REASON_PREFIX} gpu_lost gpu5", "root", 1000.0)
    slurm = RecordingSlurm([ours, NodeInfo("n2", "idle")])
    with History(tmp_path / "history.db") as history:
        first = resume(cfg, slurm, history, NODE, "replaced gpu5")
        assert first.exit_code == 1 and f"slurmhealth validate --node {NODE}" in first.message
        run = {"run_id": "v1", "ts": 2000.0, "node": NODE, "phase": "validate", "status": "ok"}
        history.write(Batch(inserts=[("check_runs", run)]))
        second = resume(cfg, slurm, history, NODE, "replaced gpu5")
    assert second.exit_code == 0 and slurm.resumes == [NODE]
    assert [r["state"] for r in _drain_rows(tmp_path)] == ["resume_refused", "resumed"]


def test_prolog_on_a_newer_schema_fails_open_without_draining(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A rolled-back binary on a node whose history a newer release migrated: the job runs,
    the node stays up, the run waits in the spool for the newer release."""
    conn = sqlite3.connect(tmp_path / "history.db")
    conn.execute("PRAGMA user_version = 999")
    conn.close()
    cfg = _config(tmp_path, "nvlink-down")
    slurm = RecordingSlurm(_cluster())
    result = _hook(cfg, tmp_path, slurm)
    assert (result.exit_code, result.status, slurm.drains) == (0, "failopen", [])
    assert _rows(tmp_path / "history.db", "check_runs") == []
    (batch,) = (tmp_path / "spool.jsonl").read_text().splitlines()
    (run,) = [row for table, row in Batch.from_json(batch).inserts if table == "check_runs"]
    assert run["status"] == "failopen" and "schema version 999" in run["error"]
    assert any(r.levelname == "ERROR" and "999" in r.getMessage() for r in caplog.records)


def test_prolog_fails_a_gpu_slurm_allocated_that_nvml_cannot_see(tmp_path: Path) -> None:
    """Not a usage error as `check --gpus 7` by hand would be: the job was given GPU 7."""
    cfg = _config(tmp_path, "gpu-missing")  # 7 GPUs enumerate, no expected_count set
    slurm = RecordingSlurm(_cluster())
    result = _hook(cfg, tmp_path, slurm)  # SLURM_JOB_GPUS=0,...,7
    assert (result.exit_code, result.status) == (1, "fail")
    ((_, reason),) = slurm.drains
    assert reason.startswith(f"{REASON_PREFIX} gpu_count ") and "GPU(s) 7 not visible" in reason
