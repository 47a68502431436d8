"""RDMA network faults in the kernel log (the mlx5 driver's lines, parsed by
:mod:`slurmhealth.kernel_log.net_patterns`), judged on the HCA the line names.

The line names the HCA's PCI function (``mlx5_core 0000:5e:00.0``) and, for link changes,
its net device; with the node's RDMA devices read (``ctx.rdma``) the finding names the HCA
(``mlx5_1``) first, so a drain reason reads ``slurmhealth: ib_kernel_log mlx5_1 ...``, and
the GPUs behind it. Without them it names the PCI function.

What drains: a cable/module error or a firmware health failure on an HCA of the fabric
(``[rdma] devices``); elsewhere, and for a link that went down or a module unplugged, the
finding is a record (the port's state and error rates are ``ib_port_state``'s and
``ib_errors``' to judge). A link coming up and a cable plugged in are not findings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from slurmhealth.checks import CheckContext, check, finding
from slurmhealth.checks.network import near_gpus
from slurmhealth.model import Action, Finding, Severity

if TYPE_CHECKING:
    from slurmhealth.model_records import KernelEvent  # built only where a fault was read
    from slurmhealth.rdma.model import Hca

# kind -> (severity on the fabric, what it is, hint); None: not a finding
_NET: Mapping[str, tuple[Severity, str, str] | None] = {
    "net_link_down": (
        Severity.WARN,
        "link down",
        "the port lost its link: a flap if it came back; ib_errors judges the rate (link_downed)",
    ),
    "net_link_up": None,
    "net_module": (
        Severity.WARN,
        "cable/module event",
        "the cable or transceiver was unplugged or disabled: check the module (mlxlink -m)",
    ),
    "net_module_error": (
        Severity.FAIL,
        "cable/module error",
        "the transceiver or cable failed (overheated, shorted, over its power budget): "
        "replace the module or cable, then re-run ib_write_bw",
    ),
    "net_pcie_power": (
        Severity.WARN,
        "insufficient PCIe slot power",
        "the HCA's slot cannot power it fully: check the riser/slot and the server's power",
    ),
    "net_health": (
        Severity.CRITICAL,
        "firmware health failure",
        "the HCA's firmware reported a fatal error: reboot; if it recurs, update the "
        "firmware or replace the card",
    ),
}


@check(
    "ib_kernel_log",
    "RDMA faults in the kernel log (mlx5 driver): cable/module errors and firmware health "
    "failures drain on an HCA of [rdma] devices; link down, module unplugged and "
    "insufficient slot power are recorded.",
    action=Action.RECORD,
    hint="read the mlx5 lines in the evidence (dmesg -T | grep mlx5) and `ibstat`",
)
def ib_kernel_log(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    grouped: dict[tuple[str, str], list[KernelEvent]] = {}
    for e in ctx.kernel_events:
        if _NET.get(e.kind) is None or (e.kind == "net_module" and e.level == "info"):
            continue
        grouped.setdefault((e.kind, e.pci_bus_id or e.device or "?"), []).append(e)
    out = []
    for (kind, where), members in grouped.items():
        known = _NET[kind]
        assert known is not None
        severity, what, hint = known
        first = members[0]
        hca = _hca_of(ctx, first)
        fabric = hca is not None and _in_fabric(ctx, hca)
        if not fabric:
            severity = min(severity, Severity.WARN)
        action = Action.DRAIN if severity >= Severity.FAIL else Action.RECORD
        name = hca.name if hca is not None else f"mlx5_core {where}"
        detail = _detail(kind, first)
        count = f" (x{len(members)})" if len(members) > 1 else ""
        gpus, buses = near_gpus(ctx, hca) if hca is not None else ([], [])
        behind = f" (GPUs {','.join(map(str, gpus))} behind it)" if gpus else ""
        out.append(
            finding(
                "ib_kernel_log",
                severity,
                None,
                f"{name} {what}{detail}{count}{behind}",
                action=action,
                hint=hint,
                kind=kind,
                hca=None if hca is None else hca.name,
                pci_bus_id=first.pci_bus_id,
                netdev=first.device if first.device and "mlx5" not in first.device else None,
                module=first.code,
                count=len(members),
                ts=first.ts,
                gpus=gpus,
                gpu_pci_bus_ids=buses,
                line=first.raw[:300],
            )
        )
    return out


def _detail(kind: str, e: KernelEvent) -> str:
    """The line's own words worth a reason: the module error's cause, the module number."""
    if kind == "net_module_error":
        cause = e.message.rpartition("Cable error, ")[2].strip().rstrip(".")
        return f": {cause[:60]}" if cause and cause != e.message.strip() else ""
    if kind == "net_module":
        status = e.message.rpartition(", ")[2].strip()[:40]
        return f" (module {e.code}: {status})" if e.code is not None else ""
    return ""


def _hca_of(ctx: CheckContext, e: KernelEvent) -> Hca | None:
    """The HCA whose PCI function or net device the line names."""
    if ctx.rdma is None:
        return None
    for h in ctx.rdma.hcas:
        if e.pci_bus_id is not None and e.pci_bus_id == h.pci_bus_id:
            return h
        if e.device and (e.device in h.netdevs or any(e.device in p.netdevs for p in h.ports)):
            return h
    return None


def _in_fabric(ctx: CheckContext, hca: Hca) -> bool:
    expect = ctx.rdma_expect
    return expect is not None and bool(expect.devices) and any(expect.judged(p) for p in hca.ports)
