"""The node's RDMA devices as the network checks read them (docs/network.md), for
hooks/check.py: nothing of the RDMA layer is imported on a node without any."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slurmhealth.config import Config
    from slurmhealth.model import NodeSnapshot


def read_rdma_for_checks(
    cfg: Config, snapshot: NodeSnapshot
) -> tuple[Any, dict[str, dict[str, int]]]:
    """The node's RDMA devices for the network checks (docs/network.md) and their error
    counters for the rate windows; (None, {}) on a node without any, where nothing of the
    RDMA layer is even imported (the check path stays as fast as before)."""
    if not cfg.has_rdma(snapshot.node or None):
        return None, {}
    from slurmhealth.checks.network import rdma_counters_of
    from slurmhealth.rdma.model import ERROR_COUNTERS
    from slurmhealth.rdma.sysfs import read_rdma

    buses = [g.pci_bus_id for g in snapshot.gpus if g.pci_bus_id]
    root = cfg.rdma_root(snapshot.node or None)
    rdma = read_rdma(root, hw_counters=False, counters=ERROR_COUNTERS, gpu_pci_bus_ids=buses,
                     ts=snapshot.ts)  # fmt: skip
    return rdma, rdma_counters_of(rdma)


def rdma_expect(cfg: Config) -> Any:
    from slurmhealth.rdma import expect_from

    return expect_from(cfg)
