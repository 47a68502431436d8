"""This node's ``[gpu.topology."HOSTLIST"]`` override of its GPUs' design (checks/sku.py),
for the prolog's and epilog's checks (hooks/gpu_scope.py) and the sidecar's detectors."""

from __future__ import annotations

from typing import Any

from slurmhealth.config import Config
from slurmhealth.errors import ConfigError


def node_topology(cfg: Config, *, strict: bool = True) -> dict[str, Any]:
    """The first table whose hostlist names this node, validated; ``strict=False`` (the
    sidecar, whose prolog already refused a bad table): a bad table is no override."""
    from slurmhealth.checks.sku import node_override
    from slurmhealth.slurm.base import expand_hostlist

    source = cfg.sources.get("gpu.topology", "config")
    try:
        return node_override(cfg.gpu.topology, cfg.node_name, expand_hostlist, source)
    except ConfigError:
        if strict:
            raise
        return {}
