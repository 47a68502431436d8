"""One health-check run: snapshot the GPUs, read new Xids, run the catalog, record it.

Used by ``slurmhealth check`` and (with another phase) by the prolog, epilog and
``validate``. The decision never depends on the history being writable: when the database
cannot be written the records go to the spool, and the result is the same.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from slurmhealth.hooks.inventory import INVENTORY_KEY, updated_inventory, with_known_identity
from slurmhealth.model import Finding, GpuStatus, NodeSnapshot, Severity

if TYPE_CHECKING:
    from slurmhealth.config import Config
    from slurmhealth.gpu import GpuBackend
    from slurmhealth.history import Batch, History
    from slurmhealth.history.records import Row
    from slurmhealth.hooks.budget import Budget
    from slurmhealth.kernel_log import ReadResult
    from slurmhealth.model_records import Job

log = logging.getLogger("slurmhealth.check")

COUNTERS_KEY = "nvlink_counters"  # every error counter since history format 2
CURSOR_KEY = "kernel_log_cursor"
STATE_WAIT_S = 0.5  # the stored state is read before the decision: a short wait at most


class CheckResult(NamedTuple):  # a tuple: cheaper to define than a frozen dataclass
    run_id: str
    node: str
    phase: str
    job_id: str | None
    snapshot: NodeSnapshot
    findings: tuple[Finding, ...]
    duration_s: float
    recorded: bool = True
    notes: tuple[str, ...] = ()

    @property
    def worst(self) -> Severity:
        return max((f.severity for f in self.findings), default=Severity.OK)

    @property
    def status(self) -> str:
        if self.worst >= Severity.FAIL:
            return "fail"
        return "warn" if self.worst >= Severity.WARN else "ok"

    @property
    def exit_code(self) -> int:
        return 1 if self.status == "fail" else 0

    def to_dict(self) -> dict[str, Any]:
        from slurmhealth.checks.mig import gpu_details, instance_results

        instances = instance_results(self.snapshot, self.findings)
        return {
            "schema": "slurmhealth.check/1",
            "run_id": self.run_id,
            "node": self.node,
            "phase": self.phase,
            "job_id": self.job_id,
            "ts": self.snapshot.ts,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.snapshot.ts)),
            "status": self.status,
            "exit_code": self.exit_code,
            "duration_s": round(self.duration_s, 4),
            "driver_version": self.snapshot.driver_version,
            "recorded": self.recorded,
            "notes": list(self.notes),
            "gpus": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "name": g.name,
                    "pci_bus_id": g.pci_bus_id,
                    "status": g.status.value,
                    **gpu_details(g, instances),
                }
                for g in self.snapshot.gpus
            ],
            "findings": [f.to_dict() for f in self.findings],
        }


def run_check(
    cfg: Config,
    *,
    gpus: Sequence[int] | None = None,
    phase: str = "check",
    job_id: str | None = None,
    job_row: dict[str, Any] | None = None,
) -> CheckResult:
    """:func:`check_node` over the configured GPU backend and this node's history, for a
    run by hand: GPUs asked for that the node does not have are a usage error."""
    from slurmhealth.gpu import open_backend
    from slurmhealth.history import History

    history = History.for_node(cfg)
    try:
        history.refuse_newer()  # a rolled-back binary says so instead of spooling every run
        backend = open_backend(cfg)
        try:
            _require_gpus(cfg, backend, gpus)
            return check_node(
                cfg, backend, history, gpus=gpus, phase=phase, job_id=job_id, job_row=job_row
            )
        finally:
            backend.close()
    finally:
        history.close()


def _require_gpus(cfg: Config, backend: GpuBackend, gpus: Sequence[int] | None) -> None:
    """A typo (``--gpus 9`` on an 8-GPU node) is refused before anything is recorded. A GPU
    under ``gpu.expected_count`` that NVML no longer sees is no typo: the checks report it
    (as the prolog does for a GPU Slurm allocated)."""
    from slurmhealth.errors import UsageError

    have = max(len(backend.devices()), cfg.gpu.expected_count)
    if gpus and (missing := sorted(i for i in gpus if i >= have)):
        listed = ", ".join(map(str, missing))
        span = f": 0-{have - 1}" if have else ""
        raise UsageError(f"--gpus: no GPU {listed} on this node ({have} GPUs{span})")


def read_state(history: History) -> tuple[dict[str, Any], list[str]]:
    """What the last runs stored (NVLink counters, kernel-log cursor, GPU inventory), and
    a note when the history cannot be read: the check goes on without it."""
    try:
        return {key: history.kv_get(key) for key in (COUNTERS_KEY, CURSOR_KEY, INVENTORY_KEY)}, []
    except Exception as exc:  # an unreadable history must not stop the check
        return {}, [f"history unreadable, rates skipped: {exc}"]


def take_snapshot(
    backend: GpuBackend, gpus: Sequence[int] | None, stored: dict[str, Any]
) -> NodeSnapshot:
    """The GPUs' state now; a GPU that cannot be read keeps its last known identity."""
    return with_known_identity(backend.snapshot(gpus), stored.get(INVENTORY_KEY))


