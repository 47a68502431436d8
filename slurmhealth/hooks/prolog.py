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

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slurmhealth.config import Config
from slurmhealth.hooks.drain import DrainOutcome, drain_node
from slurmhealth.hooks.job import complete, job_from_env
from slurmhealth.model import Finding, Job, NodeSnapshot, Severity
from slurmhealth.slurm import SlurmBackend

if TYPE_CHECKING:
    from slurmhealth.gpu import GpuBackend
    from slurmhealth.history import History
    from slurmhealth.hooks.check import CheckResult

log = logging.getLogger("slurmhealth.hooks")


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
    the checks run (an opted-out job never touches the GPUs) and closed after them."""

    slurm: SlurmBackend
    open_gpu: Callable[[], GpuBackend]
    history: History


def _drain_candidates(findings: tuple[Finding, ...]) -> list[Finding]:
    return [f for f in findings if f.failing and f.action.takes_node_out]


def _record(
    history: History,
    inserts: list[tuple[str, dict[str, Any]]],
    job_row: dict[str, Any] | None = None,
) -> None:
    from slurmhealth.history import Batch

    history.write(Batch(inserts=inserts, upserts=[("jobs", job_row, "job_id")] if job_row else []))


def _skip(
    cfg: Config, history: History, job: Job, phase: str, job_row: dict[str, Any]
) -> HookResult:
    """The job opted out: record that, run nothing."""
    run_id = os.urandom(16).hex()
    now = time.time()
    log.warning("job %s opted out (%r): checks skipped", job.job_id, cfg.policy.optout_token)
    _record(
        history,
        [
            (
                "check_runs",
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
    cfg: Config, job: Job, env: Mapping[str, str], phase: str, adapters: Adapters
) -> HookResult:
    """The prolog (``phase`` "prolog") or epilog decision for ``job`` over ``adapters``:
    check the job's GPUs, drain when a failing finding calls for it (within the policy and
    the circuit breaker), record it all in the history."""
    if phase == "prolog":
        job = complete(job, adapters.slurm, env)
    row = _job_row(job, phase)
    if job.opted_out(cfg.policy.optout_token):
        row["state"] = f"{row['state']} (slurmhealth off)"
        # the jobs row on a node without history yet is still recorded by _skip
        return _skip(cfg, adapters.history, job, phase, row)
    if phase == "epilog":  # first: its final samples belong before the epilog's check
        _sidecar(cfg, job, phase, 0)
    result = _check(cfg, adapters, job, phase, row)
    candidates = _drain_candidates(result.findings)
    outcome = None
    if candidates:
        outcome = drain_node(cfg, adapters.slurm, job.node, candidates)
        if outcome.state in ("suppressed", "failed"):  # loud: an operator must look
            log.warning("drain %s: %s (%s)", outcome.state, outcome.reason, outcome.detail)
    if outcome and not (phase == "epilog" and outcome.state == "already"):
        # (the epilog after our own failed prolog would only repeat the drain)
        _record_drain(adapters.history, job, phase, result.run_id, outcome, candidates)
    exit_code = 1 if phase == "prolog" and outcome and outcome.keeps_job_off else 0
    if phase == "prolog":
        if exit_code == 0:
            _prolog_bench(cfg, job, result.snapshot)
        _sidecar(cfg, job, phase, exit_code)
    else:
        _evidence(cfg, job, adapters.slurm, result.findings, outcome)
    return HookResult(exit_code, job, result.status, outcome, result.findings, result.run_id)


def _check(
    cfg: Config, adapters: Adapters, job: Job, phase: str, row: dict[str, Any]
) -> CheckResult:
    from slurmhealth.hooks.check import check_node

    backend = adapters.open_gpu()
    try:
        return check_node(
            cfg, backend, adapters.history, gpus=job.gpus, phase=phase, job_id=job.job_id,
            job_row=row,
        )  # fmt: skip
    finally:
        backend.close()


def _record_drain(
    history: History,
    job: Job,
    phase: str,
    run_id: str,
    outcome: DrainOutcome,
    candidates: list[Finding],
) -> None:
    _record(
        history,
        [
            (
                "drains",
                {
                    "ts": time.time(),
                    "node": job.node,
                    "job_id": job.job_id,
                    "run_id": run_id,
                    "state": outcome.state,
                    "reason": outcome.reason,
                    "actor": f"slurmhealth {phase}",
                    "detail": {
                        "note": outcome.detail,
                        "findings": [f.to_dict() for f in candidates],
                    },
                },
            )
        ],
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
        log.warning("prolog bandwidth test: %s", "; ".join(outcome.problems))


def _job_had_events(cfg: Config, job: Job) -> bool:
    from slurmhealth.history.read import Reader, StoreError, job_had_events

    try:
        with Reader(cfg.db_path(job.node)) as db:
            return job_had_events(db, job.job_id)
    except StoreError:
        return False


def _evidence(
    cfg: Config,
    job: Job,
    slurm: SlurmBackend,
    findings: tuple[Finding, ...],
    outcome: DrainOutcome | None,
) -> None:
    """The epilog keeps the proof: a full bundle when the job failed or anything was
    noticed, and always the node's summary.json for `slurmhealth report`. Never fails."""
    from slurmhealth.evidence import capture, write_summary

    bundle_dir = None
    try:
        noticed = [f for f in findings if f.severity >= Severity.WARN]
        if job.failed or noticed or outcome or _job_had_events(cfg, job):
            why = "job failed" if job.failed else "findings or events during the job"
            record = slurm.show_job(job.job_id)
            result = capture(
                cfg,
                job.job_id,
                job.node,
                reason=why,
                gpus=job.gpus,
                user=job.user,
                uid=job.uid,
                end_ts=time.time(),
                stdout_path=record.get("StdOut") or None,
                stderr_path=record.get("StdErr") or None,
                budget_s=cfg.evidence.budget_s,
            )
            bundle_dir = result.dir
            log.info("evidence: %s (%d files, %.2f s)", result.dir, len(result.files),
                     result.elapsed_s)  # fmt: skip
        write_summary(cfg, job.job_id, job.node, bundle_dir=bundle_dir, uid=job.uid)
    except Exception as exc:  # evidence is best effort: the epilog's verdict stands
        log.warning("evidence capture failed: %s: %s", type(exc).__name__, exc)


