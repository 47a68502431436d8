"""The prolog's own time budget: slow Slurm calls and db waits are cut to what is left, the
decision comes first, a bad node exits 1 even when the drain or the record cannot finish,
and a budget spent before the decision fails open and is recorded.

Slow Slurm calls are played by a recording backend that "sleeps" on an injected clock (no
wall time): each call takes its scripted delay, or, when the caller allowed less, exactly
the allowed time and then fails the way ``SlurmCli`` does on its subprocess timeout.
"""

from __future__ import annotations

import math
import os
import sqlite3
import time
from pathlib import Path

import pytest

from slurmhealth.config import load_config
from slurmhealth.errors import ConfigError
from slurmhealth.history import History
from slurmhealth.hooks.budget import Budget, prolog_budget
from slurmhealth.hooks.job import job_from_env
from slurmhealth.hooks.prolog import Adapters, HookResult, run_hook
from slurmhealth.slurm import Job, SlurmError
from tests.unit.test_hooks_decisions import (
    JOB,
    NODE,
    RecordingSlurm,
    _cluster,
    _config,
    _drain_rows,
    _gpu,
    _rows,
    job_env,
)

BUDGET_S = 5.0


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class SlowSlurm(RecordingSlurm):
    """RecordingSlurm whose calls take ``delays[method]`` seconds of the fake clock; a call
    allowed less (``with_timeout``) takes just that long and raises, as SlurmCli does."""

    def __init__(self, clock: FakeClock, delays: dict[str, float], **kw: object) -> None:
        super().__init__(_cluster(), **kw)  # type: ignore[arg-type]
        self.clock = clock
        self.delays = delays
        self.limit: float | None = None
        self.called: list[tuple[str, float]] = []  # (method, seconds it was allowed)

    def with_timeout(self, timeout_s: float) -> SlowSlurm:
        self.limit = timeout_s
        return self

    def _maybe_fail(self, call: str) -> None:
        allowed = self.limit if self.limit is not None else float("inf")
        self.called.append((call, allowed))
        delay = self.delays.get(call, 0.0)
        self.clock.sleep(min(delay, allowed))
        self.limit = None
        if delay > allowed:
            raise SlurmError(f"{call} did not answer within {allowed:.2g} s")
        super()._maybe_fail(call)


def _prolog(
    tmp_path: Path,
    scenario: str,
    slurm: RecordingSlurm,
    budget: Budget,
    **env: str,
) -> HookResult:
    cfg = _config(tmp_path, scenario)
    environ = job_env(**env)
    history = History(tmp_path / "history.db", spool_path=tmp_path / "spool.jsonl")
    adapters = Adapters(slurm, lambda t: _gpu(cfg, tmp_path, timeout_s=t), history)
    try:
        return run_hook(cfg, job_from_env(environ, NODE), environ, "prolog", adapters, budget)
    finally:
        history.close()