def read_kernel_log(
    cfg: Config,
    hint: str | None,
    stored: dict[str, Any],
    history: History,
    notes: list[str],
    budget_s: float | None = None,
) -> tuple[ReadResult, str]:
    """New kernel-log lines since the newest stored position (hooks/kernel_read.py; within
    ``budget_s``, default the configured one), and the source read; ``hint``: the GPU
    backend's own log, if any."""
    from slurmhealth.hooks.kernel_read import read_kernel_log as read_positioned
    from slurmhealth.kernel_log import KernelLogReader

    source = cfg.kernel_log.source
    if source == "auto":
        source = hint or "kmsg"
    if source == "none":  # no kernel log: no position to read, keep or report
        from slurmhealth.kernel_log import ReadResult

        return ReadResult((), {}, False, None), source
    reader = KernelLogReader(
        source,
        lookback_s=cfg.kernel_log.lookback_s,
        budget_s=cfg.kernel_log.budget_s if budget_s is None else budget_s,
        net=cfg.has_rdma(),
    )
    return read_positioned(reader, stored.get(CURSOR_KEY), history.path, notes), source


class Judged(NamedTuple):  # a tuple: cheaper to define than a frozen dataclass
    """A check's verdict and the state to store with it (see :func:`check_batch`)."""

    result: CheckResult
    state: dict[str, Any]
    mig: tuple[tuple[int, ...] | None, tuple[str, ...]] | None = None  # a MIG job's scope


def judge(
    cfg: Config,
    snapshot: NodeSnapshot,
    log_read: tuple[ReadResult, str],
    stored: dict[str, Any],
    notes: list[str],
    *,
    phase: str,
    gpus: Sequence[int] | None,
    job_id: str | None,
    duration_s: float,
    job_mig: Sequence[str] = (),
    partition: str | None = None,
) -> Judged:
    """Run the check catalog over ``snapshot`` and the new kernel-log lines (MIG: gpu_scope)."""
    from slurmhealth.checks import CheckContext, counters, run_checks, window_of
    from slurmhealth.hooks.gpu_scope import imex_for, job_scope, node_topology
    from slurmhealth.hooks.kernel_read import predating_findings
    from slurmhealth.hooks.rdma_read import read_rdma_for_checks

    scope = job_scope(cfg, snapshot, gpus, job_mig)
    snapshot, gpus = scope.snapshot, scope.gpus

    read, source = log_read
    if read.error:
        notes = [*notes, f"kernel log {source}: {read.error}"]
    net = read_rdma_for_checks(cfg, snapshot)
    ctx = CheckContext(
        snapshot=snapshot,
        phase=phase,
        gpus=None if gpus is None else tuple(gpus),
        expected_count=cfg.gpu.expected_count,
        expected_driver=cfg.gpu.expected_driver,
        nvlinks_per_model=cfg.gpu.nvlinks_per_model,
        counter_history=(remembered := counters.load(stored.get(COUNTERS_KEY))),
        xids=read.events,
        kernel_events=read.kernel_events,
        rdma=net.rdma,
        rdma_expect=net.expect,
        topology=node_topology(cfg),
        job_mig=scope.mig,
        imex=imex_for(cfg, partition),
    )
    findings = run_checks(ctx, cfg.checks.settings, cfg.checks.disabled)
    findings += predating_findings(ctx, read, cfg.checks.settings, cfg.checks.disabled)
    result = CheckResult(
        run_id=os.urandom(16).hex(),
        node=snapshot.node,
        phase=phase,
        job_id=job_id,
        snapshot=snapshot,
        findings=tuple(findings),
        duration_s=duration_s,
        notes=tuple(notes),
    )
    state = {
        COUNTERS_KEY: counters.pack(
            counters.remember(
                remembered,
                snapshot,
                window_of(cfg.checks.settings),
                {**ctx.counters, **net.counters},
            )
        ),
        CURSOR_KEY: read.cursor,
        INVENTORY_KEY: updated_inventory(stored.get(INVENTORY_KEY), snapshot),
    }
    if source == "none":
        del state[CURSOR_KEY]  # no kernel log: no position is kept
    return Judged(result, state, (gpus, scope.mig) if scope.mig else None)


def check_node(
    cfg: Config,
    backend: GpuBackend,
    history: History,
    *,
    gpus: Sequence[int] | None = None,
    phase: str = "check",
    job_id: str | None = None,
    job_row: dict[str, Any] | None = None,
) -> CheckResult:
    """Run the checks on ``gpus`` (default all) of ``backend`` and record the run in
    ``history``, with ``job_row`` upserted into ``jobs`` in the same transaction. Raises
    only for setup errors (bad settings, NVML that cannot start), never for a broken
    history: then the record is spooled and ``recorded`` is False."""
    from slurmhealth.checks import validate_settings

    t0 = time.monotonic()
    validate_settings(cfg.checks.settings, cfg.checks.disabled, cfg.sources)
    stored, notes = read_state(history)
    snapshot = take_snapshot(backend, gpus, stored)
    log_read = read_kernel_log(cfg, backend.kernel_log_hint, stored, history, notes)
    judged = judge(
        cfg, snapshot, log_read, stored, notes, phase=phase, gpus=gpus, job_id=job_id,
        duration_s=time.monotonic() - t0,
    )  # fmt: skip
    if not history.write(check_batch(cfg, judged.result, job_row, judged.state)):
        return judged.result._replace(recorded=False)
    return judged.result


