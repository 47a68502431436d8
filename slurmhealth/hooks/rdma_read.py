"""The node's RDMA devices as the network checks read them (docs/network.md), for
hooks/check.py: nothing of the RDMA layer is imported on a node without any."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from slurmhealth.config import Config
    from slurmhealth.model import NodeSnapshot


class RdmaRead(NamedTuple):
    """What the network checks are given: the devices, what ``[rdma]`` expects of them,
    and their error counters for the rate windows. All None/empty on a node without any."""

    rdma: Any = None  # slurmhealth.rdma.model.RdmaSnapshot
    expect: Any = None  # slurmhealth.rdma.model.RdmaExpect
    counters: Mapping[str, Mapping[str, int]] = MappingProxyType({})


def read_rdma_for_checks(cfg: Config, snapshot: NodeSnapshot) -> RdmaRead:
    """The node's RDMA devices for the network checks (docs/network.md); nothing of the
    RDMA layer is even imported on a node without any (the check path stays fast)."""
    if not cfg.has_rdma(snapshot.node or None):
        return RdmaRead()
    from slurmhealth.checks.network import rdma_counters_of
    from slurmhealth.rdma import expect_from
    from slurmhealth.rdma.model import ERROR_COUNTERS
    from slurmhealth.rdma.sysfs import read_rdma

    buses = [g.pci_bus_id for g in snapshot.gpus if g.pci_bus_id]
    root = cfg.rdma_root(snapshot.node or None)
    rdma = read_rdma(root, hw_counters=False, counters=ERROR_COUNTERS, gpu_pci_bus_ids=buses,
                     ts=snapshot.ts)  # fmt: skip
    return RdmaRead(rdma, expect_from(cfg), rdma_counters_of(rdma))