def _sidecar(cfg: Config, job: Job, phase: str, exit_code: int) -> None:
    """The prolog starts the job's sidecar when the job will run; the epilog stops it."""
    if not cfg.sidecar.enabled:
        return
    from slurmhealth.sidecar.lifecycle import start_sidecar, stop_sidecar

    if phase == "prolog" and exit_code == 0:
        pid = start_sidecar(cfg, job)
        log.debug("sidecar started: pid %s", pid)
    elif phase == "epilog":
        log.debug("%s", stop_sidecar(cfg, job.node, job.job_id))


def _wired(cfg: Config, env: Mapping[str, str], phase: str) -> HookResult:
    """:func:`run_hook` over the real adapters: the configured Slurm and GPU backends
    and the node's history."""
    from slurmhealth.gpu import open_backend
    from slurmhealth.history import History
    from slurmhealth.slurm import open_slurm

    job = job_from_env(env, cfg.node_name)
    slurm = open_slurm(cfg.slurm.backend, cfg.slurm.command_timeout_s)
    history = History.for_node(cfg, job.node)
    try:
        return run_hook(cfg, job, env, phase, Adapters(slurm, lambda: open_backend(cfg), history))
    finally:
        history.close()


def run_prolog(cfg: Config, env: Mapping[str, str]) -> HookResult:
    """Before the job: quick checks on its GPUs; drain and requeue on a failing one."""
    return _wired(cfg, env, "prolog")


def run_epilog(cfg: Config, env: Mapping[str, str]) -> HookResult:
    """After the job: record its end, re-check its GPUs (an Xid or ECC error during the job
    shows here) and drain with our own reason; never fail."""
    return _wired(cfg, env, "epilog")
