"""The RDMA network (InfiniBand and RoCE HCAs): the kernel's view read from sysfs.

:mod:`.model` holds the plain data (ports, HCAs, the PCIe paths to the GPUs),
:mod:`.sysfs` reads it, :mod:`.simtree` writes generated trees in the same format for tests
and the demo, :mod:`.ibstat` reads ``ibstat`` output (evidence bundles).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slurmhealth.rdma.model import RdmaExpect, RdmaSnapshot
from slurmhealth.rdma.sysfs import read_rdma

if TYPE_CHECKING:
    from slurmhealth.config import Config

__all__ = ["RdmaExpect", "RdmaSnapshot", "expect_from", "read_rdma"]


def expect_from(cfg: Config) -> RdmaExpect:
    """What ``[rdma]`` in the config says the node should have."""
    r = cfg.rdma
    return RdmaExpect(
        hca_count=r.expected_hcas,
        rate_gbps=r.expected_rate_gbps,
        gpudirect=r.gpudirect,
        link_layer=r.link_layer,
        devices=tuple(r.devices),
    )
