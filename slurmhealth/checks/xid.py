"""GPU faults from the kernel log (and NVML's event API): Xids judged by NVIDIA's Xid catalog
and the driver's own verdict, and the faults that come without an Xid."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from slurmhealth.checks.engine import CheckContext, check, finding
from slurmhealth.model import (
    KERNEL_EVENT_KINDS,
    Action,
    Finding,
    GpuState,
    NodeSnapshot,
    Severity,
    XidEvent,
    normalize_pci_bus_id,
)

if TYPE_CHECKING:
    from slurmhealth.checks.xid_table import XidInfo
    from slurmhealth.model_records import KernelEvent  # built only where a fault was read


@check(
    "xid",
    "New Xid errors in the kernel log since the last run, each judged by NVIDIA's Xid catalog "
    "(e.g. 48/64/74/79/95/119/120 act; 13/31/43/45 are application errors, recorded) unless "
    "the line carries the driver's own verdict (Contained:, RST:, D-RST:): a contained error "
    "warns and never drains.",
    action=Action.RECORD,
    hint="see NVIDIA's Xid catalog for this Xid (slurmhealth xid N)",
)
def xid(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _xid(ctx, th)


def _xid(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    if not ctx.xids:  # the usual run: the catalog's module is never loaded
        return []
    from slurmhealth.checks.xid_table import judge

    by_bus = _gpus_by_bus(ctx.snapshot)
    grouped: dict[tuple[int, str, str | None], list[XidEvent]] = {}
    for event in ctx.xids:
        grouped.setdefault((event.xid, event.pci_bus_id, event.gpu_instance), []).append(event)
    out = []
    for (code, bus, _), members in grouped.items():
        gpu = by_bus.get(bus)
        first = members[0]
        verdicts = [judge(e, _pending(gpu), ctx.snapshot.driver_version) for e in members]
        info = max(verdicts, key=lambda v: (v.action.takes_node_out, v.severity))
        count = f" (x{len(members)})" if len(members) > 1 else ""
        cause = _cause(first, ctx.xids) if code == 45 else None
        because = f", caused by Xid {cause}" if cause is not None else ""
        where = f" {first.gpu_instance}" if first.gpu_instance else ""
        because += _driver_said(info, members)
        out.append(
            finding(
                "xid",
                info.severity,
                gpu,
                f"Xid {code} {info.name}{count} on {bus}{where}{because}",
                action=info.action,
                hint=info.hint,
                xid=code,
                pci_bus_id=bus,
                count=len(members),
                pid=first.pid,
                process=first.process_name,
                ts=first.ts,
                line=first.raw[:300],
                basis=info.basis,
                caused_by=cause,
                **_decoded(first, ctx.snapshot.driver_version),
                **_instance(first, gpu, info.acts),
            )
        )
    return out


def _instance(event: XidEvent, gpu: GpuState | None, acts: bool) -> dict[str, object]:
    """The MIG instance an Xid line names (``GPU-I:NN``). A contained one is that instance's
    alone (its MIG UUID in the evidence); one that takes the GPU out is the whole GPU's."""
    if event.gpu_instance is None:
        return {}
    from slurmhealth.checks.mig import instance_id, instance_of, mig_evidence

    gi = instance_id(event.gpu_instance)
    mig = None if acts else instance_of(gpu, gi)
    return mig_evidence(mig) if mig is not None else {"gpu_instance": gi}


def _decoded(event: XidEvent, driver: str | None) -> dict[str, object]:
    """An NVLink5 Xid's decoded status fields, as evidence (nothing for other Xids)."""
    if not 144 <= event.xid <= 150:
        return {}
    from slurmhealth.checks.xid_nvlink5 import decode, describe

    found = decode(event.xid, event.raw, driver)
    return {} if found is None else {"nvlink5": describe(found)}


def _driver_said(info: XidInfo, members: Sequence[XidEvent]) -> str:
    """The driver's own verdict when it overrode the catalog with a reset: the catalog's
    name alone (Xid 94 "Contained error") would contradict a line that says Uncontained."""
    if info.basis != "driver" or info.action is not Action.RESET:
        return ""
    if any(e.contained is False for e in members):
        return ", uncontained: reset required"
    return ", the driver asks for a reset"


def _pending(gpu: GpuState | None) -> bool | None:
    """Whether the GPU waits for a reset to apply a row remap, or on GPUs without row
    remapping (V100) a page retirement: what Xid 63 means depends on it."""
    if gpu is None:
        return None
    return gpu.remap_pending if gpu.remap_pending is not None else gpu.retired_pages_pending


def _cause(event: XidEvent, xids: Sequence[XidEvent]) -> int | None:
    """The Xid an Xid 45 cleans up after: the line says so, or an earlier Xid on its GPU."""
    if event.caused_by is not None:
        return event.caused_by
    earlier = [x.xid for x in xids if x.pci_bus_id == event.pci_bus_id and x.xid != 45]
    return earlier[0] if earlier else None


def _acting_buses(xids: Sequence[XidEvent]) -> set[str]:
    """The buses with an Xid that takes the node out (the catalog is loaded only for Xids)."""
    if not xids:
        return set()
    from slurmhealth.checks.xid_table import judge

    return {x.pci_bus_id for x in xids if judge(x).acts}


def _gpus_by_bus(snapshot: NodeSnapshot) -> dict[str, GpuState]:
    out: dict[str, GpuState] = {}
    for g in snapshot.gpus:
        if g.pci_bus_id:
            try:
                out[normalize_pci_bus_id(g.pci_bus_id)] = g
            except ValueError:
                continue
    return out


