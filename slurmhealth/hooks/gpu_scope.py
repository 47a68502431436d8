"""Which GPUs (and MIG instances) a run judges, and which design they are judged by.

- ``[gpu] mig_gres = true``: the node's Slurm GPU GRES are MIG devices (typed MIG GPUs in
  gres.conf, or AutoDetect=nvml with MIG on), so ``SLURM_JOB_GPUS`` indexes MIG devices in
  NVML order, not GPUs (checks/mig.py :func:`resolve`). MIG UUIDs (``MIG-...``) a job names
  are mapped by UUID on any node. The run then judges the parent GPUs (shared hardware) and
  the job's instances.
- ``[gpu.topology."HOSTLIST"]``: this node's GPU design where it departs from the SKU
  table (checks/sku.py), the first hostlist that names the node.
- ``[gpu] imex_partitions``: the partitions whose jobs need IMEX (multi-node NVLink).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from slurmhealth.sidecar.topology import node_topology

__all__ = ["Scope", "imex_for", "job_scope", "node_topology", "snapshot_indices"]


if TYPE_CHECKING:
    from slurmhealth.config import Config
    from slurmhealth.model import ImexState, NodeSnapshot


class Scope(NamedTuple):
    snapshot: NodeSnapshot  # the parents of the job's devices (all GPUs without a job)
    gpus: tuple[int, ...] | None
    mig: tuple[str, ...]  # the job's MIG device UUIDs


def snapshot_indices(cfg: Config, gpus: Sequence[int] | None) -> Sequence[int] | None:
    """The GPU indices to read for a job's ``gpus``: every GPU where they index MIG
    devices (which GPU holds MIG device N is known only from the read)."""
    return None if cfg.gpu.mig_gres and gpus else gpus


def job_scope(
    cfg: Config, snapshot: NodeSnapshot, gpus: Sequence[int] | None, job_mig: Sequence[str]
) -> Scope:
    """The GPUs and MIG instances of the job (unchanged where nothing is MIG)."""
    if not ((cfg.gpu.mig_gres and gpus) or job_mig):
        return Scope(snapshot, None if gpus is None else tuple(gpus), ())
    from slurmhealth.checks.mig import resolve

    gres = tuple(gpus or ()) if cfg.gpu.mig_gres else ()
    parents, migs = resolve(snapshot, gres, job_mig)
    # also the plain GPU indices a mixed list names (on a node without mig_gres)
    parents = tuple(sorted({*parents, *(() if cfg.gpu.mig_gres else gpus or ())}))
    kept = tuple(g for g in snapshot.gpus if g.index in parents)
    return Scope(dataclasses.replace(snapshot, gpus=kept), parents, migs)


def imex_for(cfg: Config, partition: str | None) -> ImexState | None:
    """The node's IMEX state where the job's partition runs multi-node NVLink jobs
    (``[gpu] imex_partitions``, ``"*"`` for every partition and for runs without a job)."""
    wanted = cfg.gpu.imex_partitions
    if not wanted or ("*" not in wanted and (partition or "") not in wanted):
        return None
    from slurmhealth.gpu.imex import read_imex

    return read_imex(cfg.expand(cfg.gpu.imex_channel_dir))