def test_slurmctld_down_at_drain_time_still_keeps_the_job_off_within_the_budget(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    slurm = SlowSlurm(clock, {"nodes": 10.0, "drain": 10.0, "job": 10.0})
    budget = Budget(BUDGET_S, clock=clock)
    result = _prolog(tmp_path, "nvlink-down", slurm, budget)
    assert (result.exit_code, result.status) == (1, "fail")  # Slurm drains: "Prolog error"
    assert budget.elapsed() <= BUDGET_S
    assert slurm.drains == []  # sinfo used what was left: scontrol drain never ran
    (row,) = _drain_rows(tmp_path)
    assert row["state"] == "failed" and "did not answer" in row["detail"]
    findings = _rows(tmp_path / "history.db", "findings")
    assert [(f["check_name"], f["gpu"]) for f in findings] == [("nvlink_inactive", 3)]


def test_slow_scontrol_drain_is_cut_and_the_job_still_kept_off(tmp_path: Path) -> None:
    clock = FakeClock()
    slurm = SlowSlurm(clock, {"drain": 30.0})
    budget = Budget(BUDGET_S, clock=clock)
    result = _prolog(tmp_path, "nvlink-down", slurm, budget)
    assert result.exit_code == 1 and budget.elapsed() <= BUDGET_S
    (row,) = _drain_rows(tmp_path)
    assert row["state"] == "failed" and "scontrol drain failed" in row["detail"]


def test_hanging_squeue_gets_a_quarter_of_the_budget_and_the_checks_still_run(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    slurm = SlowSlurm(clock, {"job": 60.0})
    budget = Budget(BUDGET_S, clock=clock)
    result = _prolog(tmp_path, "healthy", slurm, budget)
    assert (result.exit_code, result.status) == (0, "ok")
    ((call, allowed),) = slurm.called
    assert call == "job" and allowed <= BUDGET_S / 4 + 1e-9
    (run,) = _rows(tmp_path / "history.db", "check_runs")
    assert run["status"] == "ok"


def test_squeue_is_skipped_when_slurm_passes_account_and_extra(tmp_path: Path) -> None:
    clock = FakeClock()
    slurm = SlowSlurm(clock, {})
    env = {"SLURM_JOB_ACCOUNT": "physics", "SLURM_JOB_EXTRA": "", "SLURM_JOB_QOS": "normal"}
    result = _prolog(tmp_path, "healthy", slurm, Budget(BUDGET_S, clock=clock), **env)
    assert result.exit_code == 0 and slurm.called == []
    (job,) = _rows(tmp_path / "history.db", "jobs")
    assert (job["account"], job["qos"]) == ("physics", "normal")


def test_budget_spent_before_the_decision_fails_open_and_says_where(tmp_path: Path) -> None:
    clock = FakeClock()
    slurm = SlowSlurm(clock, {})
    budget = Budget(BUDGET_S, clock=clock, start=clock() - 4.6)  # a slow start-up under load
    result = _prolog(tmp_path, "nvlink-down", slurm, budget)
    assert (result.exit_code, result.status) == (0, "failopen")  # not decided: never drain
    assert slurm.drains == []
    (run,) = _rows(tmp_path / "history.db", "check_runs")
    assert (run["status"], run["job_id"], run["exit_code"]) == ("failopen", JOB, 0)
    assert "gpu snapshot" in run["error"] and "of 5 s used" in run["error"]
    (job,) = _rows(tmp_path / "history.db", "jobs")
    assert job["state"] == "running"


def test_locked_history_is_waited_on_within_the_budget_then_spooled(tmp_path: Path) -> None:
    """Another process holds the write lock: the prolog decides and drains, waits at most
    what is left of its budget, spools, and the next write ingests it."""
    with History(tmp_path / "history.db") as warm:
        assert warm.ingest_spool() == 0
    holder = sqlite3.connect(tmp_path / "history.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    slurm = RecordingSlurm(_cluster())
    t0 = time.monotonic()
    try:
        result = _prolog(tmp_path, "nvlink-down", slurm, Budget(1.5))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert time.monotonic() - t0 < 2.5  # not two 5 s busy timeouts
    assert result.exit_code == 1 and [n for n, _ in slurm.drains] == [NODE]
    assert _drain_rows(tmp_path) == []  # not in the db yet: spooled
    with History(tmp_path / "history.db", spool_path=tmp_path / "spool.jsonl") as later:
        assert later.ingest_spool() == 1
    (row,) = _drain_rows(tmp_path)
    assert (row["state"], row["run_id"]) == ("drained", result.run_id)


def test_a_gpu_too_slow_for_the_time_left_is_a_fail_open_not_a_drain(tmp_path: Path) -> None:
    clock = FakeClock()
    slurm = SlowSlurm(clock, {})
    # 5 s snapshot timeout but only ~0.3 s left for it: the hung GPU 6 is not judged
    budget = Budget(BUDGET_S, clock=clock, start=clock() - 3.9)
    result = _prolog(tmp_path, "gpu-hang", slurm, budget)
    assert (result.exit_code, result.status) == (0, "failopen") and slurm.drains == []
    (run,) = _rows(tmp_path / "history.db", "check_runs")
    assert "did not answer" in run["error"]


def test_a_gpu_that_misses_its_full_deadline_is_judged(tmp_path: Path) -> None:
    cfg_flags = {"gpu.snapshot_timeout_s": 0.3}
    cfg = _config(tmp_path, "gpu-hang", **cfg_flags)
    slurm = RecordingSlurm(_cluster())
    environ = {"SLURM_JOB_ID": JOB, "SLURMD_NODENAME": NODE, "SLURM_JOB_GPUS": "6"}
    with History(tmp_path / "history.db") as history:
        adapters = Adapters(slurm, lambda t: _gpu(cfg, tmp_path, timeout_s=t), history)
        result = run_hook(cfg, job_from_env(environ, NODE), environ, "prolog", adapters,
                          Budget(BUDGET_S))  # fmt: skip
    assert result.exit_code == 1
    assert [f.check for f in result.findings] == ["gpu_unresponsive"]


def test_stages_reach_the_wrapper_and_the_budget_counts_from_its_start() -> None:
    read_fd, write_fd = os.pipe()
    try:
        env = {
            "SLURMHEALTH_STAGE_FD": str(write_fd),
            # the wrapper's own format (ms); floored so the text is never later than 2 s ago
            "SLURMHEALTH_PROLOG_STARTED": f"{math.floor((time.time() - 2.0) * 1000) / 1000:.3f}",
            "SLURMHEALTH_PROLOG_TIMEOUT": "8",
        }
        budget = prolog_budget(5.0, env)
        assert 2.9 < budget.left() <= 3.0  # 2 s went by before Python started
        budget.enter("gpu snapshot")
        assert os.read(read_fd, 100).decode().startswith("gpu snapshot 2.")
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_a_budget_past_the_wrapper_timeout_is_clamped_under_it() -> None:
    budget = prolog_budget(5.0, {"SLURMHEALTH_PROLOG_TIMEOUT": "4"})
    assert budget.total_s == 3.0  # the wrapper's 4 s less the margin


@pytest.mark.parametrize(
    ("value", "wrapper"), [(9.0, ""), (0.0, ""), (6.0, "5.5")], ids=["over-8", "zero", "over-env"]
)
def test_config_refuses_a_budget_the_wrapper_would_cut(
    tmp_path: Path, value: float, wrapper: str
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f"[slurm]\nprolog_budget_s = {value}\n")
    with pytest.raises(ConfigError, match=r"slurm\.prolog_budget_s"):
        load_config(str(path), env={"SLURMHEALTH_PROLOG_TIMEOUT": wrapper})


def test_opted_out_job_after_a_slow_squeue_is_still_recorded(tmp_path: Path) -> None:
    clock = FakeClock()
    slurm = SlowSlurm(clock, {"job": 0.5})
    slurm.jobs[JOB] = Job(JOB, user="alice", comment="slurmhealth=off")
    result = _prolog(tmp_path, "nvlink-down", slurm, Budget(BUDGET_S, clock=clock))
    assert (result.exit_code, result.status) == (0, "skipped")
    (run,) = _rows(tmp_path / "history.db", "check_runs")
    assert run["status"] == "skipped"
