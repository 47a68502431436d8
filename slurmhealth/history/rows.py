"""Row shapes: the dicts written to each table, built in one place.

Builders take the project's own records (a check result, a finding, a snapshot, a detector
event through small protocols; the job as ``model_records.Job``, the one job record), so
this adapter imports nothing above the model.
``None`` in an upserted row never overwrites a stored value.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from slurmhealth.history.schema import SAMPLE_COLUMNS
from slurmhealth.model import Finding, NodeSnapshot, Severity

if TYPE_CHECKING:
    from slurmhealth.model_records import Job

# GPU fields a ``samples`` row keeps, each in its column (``schema.SAMPLE_COLUMNS``)
SAMPLE_FIELDS = (
    "utilization_gpu_pct", "utilization_memory_pct", "memory_used_bytes", "temperature_c",
    "margin_temperature_c", "power_w", "power_limit_w", "energy_j", "sm_clock_mhz",
    "clock_event_reasons", "pcie_gen", "pcie_width", "pcie_replay_errors",
    "ecc_volatile_uncorrectable", "remapped_rows_uncorrectable",
)  # fmt: skip


class CheckRun(Protocol):
    """A finished check run (``hooks.check.CheckResult``)."""

    @property
    def run_id(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def phase(self) -> str: ...
    @property
    def job_id(self) -> str | None: ...
    @property
    def snapshot(self) -> NodeSnapshot: ...
    @property
    def status(self) -> str: ...
    @property
    def exit_code(self) -> int: ...
    @property
    def duration_s(self) -> float: ...


class Noticed(Protocol):
    """A detector's event (``sidecar.state.Event``)."""

    @property
    def ts(self) -> float: ...
    @property
    def kind(self) -> str: ...
    @property
    def severity(self) -> Severity: ...
    @property
    def message(self) -> str: ...
    @property
    def gpu(self) -> int | None: ...
    @property
    def uuid(self) -> str | None: ...
    @property
    def evidence(self) -> Mapping[str, Any]: ...


def check_run_row(run: CheckRun, backend: str) -> dict[str, Any]:
    """The ``check_runs`` row of a run on the GPU ``backend`` (nvml | sim)."""
    return {
        "run_id": run.run_id,
        "ts": run.snapshot.ts,
        "node": run.node,
        "job_id": run.job_id,
        "phase": run.phase,
        "gpus": [g.index for g in run.snapshot.gpus],
        "status": run.status,
        "exit_code": run.exit_code,
        "duration_s": run.duration_s,
        "backend": backend,
        "error": run.snapshot.error,
    }


def finding_row(run: CheckRun, f: Finding) -> dict[str, Any]:
    """The ``findings`` row of one finding of ``run``."""
    return {
        "run_id": run.run_id,
        "ts": run.snapshot.ts,
        "node": run.node,
        "job_id": run.job_id,
        "check_name": f.check,
        "severity": f.severity.label,
        "severity_value": int(f.severity),
        "gpu": f.gpu,
        "uuid": f.uuid,
        "message": f.message,
        "action": f.action.value,
        "hint": f.hint,
        "evidence": dict(f.evidence),
    }


def sample_columns(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The ``samples`` columns of a GPU's ``metrics`` (field name -> value); the fields
    without a column stay in the ``metrics`` JSON (None when there are none)."""
    rest = {k: v for k, v in metrics.items() if k not in SAMPLE_COLUMNS}
    cols = {col: metrics.get(key) for key, col in SAMPLE_COLUMNS.items()}
    return {"metrics": rest or None, **cols}


def sample_rows(snapshot: NodeSnapshot, job_id: str) -> list[dict[str, Any]]:
    """One ``samples`` row per GPU: its fields in their columns (None: unknown)."""
    rows = []
    for g in snapshot.gpus:
        metrics = {k: v for k in SAMPLE_FIELDS if (v := getattr(g, k)) is not None}
        if g.nvlinks:
            metrics["nvlink_active"] = sum(1 for link in g.nvlinks if link.active)
            metrics["nvlink_errors"] = sum(
                (link.replay_errors or 0) + (link.recovery_errors or 0) for link in g.nvlinks
            )
        metrics["status"] = g.status.value
        rows.append(
            {
                "ts": snapshot.ts,
                "node": snapshot.node,
                "job_id": job_id,
                "gpu": g.index,
                "uuid": g.uuid,
                **sample_columns(metrics),
            }
        )
    return rows


def task_row(stats: Mapping[str, Any], snapshot: NodeSnapshot, job_id: str) -> dict[str, Any]:
    """The GPU-less ``samples`` row of what the training loop reported (``stats``)."""
    metrics = {k: v for k, v in stats.items() if v is not None}
    return {
        "ts": snapshot.ts,
        "node": snapshot.node,
        "job_id": job_id,
        "gpu": None,
        "uuid": None,
        "metrics": {"kind": "task", **metrics},
    }


def event_row(event: Noticed, node: str, job_id: str) -> dict[str, Any]:
    """The ``events`` row of a detector's event."""
    return {
        "ts": event.ts,
        "node": node,
        "job_id": job_id,
        "gpu": event.gpu,
        "uuid": event.uuid,
        "kind": event.kind,
        "severity": event.severity.label,
        "message": event.message,
        "evidence": dict(event.evidence),
    }


def job_row(job: Job, **extra: Any) -> dict[str, Any]:
    """The ``jobs`` row (None values never overwrite what is stored), plus ``extra``
    columns (``start_ts``, ``end_ts``, ``exit_code``, ``state``)."""
    return {
        "job_id": job.job_id,
        "node": job.node,
        "user": job.user or None,
        "uid": job.uid,
        "account": job.account or None,
        "partition": job.partition or None,
        "qos": job.qos or None,
        "priority": job.priority,
        "nodes": job.nodes or None,
        "gpus": list(job.gpus),
        **extra,
    }


def drain_row(
    ts: float, node: str, state: str, reason: str, actor: str, detail: Mapping[str, Any]
) -> dict[str, Any]:
    """A ``drains`` row: ``state`` drained | suppressed | failed | already | resumed |
    resume_refused, by ``actor`` (our phase, or the operator who resumed)."""
    return {"ts": ts, "node": node, "state": state, "reason": reason, "actor": actor,
            "detail": dict(detail)}  # fmt: skip


def evidence_rows(
    ts: float, job_id: str, node: str, folder: str, entries: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """One ``evidence`` row per bundle file (manifest entries: name, sha256, size, source)."""
    return [
        {"ts": ts, "job_id": job_id, "node": node, "path": os.path.join(folder, e["name"]),
         "sha256": e["sha256"], "size": e["size"], "kind": e["source"]}
        for e in entries
    ]  # fmt: skip


def remediation_row(
    node: str,
    action: str,
    outcome: str,
    *,
    started: float,
    ended: float | None,
    fault: str = "",
    gpus: Iterable[int] = (),
    job_id: str | None = None,
    detail: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A ``remediations`` row: one step (reset | validate | reboot | resume |
    service_required) of a node's repair, its outcome, the fault and the job that met it."""
    return {"ts": started, "node": node, "job_id": job_id, "gpus": list(gpus), "fault": fault,
            "action": action, "started": started, "ended": ended, "outcome": outcome,
            "detail": dict(detail or {})}  # fmt: skip
