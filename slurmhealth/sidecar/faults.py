"""Kernel-reported faults while the job runs: Xids and the faults that come without one.

The judgement is the checks': an Xid by :func:`slurmhealth.checks.xid_table.judge` (the
catalog, overridden by the line's own ``Contained:``/``RST:``/``D-RST:`` fields, so a
contained Xid 94 is a warning, not a drain), the other kernel faults (fallen off the bus,
GSP timeout, driver init failure, SXid, PCIe AER) by the ``kernel_log`` check. Here only
what belongs to the job: the job's GPUs, deduplication across the two Xid sources.

Pure: no I/O, no clock reads.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from slurmhealth.checks import CheckContext, catalog, run_check
from slurmhealth.checks.xid_table import judge
from slurmhealth.config import ChecksConfig
from slurmhealth.model import NodeSnapshot, XidEvent
from slurmhealth.model import normalize_pci_bus_id as _norm_bus
from slurmhealth.model_records import KernelEvent
from slurmhealth.sidecar.state import Event

XID_DEDUPE_S = 2.0  # the same Xid on the same GPU this close in time: one event (two sources)


def _bus(text: str) -> str:
    try:
        return _norm_bus(text)
    except ValueError:
        return text


class KernelFaults:
    """``xid`` and ``kernel`` events of one job's GPUs (``gpus``; empty: every GPU)."""

    def __init__(self, checks: ChecksConfig, gpus: Sequence[int]) -> None:
        self._checks = checks
        self.gpus = tuple(gpus)
        self._xids_seen: deque[tuple[int, str, float]] = deque(maxlen=64)

    def xids(
        self,
        xids: Sequence[XidEvent],
        gpu_by_bus: Mapping[str, int],
        uuid_by_gpu: Mapping[int, str | None],
        default_ts: float,
        last: NodeSnapshot | None,
    ) -> list[Event]:
        """One ``xid`` event per Xid of the job (see ``Detectors.observe_xids``)."""
        if "xid" in self._checks.disabled:
            return []
        buses: dict[str, int] = {}
        for bus, idx in gpu_by_bus.items():
            try:
                buses[_norm_bus(bus)] = idx
            except ValueError:
                continue
        covered = set(self.gpus) <= set(buses.values())
        out = []
        for x in xids:
            bus = _bus(x.pci_bus_id)
            gpu = buses.get(bus)
            if self.gpus and (gpu not in self.gpus if gpu is not None else covered):
                continue
            ts = x.ts if x.ts is not None else default_ts
            seen = self._xids_seen
            if any(n == x.xid and b == bus and abs(t - ts) <= XID_DEDUPE_S for n, b, t in seen):
                continue
            seen.append((x.xid, bus, ts))
            state = None if gpu is None or last is None else last.gpu(gpu)
            info = judge(x, None if state is None else state.remap_pending)
            where = f"GPU {gpu}" if gpu is not None else f"PCI {bus}"
            evidence = {
                "xid": x.xid,
                "name": info.name,
                "action": info.action.value,
                "hint": info.hint,
                "basis": info.basis,
                "pci_bus_id": bus,
                "pid": x.pid,
                "process_name": x.process_name,
                "text": x.message,
            }
            uuid = None if gpu is None else uuid_by_gpu.get(gpu)
            msg = f"Xid {x.xid} {info.name} on {where}"
            out.append(Event(ts, "xid", info.severity, msg, gpu, uuid, evidence))
        return out

    def kernel(
        self,
        events: Sequence[KernelEvent],
        xids: Sequence[XidEvent],
        snapshot: NodeSnapshot,
        default_ts: float,
    ) -> list[Event]:
        """One ``kernel`` event per finding of the ``kernel_log`` check over ``events`` (the
        faults of one kernel-log read, ``xids`` the Xids of the same read: an acting Xid on
        a GPU covers its other faults). ``snapshot`` holds the job's GPUs; a fault on another
        GPU is not the job's, a node-level one (an SXid, an HCA's mlx5 line judged by
        ``ib_kernel_log``, a line naming no GPU) is."""
        checks = [c for c in ("kernel_log", "ib_kernel_log") if c not in self._checks.disabled]
        if not events or not checks:
            return []
        ctx = CheckContext(
            snapshot, "sidecar", self.gpus or None, xids=tuple(xids), kernel_events=tuple(events)
        )
        findings = [f for c in checks for f in run_check(catalog()[c], ctx, self._checks.settings)]
        mine = {g.index: g for g in snapshot.gpus if not self.gpus or g.index in self.gpus}
        covered = all(g.pci_bus_id for g in mine.values())  # every job GPU's bus id known
        out = []
        for f in findings:
            ev: dict[str, Any] = dict(f.evidence)
            bus, number = ev.get("pci_bus_id"), ev.get("gpu_number")
            named = f.gpu is not None or (covered and bus is not None) or number is not None
            node_level = ev.get("kind") == "sxid" or f.check == "ib_kernel_log"
            if f.gpu not in mine and named and not node_level:
                continue  # a fault on a GPU that is not the job's (an HCA is the node's)
            ts = ev.get("ts")
            ts = float(ts) if isinstance(ts, int | float) else default_ts
            ev.update(action=f.action.value, hint=f.hint)
            out.append(Event(ts, "kernel", f.severity, f.message, f.gpu, f.uuid, ev))
        return out
