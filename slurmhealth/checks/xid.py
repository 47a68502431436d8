"""Xids from the kernel log (and NVML's event API), judged by NVIDIA's Xid catalog."""

from __future__ import annotations

from collections.abc import Mapping

from slurmhealth.checks import CheckContext, check, finding
from slurmhealth.checks.xid_table import classify
from slurmhealth.model import Action, Finding, GpuState, normalize_pci_bus_id


@check(
    "xid",
    "New Xid errors in the kernel log since the last run, each judged by the Xid table "
    "(e.g. 48/64/74/79/95/119/120 act; 13/31/43/45 are application errors, recorded).",
    action=Action.RECORD,
    hint="see NVIDIA's Xid catalog for this Xid",
)
def xid(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    by_bus: dict[str, GpuState] = {}
    for g in ctx.snapshot.gpus:
        if g.pci_bus_id:
            try:
                by_bus[normalize_pci_bus_id(g.pci_bus_id)] = g
            except ValueError:
                continue
    grouped: dict[tuple[int, str], list[int]] = {}
    for n, event in enumerate(ctx.xids):
        grouped.setdefault((event.xid, event.pci_bus_id), []).append(n)
    out = []
    for (code, bus), members in grouped.items():
        gpu = by_bus.get(bus)
        info = classify(code, None if gpu is None else gpu.remap_pending)
        first = ctx.xids[members[0]]
        count = f" (x{len(members)})" if len(members) > 1 else ""
        out.append(
            finding(
                "xid",
                info.severity,
                gpu,
                f"Xid {code} {info.name}{count} on {bus}",
                action=info.action,
                hint=info.hint,
                xid=code,
                pci_bus_id=bus,
                count=len(members),
                pid=first.pid,
                process=first.process_name,
                ts=first.ts,
                line=first.raw[:300],
            )
        )
    return out
