"""The job's node's RDMA ports while the job runs: one sysfs read per sampling interval for
the Prometheus series (port state, error counters, bytes moved) and the ``ib_errors`` /
``ib_port_down`` events.

The judgement is the check catalog's (:mod:`slurmhealth.checks.network`): each read runs the
``ib_errors`` and ``ib_port_state`` checks with the site's ``[checks.<name>]`` thresholds and
``[checks] disabled`` list over the counters read since the job started (the same rate
windows as the prolog's). Here only time: an event fires once when its port's failing
finding starts, and again only after it has cleared.

Nothing of this runs unless ``[rdma]`` is enabled and, when the sidecar starts,
``<sysfs_root>/class/infiniband`` exists or ``expected_hcas`` says it must
(:meth:`slurmhealth.config.Config.has_rdma`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from slurmhealth.checks import CheckContext, catalog, run_check, window_of
from slurmhealth.checks.counters import History, remember
from slurmhealth.checks.network import rdma_counters_of
from slurmhealth.metrics.job_series import RDMA_ERROR_COUNTERS
from slurmhealth.model import NodeSnapshot
from slurmhealth.sidecar.state import Event

if TYPE_CHECKING:
    from slurmhealth.config import Config
    from slurmhealth.rdma.model import RdmaExpect, RdmaSnapshot

DATA_COUNTERS = ("port_xmit_data", "port_rcv_data")  # 4-byte words

EVENT_KINDS = {"ib_errors": "ib_errors", "ib_port_state": "ib_port_down"}
"""The sidecar event a failing finding of each network check becomes."""


def configured(cfg: Config, node: str | None = None) -> bool:
    """Whether ``node`` has RDMA devices the sidecar should sample (``[rdma]``)."""
    return cfg.has_rdma(node)


class RdmaWatch:
    """One job's sampler and detector of the node's RDMA ports."""

    def __init__(self, cfg: Config, node: str | None = None) -> None:
        from slurmhealth.rdma import expect_from

        self.root = cfg.rdma_root(node)
        self._checks = cfg.checks
        self.expect: RdmaExpect = expect_from(cfg)
        self._counters: History = {}
        self._window = window_of(cfg.checks.settings)
        self._active: set[tuple[str, str]] = set()
        self._gpus: Any = None  # the GPUs' PCIe paths, resolved once (they do not move)

    def read(self, snapshot: NodeSnapshot) -> RdmaSnapshot:
        """The ports' state and the exported counters, stamped with the snapshot's time.
        The first read resolves the GPUs NVML listed (their PCIe paths); later ones reuse
        them and list no PCI device."""
        from slurmhealth.rdma.sysfs import read_rdma

        first = self._gpus is None
        buses = [g.pci_bus_id for g in snapshot.gpus if g.pci_bus_id] if first else []
        rdma = read_rdma(self.root, hw_counters=False, gpu_pci_bus_ids=buses, ts=snapshot.ts,
                         counters=(*RDMA_ERROR_COUNTERS, *DATA_COUNTERS))  # fmt: skip
        if first:
            self._gpus = rdma.gpus
        return replace(rdma, gpus=self._gpus)

    def observe(self, rdma: RdmaSnapshot, snapshot: NodeSnapshot) -> list[Event]:
        """The events that start with this read: a port whose ``ib_errors`` or
        ``ib_port_state`` finding fails now and did not at the previous read."""
        ctx = CheckContext(
            snapshot=snapshot,
            phase="sidecar",
            counter_history=self._counters,
            rdma=rdma,
            rdma_expect=self.expect,
        )
        found: dict[tuple[str, str], Any] = {}
        for name, kind in EVENT_KINDS.items():
            if name in self._checks.disabled:
                continue
            for f in run_check(catalog()[name], ctx, self._checks.settings):
                where = f"{f.evidence.get('hca')}/{f.evidence.get('port')}"
                if f.failing and f.evidence.get("hca"):
                    found.setdefault((kind, where), f)
        remember(self._counters, snapshot, self._window, rdma_counters_of(rdma))
        out = []
        for key in sorted(found):
            if key not in self._active:
                f = found[key]
                ev = {**f.evidence, "check": f.check, "action": f.action.value, "hint": f.hint}
                msg = f"{key[0]} {f.message}"
                out.append(Event(rdma.ts, key[0], f.severity, msg, None, None, ev))
        self._active = set(found)
        return out


def job_ports(rdma: RdmaSnapshot, expect: RdmaExpect) -> RdmaSnapshot:
    """What the job's series show: the ports the checks judge (``[rdma] devices`` /
    ``link_layer``: a management NIC is not the job's network) of the HCAs behind the job's
    GPUs (``rdma.gpus`` are the job's: a 1-GPU job on an 8-HCA node shows one HCA); all the
    judged ports when no HCA is known to be behind them."""
    from slurmhealth.rdma.model import gpus_near

    hcas = [replace(h, ports=tuple(p for p in h.ports if expect.judged(p))) for h in rdma.hcas]
    hcas = [h for h in hcas if h.ports]
    near = [h for h in hcas if gpus_near(h, rdma.gpus, rdma.hcas)]
    return replace(rdma, hcas=tuple(near or hcas))


def exports_rdma(mode: str, nodes: str) -> bool:
    """Whether the job's RDMA ports become series (``[metrics] rdma_series``): a job on one
    node (or whose node list cannot be read) exports them only with ``all``."""
    if mode in ("all", "none"):
        return mode == "all"
    from slurmhealth.slurm.base import HostlistError, expand_hostlist

    try:
        return len(expand_hostlist(nodes)) > 1
    except HostlistError:
        return False