def check_batch(
    cfg: Config,
    result: CheckResult,
    job_row: dict[str, Any] | None,
    state: dict[str, Any],
    more: Sequence[Row] = (),
) -> Batch:
    """The run's ``check_runs`` and ``findings`` rows, then ``more`` (the hook's drain,
    earlier killed runs), the job's row and the checks' state, in one transaction."""
    from slurmhealth.history import records, rows

    return records.batch(
        [records.check_run(rows.check_run_row(result, cfg.gpu.backend))]
        + [records.finding(rows.finding_row(result, f)) for f in result.findings]
        + [*more, *([records.job(job_row)] if job_row else [])],
        kv=state,
    )


def check_within(
    cfg: Config,
    history: History,
    open_gpu: Callable[[float], GpuBackend],
    job: Job,
    phase: str,
    budget: Budget,
) -> Judged:
    """Read the stored state, snapshot the job's GPUs, read the kernel log and judge, each
    step within the budget (keeping :data:`DECISION_RESERVE_S` for the drain and record).

    Raises :class:`BudgetSpent` when the budget runs out first, or when a step cut short
    by it did not finish (a GPU too slow for the time left is not a hung GPU: slurmhealth
    never drains because it ran out of time itself)."""
    from slurmhealth.checks import validate_settings
    from slurmhealth.hooks.budget import DECISION_RESERVE_S, bound_db_wait

    validate_settings(cfg.checks.settings, cfg.checks.disabled, cfg.sources)
    budget.enter("history read")
    bound_db_wait(history, budget.bound(STATE_WAIT_S, DECISION_RESERVE_S))
    history.refuse_newer()  # SchemaTooNew: the hook fails open, recorded in the spool
    stored, notes = read_state(history)
    budget.enter("gpu snapshot")
    budget.require(DECISION_RESERVE_S)
    snapshot, hint = _snapshot_within(cfg, open_gpu, job, phase, budget)
    snapshot = with_known_identity(snapshot, stored.get(INVENTORY_KEY))
    budget.enter("kernel log")
    budget.require(DECISION_RESERVE_S)
    log_read = read_kernel_log(
        cfg, hint, stored, history, notes, budget.bound(cfg.kernel_log.budget_s, DECISION_RESERVE_S)
    )
    budget.enter("checks")
    judged = judge(
        cfg, snapshot, log_read, stored, notes, phase=phase, gpus=job.gpus, job_id=job.job_id,
        duration_s=budget.elapsed(), job_mig=job.mig, partition=job.partition,
    )  # fmt: skip
    budget.enter("decided")
    return judged


def _snapshot_within(
    cfg: Config, open_gpu: Callable[[float], GpuBackend], job: Job, phase: str, budget: Budget
) -> tuple[NodeSnapshot, str | None]:
    """The job's GPUs, in the prolog shared with the node's other prologs
    (hooks/snapshot_cache.py; the epilog reads its own: it looks for what the job left);
    a read made here gets the snapshot timeout the budget still allows."""
    from slurmhealth.hooks.budget import DECISION_RESERVE_S, BudgetSpent
    from slurmhealth.hooks.gpu_scope import snapshot_indices
    from slurmhealth.hooks.snapshot_cache import shared_snapshot

    cut: list[float] = []

    def take(indices: Sequence[int] | None) -> tuple[NodeSnapshot, str | None]:
        timeout = budget.bound(cfg.gpu.snapshot_timeout_s, DECISION_RESERVE_S)
        if timeout < cfg.gpu.snapshot_timeout_s:
            cut.append(timeout)
        backend = open_gpu(timeout)
        try:
            return backend.snapshot(indices), backend.kernel_log_hint
        finally:
            backend.close()

    indices = snapshot_indices(cfg, job.gpus)  # every GPU where job.gpus index MIG devices
    if phase != "prolog" or indices is None:
        got: tuple[NodeSnapshot, str | None] | None = take(indices)
    else:
        run_dir = cfg.expand(cfg.paths.run_dir, job.node)
        wait = budget.bound(math.inf, DECISION_RESERVE_S)
        got = shared_snapshot(run_dir, take, indices, wait)
    if got is None:
        raise BudgetSpent(budget.stage, "another prolog held the node's snapshot lock")
    if cut and any(g.status == GpuStatus.UNRESPONSIVE for g in got[0].gpus):
        raise BudgetSpent(budget.stage, f"GPUs did not answer in the {cut[0]:.2f} s left")
    return got