# kind -> (severity, action, what it is, hint); level-dependent kinds by (kind, level)
_FAULTS: Mapping[tuple[str, str | None], tuple[Severity, Action, str, str]] = {
    ("fallen_off_bus", None): (
        Severity.CRITICAL,
        Action.RESET,
        "GPU has fallen off the bus",
        "reboot the node (or reset the GPU); check PCIe seating, power and cooling; RMA if "
        "it recurs",
    ),
    ("gsp_timeout", None): (
        Severity.FAIL,
        Action.RESET,
        "GSP firmware timeout",
        "GPU firmware stopped answering: reset the GPU (nvidia-smi -r) or reboot; update the "
        "driver/firmware if it recurs",
    ),
    ("init_failed", None): (
        Severity.FAIL,
        Action.RESET,
        "NVIDIA driver could not initialize the GPU",
        "reset the GPU or reboot (cold boot if it persists); check seating, power and the "
        "driver/firmware versions",
    ),
    ("sxid", "fatal"): (
        Severity.FAIL,
        Action.DRAIN,
        "fatal NVSwitch error",
        "a fatal SXid needs the NVSwitch and its GPUs reset: drain and reboot the node; check "
        "the fabric manager log",
    ),
    ("sxid", None): (
        Severity.WARN,
        Action.RECORD,
        "non-fatal NVSwitch error",
        "non-fatal SXid: watch it; drain if it repeats or turns fatal",
    ),
    ("pcie_aer", "fatal"): (
        Severity.CRITICAL,
        Action.RESET,
        "PCIe uncorrectable fatal error",
        "the PCIe link failed: reboot the node; check seating, risers and cables; RMA if it recurs",
    ),
    ("pcie_aer", "non-fatal"): (
        Severity.WARN,
        Action.RECORD,
        "PCIe uncorrectable non-fatal error",
        "a PCIe transaction was lost: check lspci -vv and the PCIe replay counters; drain "
        "if it repeats",
    ),
    ("pcie_aer", None): (
        Severity.WARN,
        Action.RECORD,
        "PCIe corrected errors",
        "corrected PCIe errors: check link width/speed and replay counters if they keep coming",
    ),
}


@check(
    "kernel_log",
    "GPU faults in the kernel log without an Xid: fallen off the bus, GSP firmware timeouts, "
    "driver init/probe failures, NVSwitch SXids (fatal drain), PCIe AER errors on a GPU "
    "(fatal resets, others warn); on the GPU the line names, else on the node.",
    action=Action.RECORD,
    hint="read the kernel log lines in the evidence (dmesg -T)",
)
def kernel_log(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _kernel_log(ctx, th)


def _kernel_log(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    by_bus = _gpus_by_bus(ctx.snapshot)
    covered = _acting_buses(ctx.xids)  # an acting Xid says it all
    grouped: dict[tuple[str, str | None, str | None, int | None], list[KernelEvent]] = {}
    # a line that names no GPU (the "*** GSP Timeout ***" banner, "None of the NVIDIA devices
    # were initialized") belongs to the report of a GPU the same read names for that fault
    named = {e.kind for e in ctx.kernel_events if e.pci_bus_id or e.gpu_number is not None}
    for e in ctx.kernel_events:
        if e.kind not in KERNEL_EVENT_KINDS:
            continue  # the network's (ib_kernel_log)
        if e.kind in named and not e.pci_bus_id and e.gpu_number is None:
            continue
        level = e.level if e.kind in ("sxid", "pcie_aer") and e.level != "corrected" else None
        where = e.pci_bus_id if e.pci_bus_id else None
        grouped.setdefault((e.kind, level, where, e.gpu_number), []).append(e)
    out = []
    for (kind, level, bus, number), members in grouped.items():
        gpu = _gpu_of(ctx.snapshot, by_bus, kind, bus, number)
        if kind not in ("sxid", "pcie_aer") and bus in covered:
            continue
        if kind == "pcie_aer" and gpu is None and not _nvidia(members, bus):
            if level != "fatal":
                continue  # errors on another device (NIC, root port): not a GPU fault
            level = "non-fatal"  # fatal on another device: warn, do not drain for it
        severity, action, what, hint = _FAULTS.get((kind, level), _FAULTS[(kind, None)])
        first = members[0]
        on = f" on {bus}" if bus else f" on GPU{number}" if number is not None else ""
        n = _reports(kind, members)
        count = f" (x{n})" if n > 1 else ""
        code = f" {first.code}" if first.code is not None else ""
        out.append(
            finding(
                "kernel_log",
                severity,
                gpu,
                f"{what}{code}{count}{on}",
                action=action,
                hint=hint,
                kind=kind,
                level=level,
                pci_bus_id=bus,
                gpu_number=number,
                code=first.code,
                count=n,
                ts=first.ts,
                line=first.raw[:300],
            )
        )
    return out


def _gpu_of(
    snapshot: NodeSnapshot, by_bus: dict[str, GpuState], kind: str, bus: str | None, n: int | None
) -> GpuState | None:
    """The GPU a fault names: its bus id, else the driver's GPU<n> (the n-th GPU in PCI
    order, which is also NVML's order); an NVSwitch's SXid is the node's."""
    if kind == "sxid":
        return None
    if bus is not None:
        return by_bus.get(bus)
    return None if n is None else snapshot.gpu(n)


def _reports(kind: str, members: Sequence[KernelEvent]) -> int:
    """How many errors ``members`` report: one PCIe AER error shows as the port's "error
    received" line and the device's own "PCIe Bus Error" line."""
    if kind == "pcie_aer":
        return sum(e.device is not None for e in members) or len(members)
    return len(members)


def _nvidia(members: Sequence[KernelEvent], bus: str | None) -> bool:
    return bus is not None and any(e.device == "nvidia" for e in members)
