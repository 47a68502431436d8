"""Slurm Prolog and Epilog: check the job's GPUs, record the job, drain with a reason.

Exit codes (the entry point turns them into the process status):
- prolog: 0 run the job; 1 the node was taken out (drained, or already out), so Slurm
  requeues the job elsewhere. Warnings, opt-outs and suppressed drains are 0.
- epilog: always 0; a non-zero epilog makes Slurm replace our reason with "Epilog error".
Internal errors propagate to the entry point, which fails open (see prolog/ wrapper).

The decision is :func:`run_hook` over :class:`Adapters` (Slurm backend, GPU backend,
history); :func:`run_prolog` and :func:`run_epilog` wire the real ones, the unit tests
recording ones (tests/unit/test_hooks_decisions.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slurmhealth.config import Config
from slurmhealth.errors import SchemaTooNew
from slurmhealth.hooks.budget import BoundedSlurm, Budget, BudgetSpent, bound_db_wait
from slurmhealth.hooks.check import check_batch, check_within
from slurmhealth.hooks.drain import DrainOutcome, drain_node
from slurmhealth.hooks.job import complete, job_from_env
from slurmhealth.model import Finding, NodeSnapshot, Severity
from slurmhealth.model_records import Job
from slurmhealth.slurm import SlurmBackend

if TYPE_CHECKING:
    from slurmhealth.gpu import GpuBackend
    from slurmhealth.history import History
    from slurmhealth.history.records import Row

log = logging.getLogger("slurmhealth.hooks")
DB_WAIT_S = 2.0  # the record, after the decision, waits on a locked db at most this, then spools


@dataclass(frozen=True)
class HookResult:
    exit_code: int
    job: Job
    status: str  # ok | warn | fail | skipped
    drain: DrainOutcome | None = None
    findings: tuple[Finding, ...] = field(default_factory=tuple)
    run_id: str | None = None


@dataclass(frozen=True)
class Adapters:
    """The outside world a hook talks to. The entry points pass the real ones
    (:func:`run_prolog`); tests pass recording ones. The GPU backend is opened only when
    the checks run (an opted-out job never touches the GPUs), with the snapshot timeout
    the budget leaves (seconds), and closed after them."""

    slurm: SlurmBackend
    open_gpu: Callable[[float], GpuBackend]
    history: History
    # the epilog's after-work (hooks/finish.py) given its journal entry: the real hooks
    # detach it; None runs it here, before the epilog returns
    finish: Callable[[str], object] | None = None
    # starts the job's sidecar (None: sidecar/lifecycle.py's start_sidecar); the node agent
    # hands the start to the prolog's client instead
    start_sidecar: Callable[[Config, Job], int | None] | None = None


def _drain_candidates(findings: tuple[Finding, ...]) -> list[Finding]:
    return [f for f in findings if f.failing and f.action.takes_node_out]


def _record(history: History, rows: list[Row], job_row: dict[str, Any] | None = None) -> None:
    from slurmhealth.history import records

    history.write(records.batch([*rows, *([records.job(job_row)] if job_row else [])]))


def _skip(
    cfg: Config, history: History, job: Job, phase: str, job_row: dict[str, Any]
) -> HookResult:
    """The job opted out: record that, run nothing."""
    from slurmhealth.history import records

    run_id = os.urandom(16).hex()
    now = time.time()
    log.warning("job %s opted out (%r): checks skipped", job.job_id, cfg.policy.optout_token)
    _record(
        history,
        [
            records.check_run(
                {
                    "run_id": run_id,
                    "ts": now,
                    "node": job.node,
                    "job_id": job.job_id,
                    "phase": phase,
                    "gpus": list(job.gpus),
                    "status": "skipped",
                    "exit_code": 0,
                    "duration_s": 0.0,
                    "backend": cfg.gpu.backend,
                    "error": f"opted out by the job ({cfg.policy.optout_token})",
                },
            ),
        ],
        job_row,
    )
    return HookResult(0, job, "skipped", run_id=run_id)


def _job_row(job: Job, phase: str) -> dict[str, Any]:
    from slurmhealth.history.rows import job_row

    if phase == "prolog":
        return job_row(job, start_ts=time.time(), state="running")
    return job_row(
        job,
        end_ts=time.time(),
        exit_code=job.exit_code,
        state="failed" if job.failed else "completed",
    )


def run_hook(
    cfg: Config,
    job: Job,
    env: Mapping[str, str],
    phase: str,
    adapters: Adapters,
    budget: Budget | None = None,
) -> HookResult:
    """The prolog (``phase`` "prolog") or epilog decision for ``job`` over ``adapters``:
    check the job's GPUs, drain when a failing finding calls for it (within the policy and
    the circuit breaker), then record it all in the history.

    Every slow step gets at most what is left of ``budget`` (default: no limit). The
    decision comes first: once the node is found bad the prolog exits 1 even when the
    drain or the record cannot finish; a budget spent before the decision fails open and
    is recorded as such (:func:`_fail_open`)."""
    budget = budget or Budget.unlimited()
    if phase == "prolog":
        budget.enter("job facts")
        squeue = BoundedSlurm(adapters.slurm, budget, reserve=budget.total_s * 0.75)
        job = complete(job, squeue, env)
    row = _job_row(job, phase)
    if job.opted_out(cfg.policy.optout_token):
        row["state"] = f"{row['state']} (slurmhealth off)"
        # the jobs row on a node without history yet is still recorded by _skip
        bound_db_wait(adapters.history, budget.bound(DB_WAIT_S))
        return _skip(cfg, adapters.history, job, phase, row)
    if phase == "epilog":  # first: it flushes while the epilog checks (waited for later)
        _sidecar(cfg, job, phase, 0)
    try:
        judged = check_within(cfg, adapters.history, adapters.open_gpu, job, phase, budget)
    except (BudgetSpent, SchemaTooNew) as spent:
        return _fail_open(cfg, adapters, job, phase, row, budget, spent)
    result = judged.result
    if judged.mig is not None:  # a MIG job: its parent GPUs and instances (hooks/gpu_scope.py)
        job = dataclasses.replace(job, gpus=judged.mig[0] or (), mig=judged.mig[1])
    candidates = _drain_candidates(result.findings)
    outcome = None
    if candidates:
        budget.enter("drain")
        outcome = drain_node(cfg, BoundedSlurm(adapters.slurm, budget), job.node, candidates)
        if outcome.state in ("suppressed", "failed"):  # loud: an operator must look
            log.warning("drain %s: %s (%s)", outcome.state, outcome.reason, outcome.detail)
    exit_code = 1 if phase == "prolog" and outcome and outcome.keeps_job_off else 0
    budget.enter("record")
    more = _killed_before(cfg, job, phase)
    if outcome and not (phase == "epilog" and outcome.state == "already"):
        # (the epilog after our own failed prolog would only repeat the drain)
        more.append(_drain_row(job, phase, result.run_id, outcome, candidates))
    batch = check_batch(cfg, result, row, judged.state, more)
    bound_db_wait(adapters.history, budget.bound(DB_WAIT_S))
    adapters.history.write(batch)
    if phase == "prolog":
        if exit_code == 0 and budget.left() > cfg.baseline.prolog_bench_timeout_s:
            _prolog_bench(cfg, job, result.snapshot)
        budget.enter("sidecar")
        _sidecar(cfg, job, phase, exit_code, adapters.start_sidecar, result.snapshot)
    else:
        _after(cfg, job, adapters, _evidence_why(job, result.findings, outcome), result.snapshot)
    budget.enter("done")
    return HookResult(exit_code, job, result.status, outcome, result.findings, result.run_id)


def _fail_open(
    cfg: Config,
    adapters: Adapters,
    job: Job,
    phase: str,
    row: dict[str, Any],
    budget: Budget,
    spent: BudgetSpent | SchemaTooNew,
) -> HookResult:
    """The budget ran out before a decision: the job runs (the prolog exits 0) and a
    ``failopen`` check run says where and why, in the history or, when the history does
    not answer at once, in the spool the next run ingests."""
    from slurmhealth.history import records

    run_id = os.urandom(16).hex()
    history = adapters.history
    log.log(
        logging.ERROR if isinstance(spent, SchemaTooNew) else logging.WARNING,
        "failing open: %s",
        spent,
    )
    bound_db_wait(history, budget.bound(DB_WAIT_S))
    _record(
        history,
        [
            *_killed_before(cfg, job, phase),
            records.check_run(
                {
                    "run_id": run_id,
                    "ts": time.time(),
                    "node": job.node,
                    "job_id": job.job_id,
                    "phase": phase,
                    "gpus": list(job.gpus),
                    "status": "failopen",
                    "exit_code": 0,
                    "duration_s": budget.elapsed(),
                    "backend": cfg.gpu.backend,
                    "error": f"fail open: {spent}",
                },
            ),
        ],
        row,
    )
    if phase == "prolog":
        _sidecar(cfg, job, phase, 0, adapters.start_sidecar)
    return HookResult(0, job, "failopen", run_id=run_id)


def _evidence_why(job: Job, findings: tuple[Finding, ...], outcome: DrainOutcome | None) -> str:
    """The epilog's evidence decision: why a full bundle ("" for none, unless the sidecar
    recorded events: the after-work looks once the sidecar has flushed)."""
    if job.failed:
        return "job failed"
    if outcome or any(f.severity >= Severity.WARN for f in findings):
        return "findings or events during the job"
    return ""


def _after(
    cfg: Config, job: Job, adapters: Adapters, why: str, snapshot: NodeSnapshot | None
) -> None:
    """Journal what is left after the decision (hooks/finish.py) and hand it on: the
    epilog returns without waiting for the sidecar, the evidence or the AdminComment."""
    from slurmhealth.hooks.finish import finish, journal

    try:
        path = journal(cfg, job, why, snapshot)
    except OSError as exc:  # no journal (a full /run): do it now rather than lose it
        log.warning("after-work not journaled (%s): done before the epilog returns", exc)
        from slurmhealth.hooks.finish import evidence

        evidence(cfg, job, adapters.slurm, why)
        return
    if adapters.finish is not None:
        adapters.finish(path)
    else:
        log.debug("%s", finish(cfg, path, adapters.slurm))


def _killed_before(cfg: Config, job: Job, phase: str) -> list[Row]:
    """Earlier prologs of this node that the wrapper killed (hooks/inflight.py)."""
    if phase != "prolog":
        return []
    from slurmhealth.history import records
    from slurmhealth.hooks.inflight import killed_runs

    rows = killed_runs(cfg.expand(cfg.paths.run_dir, job.node), cfg.gpu.backend)
    for row in rows:
        log.warning("job %s: %s", row["job_id"], row["error"])
    return [records.check_run(row) for row in rows]


def _drain_row(
    job: Job, phase: str, run_id: str, outcome: DrainOutcome, candidates: list[Finding]
) -> Row:
    from slurmhealth.history import records

    return records.drain(
        {
            "ts": time.time(),
            "node": job.node,
            "job_id": job.job_id,
            "run_id": run_id,
            "state": outcome.state,
            "reason": outcome.reason,
            "actor": f"slurmhealth {phase}",
            "detail": {"note": outcome.detail, "findings": [f.to_dict() for f in candidates]},
        },
    )


def _prolog_bench(cfg: Config, job: Job, snapshot: NodeSnapshot) -> None:
    """The optional short bandwidth test when the node's last validation is old. Recorded
    and compared with the fleet; a slow result is logged, never a reason to fail the job."""
    if cfg.baseline.prolog_bench_max_age_s <= 0:
        return
    from slurmhealth.hooks.validate import prolog_bench

    try:
        model = next((g.name for g in snapshot.gpus if g.name), None)
        outcome = prolog_bench(cfg, job.node, model, now=time.time())
    except Exception as exc:  # fail open: a benchmark must never cost the job its start
        log.warning("prolog bandwidth test failed to run: %s: %s", type(exc).__name__, exc)
        return
    if outcome is not None and not outcome.passed:
        log.warning("prolog bandwidth test: %s", "; ".join(outcome.problems) or outcome.skipped)


def _sidecar(
    cfg: Config,
    job: Job,
    phase: str,
    exit_code: int,
    starter: Callable[[Config, Job], int | None] | None = None,
    snapshot: NodeSnapshot | None = None,
) -> None:
    """The prolog starts the job's sidecar when the job will run (and keeps its
    ``snapshot`` for a job too short for the sidecar); the epilog signals it (the
    after-work waits for it)."""
    if not cfg.sidecar.enabled:
        return
    from slurmhealth.sidecar.lifecycle import signal_sidecar, start_sidecar

    if phase == "prolog" and exit_code == 0:
        from slurmhealth.hooks.wrapper_log import child_env

        pid = starter(cfg, job) if starter else start_sidecar(cfg, job, child_env(os.environ))
        if pid is not None and os.getpriority(os.PRIO_PROCESS, 0) < 0:
            # the wrapper put the prolog ahead of the node's other work; the sidecar runs
            # beside the job, not ahead of it (nor of the next burst's prologs)
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, pid, 0)
        log.debug("sidecar started: pid %s", pid)
        if snapshot is not None:
            from slurmhealth.hooks.finish import record_start

            record_start(cfg, job, snapshot)
    elif phase == "epilog":
        log.debug("%s", signal_sidecar(cfg, job.node, job.job_id))


def _wired(cfg: Config, env: Mapping[str, str], phase: str) -> HookResult:
    """:func:`run_hook` over the real adapters: the configured Slurm and GPU backends
    and the node's history."""
    from slurmhealth.gpu import open_backend
    from slurmhealth.history import History
    from slurmhealth.hooks.budget import prolog_budget
    from slurmhealth.hooks.finish import detach
    from slurmhealth.hooks.inflight import InFlight
    from slurmhealth.slurm import open_slurm

    job = job_from_env(env, cfg.node_name)
    marker = budget = None
    if phase == "prolog":
        marker = InFlight(cfg.expand(cfg.paths.run_dir, job.node), job.job_id, job.node)
        budget = prolog_budget(cfg.slurm.prolog_budget_s, env, marker.stage)
    slurm = open_slurm(cfg.slurm.backend, cfg.slurm.command_timeout_s)
    history = History.for_node(cfg, job.node)

    def open_gpu(timeout_s: float) -> GpuBackend:
        gpu = dataclasses.replace(cfg.gpu, snapshot_timeout_s=timeout_s)
        return open_backend(dataclasses.replace(cfg, gpu=gpu))

    # the epilog's after-work (evidence, summary, retention, AdminComment) runs detached
    adapters = Adapters(slurm, open_gpu, history, detach if phase == "epilog" else None)
    try:
        return run_hook(cfg, job, env, phase, adapters, budget)
    finally:
        history.close()
        if marker is not None:
            marker.done()


def run_prolog(cfg: Config, env: Mapping[str, str]) -> HookResult:
    """Before the job: quick checks on its GPUs; drain and requeue on a failing one."""
    return _wired(cfg, env, "prolog")


def run_epilog(cfg: Config, env: Mapping[str, str]) -> HookResult:
    """After the job: record its end, re-check its GPUs (an Xid or ECC error during the job
    shows here) and drain with our own reason; never fail."""
    return _wired(cfg, env, "epilog")
