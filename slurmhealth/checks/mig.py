"""MIG: a job's MIG devices mapped to their parent GPU and GPU/compute instance, the
instance-level checks, and each instance's result.

What is shared and what is not (NVIDIA's MIG user guide): the GPU instances of one GPU share
its memory ECC, row remapper, thermals, power and PCIe link, so those checks run on the
parent GPU and their verdict holds for every instance; memory use and processes belong to
an instance and are judged there; NVLink is not used in MIG mode (``nvlink_inactive`` does
not judge it). An Xid line naming an instance (``GPU-I:NN``) that the driver contained
affects the jobs on that instance only. Slurm drains nodes, not GPUs or instances: see
docs/mig.md for what slurmhealth does when one instance of one GPU is bad.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from slurmhealth.checks.engine import PRE_JOB, CheckContext, check, finding, readable
from slurmhealth.model import (
    Action,
    Finding,
    GpuState,
    MigDevice,
    NodeSnapshot,
    Severity,
    fabric_health,
)


def mig_order(snapshot: NodeSnapshot) -> list[tuple[GpuState, MigDevice | None]]:
    """The node's GPU devices in the order Slurm's AutoDetect=nvml lists GPU GRES (and
    ``nvidia-smi -L``): by GPU index; a GPU in MIG mode stands for its MIG devices in
    NVML's order, any other GPU for itself."""
    out: list[tuple[GpuState, MigDevice | None]] = []
    for g in sorted(snapshot.gpus, key=lambda x: x.index):
        if g.mig_mode and g.mig_devices:
            out += [(g, m) for m in g.mig_devices]
        else:
            out.append((g, None))
    return out


def resolve(
    snapshot: NodeSnapshot, gres: Sequence[int], uuids: Iterable[str] = ()
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The parent GPU indices and MIG UUIDs of a job's devices: ``gres`` indices into
    :func:`mig_order` (a GRES index past the end names nothing), and MIG UUIDs (``MIG-...``
    as CUDA_VISIBLE_DEVICES holds them) found by UUID."""
    order = mig_order(snapshot)
    parents: set[int] = set()
    migs: list[str] = []
    for i in gres:
        if 0 <= i < len(order):
            gpu, mig = order[i]
            parents.add(gpu.index)
            if mig is not None and mig.uuid:
                migs.append(mig.uuid)
    wanted = {u.strip() for u in uuids if u.strip()}
    for gpu, mig in order:
        if mig is not None and mig.uuid in wanted:
            parents.add(gpu.index)
            migs.append(mig.uuid)
    return tuple(sorted(parents)), tuple(dict.fromkeys(migs))


def only_instances(snapshot: NodeSnapshot, uuids: Sequence[str]) -> NodeSnapshot:
    """``snapshot`` with each MIG GPU's instances cut to the job's (``uuids``), so a job's
    series and detectors see its own slices only; unchanged when the job names none."""
    if not uuids:
        return snapshot
    keep = set(uuids)
    gpus = tuple(
        dataclasses.replace(g, mig_devices=tuple(m for m in g.mig_devices if m.uuid in keep))
        if g.mig_devices
        else g
        for g in snapshot.gpus
    )
    return dataclasses.replace(snapshot, gpus=gpus)


def instance_id(gpu_instance: str | None) -> int | None:
    """The GPU instance id of an Xid line's ``GPU-I:05`` (decimal, or hex with letters)."""
    if not gpu_instance or ":" not in gpu_instance:
        return None
    text = gpu_instance.split(":", 1)[1]
    try:
        return int(text, 10 if text.isdigit() else 16)
    except ValueError:
        return None


def instance_of(gpu: GpuState | None, gi: int | None) -> MigDevice | None:
    """The MIG device of ``gpu`` with GPU instance id ``gi``."""
    if gpu is None or gi is None:
        return None
    return next((m for m in gpu.mig_devices or () if m.gpu_instance_id == gi), None)


def _in_scope(ctx: CheckContext, mig: MigDevice) -> bool:
    return not ctx.job_mig or mig.uuid in ctx.job_mig


@check(
    "mig_instance",
    "Before a job, a MIG instance holds no process and no more than max_memory_used_mib of "
    "memory (the job's instances where the job names them, else every instance). An "
    "instance's own trouble warns and never drains: the node's other instances keep "
    "serving their jobs (docs/mig.md).",
    action=Action.WARN,
    hint="a previous job left processes or memory on this MIG instance: check "
    "`nvidia-smi -q -i N` (MIG devices) and kill the leftovers; reset the instance "
    "(nvidia-smi mig -dci/-dgi, recreate) if they do not go",
    thresholds={"max_memory_used_mib": 64},
    phases=PRE_JOB,
)
def mig_instance(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    out = []
    for g in readable(ctx):
        for m in (g.mig_devices or ()) if g.mig_mode else ():
            if not _in_scope(ctx, m):
                continue
            procs = len(m.processes or ())
            used = None if m.memory_used_bytes is None else m.memory_used_bytes >> 20
            if procs or (used is not None and used > th["max_memory_used_mib"]):
                out.append(
                    finding(
                        "mig_instance",
                        Severity.WARN,
                        g,
                        f"MIG instance GI {m.gpu_instance_id} ({m.uuid}): {procs} process(es), "
                        f"{used} MiB used before the job",
                        **mig_evidence(m),
                        processes=procs,
                        memory_used_mib=used,
                    )
                )
    return out


def mig_evidence(m: MigDevice) -> dict[str, Any]:
    """What names an instance in a finding's evidence (read by :func:`instance_results`)."""
    return {"mig_uuid": m.uuid, "gpu_instance": m.gpu_instance_id,
            "compute_instance": m.compute_instance_id}  # fmt: skip


def instance_results(
    snapshot: NodeSnapshot, findings: Sequence[Finding], scope: Sequence[str] = ()
) -> dict[int, list[dict[str, Any]]]:
    """Each MIG instance's result, per parent GPU index: the worst finding that names the
    instance, or one on its parent GPU that names no instance (shared hardware)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for g in snapshot.gpus:
        if not g.mig_mode:
            continue
        shared = [f for f in findings if f.gpu == g.index and "mig_uuid" not in f.evidence]
        rows = []
        for m in g.mig_devices or ():
            own = [f for f in findings if f.evidence.get("mig_uuid") == m.uuid]
            worst = max((f.severity for f in [*shared, *own]), default=Severity.OK)
            rows.append(
                {
                    **mig_evidence(m),
                    "index": m.index,
                    "name": m.name,
                    "memory_total_bytes": m.memory_total_bytes,
                    "memory_used_bytes": m.memory_used_bytes,
                    "processes": None if m.processes is None else len(m.processes),
                    "job": m.uuid in scope if scope else None,
                    "status": worst.label,
                    "checks": sorted({f.check for f in [*shared, *own]}),
                }
            )
        out[g.index] = rows
    return out


def gpu_details(g: GpuState, instances: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """A GPU's MIG instances with their own results, and its NVLink fabric registration
    where NVML reports one (clique, cluster, health), for ``check --json``."""
    out: dict[str, Any] = {}
    if g.mig_mode is not None:
        out["mig_mode"] = g.mig_mode
    if g.index in instances:
        out["mig"] = instances[g.index]
    if g.fabric_clique_id is not None or g.fabric_health_mask:
        out["fabric"] = {
            "state": g.fabric_state,
            "clique_id": g.fabric_clique_id,
            "cluster_uuid": g.fabric_cluster_uuid,
            "health": fabric_health(g.fabric_health_mask or 0),
        }
    return out
