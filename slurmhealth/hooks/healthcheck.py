"""Slurm's ``HealthCheckProgram``: check a node's GPUs between jobs, drain it when one fails.

slurmd runs the program as root every ``HealthCheckInterval`` on the nodes
``HealthCheckNodeState`` names (and at its own start, where Slurm since 20.02 keeps the node
from registering until the program exits 0), and kills it after 60 s. Slurm does nothing
else with its exit status: any action is the program's own (NHC drains with ``scontrol``).
So the entry point always exits 0, and this module drains by itself with the prolog's
reasons, etiquette and circuit breaker (``hooks/drain.py``). It resumes a node only through
remediation (``[remediate] enabled``, off by default: one step of ``hooks/remediate.py``
after the check, on a node slurmhealth drained).

Every check is a read-only NVML or kernel-log read: none resets a GPU or loads it, so the
same checks run on a node with jobs. What changes with jobs is what may be judged: a
previous job's leftovers (the ``PRE_JOB`` checks: processes and memory on a GPU) are the
running jobs' own there, so those checks are skipped and the run's notes name them. Which
jobs run is asked of the local slurmd (``scontrol listpids``), twice: before and after the
snapshot, so a job that starts meanwhile is never taken for a leftover; when slurmd cannot
say, the node is taken as busy.

:func:`run_healthcheck` decides over :class:`~slurmhealth.hooks.prolog.Adapters` (tests:
tests/unit/test_healthcheck.py); :func:`healthcheck` wires the real ones.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slurmhealth.config import Config
from slurmhealth.hooks.check import (
    CheckResult,
    check_batch,
    judge,
    read_kernel_log,
    read_state,
    take_snapshot,
)
from slurmhealth.hooks.drain import DrainOutcome, drain_candidates, drain_node

if TYPE_CHECKING:
    from slurmhealth.history.records import Row
    from slurmhealth.hooks.prolog import Adapters

log = logging.getLogger("slurmhealth.healthcheck")
PHASE = "healthcheck"
BUSY_PHASE = "check"  # the checks ``slurmhealth check`` runs beside a job
QUIET_STATES = ("already", "held")  # no news: the node is out already, nothing recorded

LocalJobs = Callable[[], Sequence[str] | None]
"""The jobs running on this node now ([] none; None when that cannot be told)."""


@dataclass(frozen=True)
class HealthcheckResult:
    """One run: the check, the drain (if any), the node's jobs and the checks skipped."""

    check: CheckResult
    jobs: tuple[str, ...] | None  # None: the local slurmd could not say (taken as busy)
    skipped: tuple[str, ...] = field(default_factory=tuple)
    drain: DrainOutcome | None = None
    remediation: dict[str, Any] | None = None  # the remediation step after the check

    @property
    def idle(self) -> bool:
        return self.jobs == ()

    def to_dict(self) -> dict[str, Any]:
        drain = self.drain
        return {
            **self.check.to_dict(),
            "schema": "slurmhealth.healthcheck/1",
            "jobs": None if self.jobs is None else list(self.jobs),
            "skipped_checks": list(self.skipped),
            "drain": None
            if drain is None
            else {"state": drain.state, "reason": drain.reason, "detail": drain.detail},
            "remediation": self.remediation,
        }


def skipped_when_busy(disabled: Sequence[str] = ()) -> tuple[str, ...]:
    """The checks an idle node gets and a busy one does not (a previous job's leftovers)."""
    from slurmhealth.checks import enabled

    busy = {s.name for s in enabled(BUSY_PHASE, disabled)}
    return tuple(s.name for s in enabled(PHASE, disabled) if s.name not in busy)


def _jobs_note(jobs: tuple[str, ...] | None, skipped: tuple[str, ...]) -> str:
    who = "the local slurmd did not say which jobs run" if jobs is None else (
        f"job(s) {', '.join(jobs)} running"
    )  # fmt: skip
    return f"{who}: skipped {', '.join(skipped) or 'nothing'} (it would judge the jobs' own use)"


