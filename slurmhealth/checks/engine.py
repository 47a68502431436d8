"""The check engine: what a check sees (:class:`CheckContext`), how it registers
(:func:`check`) and reports (:func:`finding`), and how one runs (:func:`run_check`).

The check modules import this module only; the package (``slurmhealth.checks``) imports them
to build the catalog, so nothing here imports a check module.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from slurmhealth.model import (
    Action,
    Finding,
    GpuState,
    ImexState,
    NodeSnapshot,
    Severity,
    XidEvent,
)

if TYPE_CHECKING:  # the RDMA model loads only where the devices were read
    from slurmhealth.model_records import KernelEvent  # built only where a fault was read
    from slurmhealth.rdma.model import RdmaExpect, RdmaSnapshot

PHASES = ("check", "prolog", "epilog", "healthcheck", "validate", "sidecar")
"""Where checks run: ``slurmhealth check`` by hand (a job may be running beside it), the
job's prolog and epilog, the idle node's health check (``slurmhealth check --pre-job``, or
Slurm's HealthCheckProgram), ``slurmhealth validate``, and the sidecar (each interval of a
job)."""
RUNS = PHASES[:-1]  # one-off runs (the default): the sidecar adds only the checks it maps
EVERYWHERE = PHASES
PRE_JOB = ("prolog", "healthcheck", "validate")
"""Where no job should be running: checks for a previous job's leftovers run only here, so
a check by hand on a busy node never blames the running job's own processes."""


@dataclass(frozen=True)
class CheckContext:
    """Everything a check may look at: plain data, no I/O."""

    snapshot: NodeSnapshot
    phase: str = "check"
    gpus: tuple[int, ...] | None = None  # GPUs asked for (the job's); None = all
    expected_count: int = 0
    expected_driver: str = ""
    nvlinks_per_model: Mapping[str, int] = field(default_factory=dict)
    # earlier reads of the error counters (slurmhealth.checks.counters), for rates
    counter_history: Mapping[str, Any] | None = None
    xids: tuple[XidEvent, ...] = ()
    kernel_events: tuple[KernelEvent, ...] = ()  # kernel-log faults other than Xids
    rdma: RdmaSnapshot | None = None  # the node's HCAs (slurmhealth.rdma); None = not read
    rdma_expect: RdmaExpect | None = None  # config [rdma]; None = nothing expected
    # this node's [gpu.topology."HOSTLIST"] override of its GPUs' design (checks/sku.py)
    topology: Mapping[str, Any] = field(default_factory=dict)
    job_mig: tuple[str, ...] = ()  # the job's MIG device UUIDs (CUDA_VISIBLE_DEVICES), if any
    imex: ImexState | None = None  # read where the job's partition needs multi-node NVLink

    @functools.cached_property
    def counters(self) -> dict[str, dict[str, int]]:
        """The snapshot's cumulative error counters per GPU UUID (read once per run)."""
        from slurmhealth.checks.counter_reads import counters_of

        return counters_of(self.snapshot)


CheckFn = Callable[[CheckContext, Mapping[str, float]], list[Finding]]


class CheckSpec(NamedTuple):  # a tuple: cheaper to define than a frozen dataclass
    name: str
    description: str
    fn: CheckFn
    action: Action
    hint: str
    thresholds: Mapping[str, float]
    phases: tuple[str, ...]


REGISTRY: dict[str, CheckSpec] = {}


def check(
    name: str,
    description: str,
    *,
    action: Action,
    hint: str,
    thresholds: Mapping[str, float] | None = None,
    phases: Iterable[str] = RUNS,
) -> Callable[[CheckFn], CheckFn]:
    """Register a check. A second check with the same name is a programming error."""

    def register(fn: CheckFn) -> CheckFn:
        if name in REGISTRY:
            raise ValueError(f"check {name!r} registered twice")
        if unknown := set(phases) - set(PHASES):
            raise ValueError(f"check {name!r}: unknown phase(s) {sorted(unknown)}")
        REGISTRY[name] = CheckSpec(
            name, description, fn, action, hint, dict(thresholds or {}), tuple(phases)
        )
        return fn

    return register


def finding(
    check_name: str,
    severity: Severity,
    gpu: GpuState | None,
    message: str,
    *,
    action: Action | None = None,
    hint: str | None = None,
    **evidence: Any,
) -> Finding:
    """A finding of a registered check, with its default action and hint."""
    spec = REGISTRY[check_name]
    return Finding(
        check=check_name,
        severity=severity,
        message=message,
        action=action or spec.action,
        hint=spec.hint if hint is None else hint,
        gpu=None if gpu is None else gpu.index,
        uuid=None if gpu is None else gpu.uuid,
        evidence=evidence,
    )


def resolved_thresholds(
    spec: CheckSpec, settings: Mapping[str, Mapping[str, Any]] | None
) -> dict[str, float]:
    """The thresholds a check runs with: its defaults, overridden by ``[checks.<name>]``."""
    return {**spec.thresholds, **(settings or {}).get(spec.name, {})}


def run_check(
    spec: CheckSpec, ctx: CheckContext, settings: Mapping[str, Mapping[str, float]] | None = None
) -> list[Finding]:
    """Run one check with its thresholds; a crash is one warning finding (fail open, loudly)."""
    try:
        return spec.fn(ctx, resolved_thresholds(spec, settings))
    except Exception as exc:
        import traceback

        return [
            Finding(
                check=spec.name,
                severity=Severity.WARN,
                message=f"check crashed: {type(exc).__name__}: {exc}",
                action=Action.RECORD,
                hint="a slurmhealth bug: report it with this message",
                evidence={"traceback": traceback.format_exc(limit=5)},
            )
        ]


def readable(ctx: CheckContext) -> list[GpuState]:
    """The GPUs of the snapshot that answered (lost/unresponsive ones have their own checks)."""
    return [g for g in ctx.snapshot.gpus if g.readable]
