"""RDMA network faults in the kernel log (the mlx5 driver's lines, parsed by
:mod:`slurmhealth.kernel_log.net_patterns`), judged on the HCA the line names.

The line names the HCA's PCI function (``mlx5_core 0000:5e:00.0``) and, for link changes,
its net device; with the node's RDMA devices read (``ctx.rdma``) the finding names the HCA
(``mlx5_1``) first, so a drain reason reads ``slurmhealth: ib_kernel_log mlx5_1 ...``, and
the GPUs behind it. Without them it names the PCI function.

:data:`VERDICTS` is the judgement per event kind, each with its reason:

- drain (on an HCA of the fabric, ``[rdma] devices``): a firmware fatal state (``Fatal
  error <n> detected`` and the other health failures) and a command-interface hang (``No
  done completion``, a leaked command resource): the HCA's firmware stopped answering, as
  NVIDIA's own node health monitor treats it; a cable/module error; a PCI error that froze
  the HCA; and link flaps: ``flap_count`` link-downs of one HCA within ``flap_window_s``
  (one read of the log: the prolog's since the last run, the epilog's over the job);
- warn, recorded: a single link flap, a module unplugged, insufficient slot power, a
  temperature warning, a health report of warning severity, a command that completed late;
- record (info): a command the firmware refused (``failed, status ...``);
- nothing: a link coming up, a cable plugged in.

Off the fabric (or without its device list) every finding is at most a warning, recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from slurmhealth.checks.engine import CheckContext, check, finding
from slurmhealth.checks.network import near_gpus
from slurmhealth.model import Action, Finding, Severity

if TYPE_CHECKING:
    from slurmhealth.model_records import KernelEvent  # built only where a fault was read
    from slurmhealth.rdma.model import Hca


class Verdict(NamedTuple):
    severity: Severity  # on the fabric's HCA
    what: str  # the words of the finding
    reason: str  # why this severity: the hint


REBOOT = "reboot the node (a firmware reset: mlxfwreset); if it recurs, update or replace the HCA"
VERDICTS: Mapping[str, Verdict | None] = {
    "net_link_down": Verdict(Severity.WARN, "link down",
        "one flap is a warning (the port came back or ib_port_state judges it); repeated "
        "flaps drain: check the cable and the switch port (mlxlink -d <hca> -m)"),
    "net_link_up": None,
    "net_module": Verdict(Severity.WARN, "cable/module event",
        "the cable or transceiver was unplugged or disabled: check the module (mlxlink -m)"),
    "net_module_error": Verdict(Severity.FAIL, "cable/module error",
        "the transceiver or cable failed (overheated, shorted, over its power budget): "
        "replace the module or cable, then re-run ib_write_bw"),
    "net_temperature": Verdict(Severity.WARN, "temperature warning",
        "the HCA's sensors report high temperature: check airflow and the module (mget_temp)"),
    "net_pcie_power": Verdict(Severity.WARN, "insufficient PCIe slot power",
        "the HCA's slot cannot power it fully: check the riser/slot and the server's power"),
    "net_health": Verdict(Severity.CRITICAL, "firmware fatal error",
        "the HCA's firmware reached a fatal state and stops serving the fabric: " + REBOOT),
    "net_health_warn": Verdict(Severity.WARN, "firmware health warning",
        "the firmware reported a health issue of warning severity: watch it (devlink health)"),
    "net_cmd_timeout": Verdict(Severity.CRITICAL, "command interface timeout",
        "a firmware command never completed (the firmware hung; the driver leaked the "
        "command's resource): " + REBOOT),
    "net_cmd_late": Verdict(Severity.WARN, "command completed late",
        "a firmware command completed after its timeout: the firmware is slow, watch it"),
    "net_cmd_error": Verdict(Severity.INFO, "command refused",
        "the firmware refused a command (a bad parameter or an unsupported request)"),
    "net_pci_error": Verdict(Severity.FAIL, "PCI error",
        "the HCA's PCI link reported an error (AER/EEH): check lspci -vv and the slot; reboot"),
    "net_pci_warn": Verdict(Severity.WARN, "PCI error handled",
        "the PCI error handler ran with the channel still normal: watch it (lspci -vv)"),
}  # fmt: skip
# a line that says of itself that it is a warning: the kind its verdict is read under
_WARN_KIND = {"net_health": "net_health_warn", "net_pci_error": "net_pci_warn"}
SENSORS = {  # mlx5 health.c: check_fatal_sensors()
    1: "PCI communication lost",
    2: "PCI channel offline",
    3: "NIC interface disabled",
    4: "NIC software reset",
    5: "firmware requested a reset",
}
FLAP_WINDOW_S = 600.0
FLAP_COUNT = 3.0


@check(
    "ib_kernel_log",
    "RDMA faults in the kernel log (mlx5 driver): firmware fatal errors, command-interface "
    "hangs, cable/module errors, PCI errors and repeated link flaps drain on an HCA of "
    "[rdma] devices; one flap, module unplugged, temperature and slot-power warnings are "
    "recorded.",
    action=Action.RECORD,
    hint="read the mlx5 lines in the evidence (dmesg -T | grep mlx5) and `ibstat`",
    thresholds={"flap_window_s": FLAP_WINDOW_S, "flap_count": FLAP_COUNT},
)
def ib_kernel_log(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    grouped: dict[tuple[str, str], list[KernelEvent]] = {}
    for e in ctx.kernel_events:
        if VERDICTS.get(e.kind) is None or (e.kind == "net_module" and e.level == "info"):
            continue
        kind = _WARN_KIND.get(e.kind, e.kind) if e.level == "warn" else e.kind
        grouped.setdefault((kind, e.pci_bus_id or e.device or "?"), []).append(e)
    # commands time out once the firmware is in a fatal state: the fatal error leads
    fatal = {where for kind, where in grouped if kind == "net_health"}
    return [
        _finding(ctx, th, kind, members, after_fatal=where in fatal)
        for (kind, where), members in grouped.items()
    ]


def _finding(
    ctx: CheckContext,
    th: Mapping[str, float],
    kind: str,
    members: list[KernelEvent],
    *,
    after_fatal: bool = False,
) -> Finding:
    verdict = VERDICTS[kind]
    assert verdict is not None
    severity, what, hint = verdict
    first = members[0]
    if after_fatal and kind == "net_cmd_timeout":
        severity, what = Severity.FAIL, f"{what} after the firmware's fatal error"
    flaps = _flaps(members, th) if kind == "net_link_down" else 0
    if flaps:
        severity, what = Severity.FAIL, f"link flapping ({flaps} link-downs within "
        what += f"{th.get('flap_window_s', FLAP_WINDOW_S):g} s)"
    hca = _hca_of(ctx, first)
    if hca is None or not _in_fabric(ctx, hca):
        severity = min(severity, Severity.WARN)
    action = Action.DRAIN if severity >= Severity.FAIL else Action.RECORD
    name = hca.name if hca is not None else f"mlx5_core {first.pci_bus_id or first.device}"
    count = f" (x{len(members)})" if len(members) > 1 and not flaps else ""
    gpus, buses = near_gpus(ctx, hca) if hca is not None else ([], [])
    behind = f" (GPUs {','.join(map(str, gpus))} behind it)" if gpus else ""
    return finding(
        "ib_kernel_log", severity, None, f"{name} {what}{_detail(kind, first)}{count}{behind}",
        action=action, hint=hint, kind=kind, hca=None if hca is None else hca.name,
        pci_bus_id=first.pci_bus_id,
        netdev=first.device if first.device and "mlx5" not in first.device else None,
        module=first.code if kind.startswith("net_module") else None, code=first.code,
        count=len(members), ts=first.ts, gpus=gpus, gpu_pci_bus_ids=buses,
        line=first.raw[:300],
    )  # fmt: skip


def _flaps(downs: list[KernelEvent], th: Mapping[str, float]) -> int:
    """The most link-downs of one HCA within ``flap_window_s`` (0 below ``flap_count``);
    lines without a time count as one burst."""
    window, need = th.get("flap_window_s", FLAP_WINDOW_S), th.get("flap_count", FLAP_COUNT)
    times = sorted(e.ts for e in downs if e.ts is not None)
    best = len(downs) - len(times)
    lo = 0
    for hi, t in enumerate(times):
        while t - times[lo] > window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best if best >= need else 0


def _detail(kind: str, e: KernelEvent) -> str:
    """The line's own words worth a reason: the fatal sensor, the command, the module."""
    msg = e.message
    if kind == "net_health" and "Fatal error" in msg and e.code is not None:
        return f" {e.code} ({SENSORS.get(e.code, 'unknown sensor')})"
    if kind == "net_health":
        return ": " + msg.rpartition(": ")[2].strip().rstrip(".:")[:70]
    if kind in ("net_cmd_timeout", "net_cmd_late") and e.code is not None:
        head = msg.partition(f"(0x{e.code:x})")[0].rpartition(" ")[2]
        return f": {head}(0x{e.code:x})"
    if kind == "net_module_error":
        cause = msg.rpartition("Cable error, ")[2].strip().rstrip(".")
        return f": {cause[:60]}" if cause and cause != msg.strip() else ""
    if kind == "net_module":
        status = msg.rpartition(", ")[2].strip()[:40]
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