def run_healthcheck(
    cfg: Config, node: str, adapters: Adapters, local_jobs: LocalJobs
) -> HealthcheckResult:
    """Check every GPU of ``node``, drain it for a failing finding (policy, etiquette and
    circuit breaker as in the prolog), and record the run (phase ``healthcheck``) with the
    drain in one batch. Raises only for setup errors (bad settings, NVML that cannot start,
    a history written by a newer release): the entry point logs them and exits 0."""
    from slurmhealth.checks import validate_settings

    t0 = time.monotonic()
    validate_settings(cfg.checks.settings, cfg.checks.disabled, cfg.sources)
    adapters.history.refuse_newer()
    before = local_jobs()
    stored, notes = read_state(adapters.history)
    backend = adapters.open_gpu(cfg.gpu.snapshot_timeout_s)
    try:
        snapshot = take_snapshot(backend, None, stored)
        hint = backend.kernel_log_hint
    finally:
        backend.close()
    jobs = _jobs_of(before, local_jobs)
    skipped: tuple[str, ...] = ()
    if jobs != ():
        skipped = skipped_when_busy(cfg.checks.disabled)
        notes.append(_jobs_note(jobs, skipped))
    log_read = read_kernel_log(cfg, hint, stored, adapters.history, notes)
    judged = judge(
        cfg, snapshot, log_read, stored, notes, phase=PHASE if jobs == () else BUSY_PHASE,
        gpus=None, job_id=None, duration_s=time.monotonic() - t0,
    )  # fmt: skip
    check = judged.result._replace(phase=PHASE)
    candidates = drain_candidates(check.findings)
    drain = drain_node(cfg, adapters.slurm, node, candidates) if candidates else None
    if drain is not None and drain.state in ("suppressed", "failed"):
        log.warning("drain %s: %s (%s)", drain.state, drain.reason, drain.detail)
    more = []
    if drain is not None and drain.state not in QUIET_STATES:
        more.append(_drain_insert(check, drain, candidates))
    batch = check_batch(cfg, check, None, judged.state, more)
    if not adapters.history.write(batch):
        check = check._replace(recorded=False)
    return HealthcheckResult(check, jobs, skipped, drain)


def _jobs_of(before: Sequence[str] | None, local_jobs: LocalJobs) -> tuple[str, ...] | None:
    """The jobs of the run: none only when slurmd said none both before and after the
    snapshot (a job starting in between has its processes on the GPUs already)."""
    if before is None:
        return None
    if before:
        return tuple(before)
    after = local_jobs()
    return None if after is None else tuple(after)


def _drain_insert(check: CheckResult, drain: DrainOutcome, candidates: Sequence[Any]) -> Row:
    from slurmhealth.history import records, rows

    detail = {"note": drain.detail, "findings": [f.to_dict() for f in candidates]}
    row = rows.drain_row(time.time(), check.node, drain.state, drain.reason,
                         f"slurmhealth {PHASE}", detail)  # fmt: skip
    return records.drain({**row, "run_id": check.run_id})


def healthcheck(cfg: Config) -> HealthcheckResult:
    """:func:`run_healthcheck` over the configured Slurm and GPU backends, the node's
    history and its local slurmd."""
    from slurmhealth.gpu import open_backend
    from slurmhealth.history import History
    from slurmhealth.history.retention import prune_quietly
    from slurmhealth.hooks.prolog import Adapters
    from slurmhealth.slurm import local_job_ids, open_slurm

    node = cfg.node_name
    slurm = open_slurm(cfg.slurm.backend, cfg.slurm.command_timeout_s)
    with History.for_node(cfg, node) as history:
        adapters = Adapters(slurm, lambda _timeout_s: open_backend(cfg), history)
        try:
            result = run_healthcheck(
                cfg, node, adapters, lambda: local_job_ids(node, cfg.slurm.command_timeout_s)
            )
            if cfg.remediate.enabled:
                result = dataclasses.replace(result, remediation=remediate(cfg, history))
            return result
        finally:  # retention keeps up during a month-long job too (bounded per run)
            prune_quietly(history, cfg)


def remediate(cfg: Config, history: Any) -> dict[str, Any]:
    """One remediation step on this node after the check (``[remediate] enabled``); a
    crash is logged and reported, never raised: the node is left as it is."""
    from slurmhealth.hooks import remediate as rem

    node = cfg.node_name
    try:
        step = rem.locked_tick(cfg, node, rem.adapters(cfg, history))
    except Exception as exc:  # fail open, loudly
        log.error("remediation of %s failed: %s: %s", node, type(exc).__name__, exc)
        step = rem.step_error(node, exc)
    if step.action not in ("none", "wait"):
        log.info("remediation: %s: %s (%s)", step.action, step.why, step.fault)
    return step.to_dict()
