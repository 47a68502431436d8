"""One health-check run: snapshot the GPUs, read new Xids, run the catalog, record it.

Used by ``slurmhealth check`` and (with another phase) by the prolog, epilog and
``validate``. The decision never depends on the history being writable: when the database
cannot be written the records go to the spool, and the result is the same.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slurmhealth.config import Config
from slurmhealth.model import Finding, NodeSnapshot, Severity

if TYPE_CHECKING:
    from slurmhealth.gpu import GpuBackend
    from slurmhealth.history import Batch, History

log = logging.getLogger("slurmhealth.check")

COUNTERS_KEY = "nvlink_counters"  # every error counter since history format 2
INVENTORY_KEY = "gpu_inventory"
_IDENTITY = ("uuid", "pci_bus_id", "serial", "name")
CURSOR_KEY = "kernel_log_cursor"


@dataclass(frozen=True)
class CheckResult:
    run_id: str
    node: str
    phase: str
    job_id: str | None
    snapshot: NodeSnapshot
    findings: tuple[Finding, ...]
    duration_s: float
    recorded: bool = True
    notes: tuple[str, ...] = field(default_factory=tuple)

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
                }
                for g in self.snapshot.gpus
            ],
            "findings": [f.to_dict() for f in self.findings],
        }


def _inventory(previous: Any, snapshot: NodeSnapshot) -> dict[str, dict[str, Any]]:
    """Last known identity of each GPU index (UUID, bus id, serial), updated from readable
    GPUs, so a GPU that is lost or hung can still be named for the RMA ticket."""
    inv = dict(previous) if isinstance(previous, dict) else {}
    for g in snapshot.gpus:
        if g.readable and g.uuid:
            inv[str(g.index)] = {k: getattr(g, k) for k in _IDENTITY}
    return inv


def _with_known_identity(snapshot: NodeSnapshot, inventory: Any) -> NodeSnapshot:
    if not isinstance(inventory, dict):
        return snapshot
    gpus = []
    for g in snapshot.gpus:
        known = inventory.get(str(g.index))
        if not g.readable and g.uuid is None and isinstance(known, dict):
            g = dataclasses.replace(
                g,
                uuid=known.get("uuid"),
                pci_bus_id=known.get("pci_bus_id"),
                serial=known.get("serial"),
                name=known.get("name"),
            )
        gpus.append(g)
    return dataclasses.replace(snapshot, gpus=tuple(gpus))


def run_check(
    cfg: Config,
    *,
    gpus: Sequence[int] | None = None,
    phase: str = "check",
    job_id: str | None = None,
    job_row: dict[str, Any] | None = None,
) -> CheckResult:
    """:func:`check_node` over the configured GPU backend and this node's history."""
    from slurmhealth.gpu import open_backend
    from slurmhealth.history import History

    history = History.for_node(cfg)
    try:
        backend = open_backend(cfg)
        try:
            return check_node(
                cfg, backend, history, gpus=gpus, phase=phase, job_id=job_id, job_row=job_row
            )
        finally:
            backend.close()
    finally:
        history.close()


def _read_state(history: History) -> tuple[dict[str, Any], list[str]]:
    """What the last runs stored (NVLink counters, kernel-log cursor, GPU inventory), and
    a note when the history cannot be read: the check goes on without it."""
    try:
        return {key: history.kv_get(key) for key in (COUNTERS_KEY, CURSOR_KEY, INVENTORY_KEY)}, []
    except Exception as exc:  # an unreadable history must not stop the check
        return {}, [f"history unreadable ({type(exc).__name__}: {exc}); rates skipped"]


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
    from slurmhealth.checks import CheckContext, counters, run_checks, validate_settings
    from slurmhealth.hooks.kernel_read import predating_findings, read_kernel_log
    from slurmhealth.kernel_log import KernelLogReader

    t0 = time.monotonic()
    validate_settings(cfg.checks.settings, cfg.checks.disabled, cfg.sources)
    stored, notes = _read_state(history)
    previous, inventory = stored.get(COUNTERS_KEY), stored.get(INVENTORY_KEY)
    snapshot = _with_known_identity(backend.snapshot(gpus), inventory)
    source = cfg.kernel_log.source
    if source == "auto":
        source = backend.kernel_log_hint or "kmsg"
    reader = KernelLogReader(
        source, lookback_s=cfg.kernel_log.lookback_s, budget_s=cfg.kernel_log.budget_s
    )
    log_read = read_kernel_log(reader, stored.get(CURSOR_KEY), history.path, notes)
    if log_read.error:
        notes.append(f"kernel log {source}: {log_read.error}")
    ctx = CheckContext(
        snapshot=snapshot,
        phase=phase,
        gpus=None if gpus is None else tuple(gpus),
        expected_count=cfg.gpu.expected_count,
        expected_driver=cfg.gpu.expected_driver,
        nvlinks_per_model=cfg.gpu.nvlinks_per_model,
        counter_history=(remembered := counters.load(previous)),
        xids=log_read.events,
        kernel_events=log_read.kernel_events,
    )
    findings = run_checks(ctx, cfg.checks.settings, cfg.checks.disabled)
    findings += predating_findings(ctx, log_read, cfg.checks.settings, cfg.checks.disabled)
    result = CheckResult(
        run_id=os.urandom(16).hex(),
        node=snapshot.node,
        phase=phase,
        job_id=job_id,
        snapshot=snapshot,
        findings=tuple(findings),
        duration_s=time.monotonic() - t0,
        notes=tuple(notes),
    )
    state = {
        COUNTERS_KEY: counters.pack(
            counters.remember(
                remembered, snapshot, counters.window_of(cfg.checks.settings), ctx.counters
            )
        ),
        CURSOR_KEY: log_read.cursor,
        INVENTORY_KEY: _inventory(inventory, snapshot),
    }
    if not history.write(_batch(cfg, result, job_row, state)):
        return dataclasses.replace(result, recorded=False)
    return result


def _batch(
    cfg: Config, result: CheckResult, job_row: dict[str, Any] | None, state: dict[str, Any]
) -> Batch:
    from slurmhealth.history import Batch, rows

    return Batch(
        inserts=[("check_runs", rows.check_run_row(result, cfg.gpu.backend))]
        + [("findings", rows.finding_row(result, f)) for f in result.findings],
        upserts=[("jobs", job_row, "job_id")] if job_row else [],
        kv=state,
    )
