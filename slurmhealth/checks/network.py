"""The RDMA network (InfiniBand / RoCE HCAs, ``ibstat`` and ``perfquery`` equivalents):
port state, link rate, HCA count, error counters over a window, GPUDirect RDMA.

Every finding names the port (``mlx5_1/1``) first, so a drain reason reads
``slurmhealth: ib_errors mlx5_1/1 ...``, and the GPUs behind the same PCIe switch as the
HCA (whose inter-node traffic it carries) in its message and evidence. Nothing is judged
when the node's RDMA devices were not read (``ctx.rdma`` is None). Which ports are judged
and what they should show come from ``[rdma]`` (``ctx.rdma_expect``). The checks run in the
one-off phases (check, prolog, epilog, healthcheck, validate); ``ib_port_state`` and
``ib_errors`` also in the sidecar, whose RDMA watch (:mod:`slurmhealth.sidecar.rdma`) turns
their failing findings into ``ib_port_down`` / ``ib_errors`` events per port.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from slurmhealth.checks.counters import RATE_THRESHOLDS as RATE
from slurmhealth.checks.counters import Growth, growth, rings_of
from slurmhealth.checks.engine import EVERYWHERE, CheckContext, check, finding
from slurmhealth.model import Action, Finding, Severity, normalize_pci_bus_id

if TYPE_CHECKING:  # loaded only on a node whose RDMA devices were read
    from slurmhealth.rdma.model import Hca, IbPort, RdmaExpect, RdmaSnapshot

COUNTER_KEY = "ib:{port}"
"""The key of a port's counters in the counter history (next to the GPUs' UUIDs): e.g.
``ib:mlx5_1/1``, so :func:`slurmhealth.checks.counters.remember` keeps both."""


def _expect(ctx: CheckContext) -> RdmaExpect:
    """What ``[rdma]`` asks of the node (nothing when the caller gave no expectations)."""
    from slurmhealth.rdma.model import RdmaExpect

    return ctx.rdma_expect if ctx.rdma_expect is not None else RdmaExpect()


def rdma_counters_of(rdma: RdmaSnapshot | None) -> dict[str, dict[str, int]]:
    """Each port's error counters for the counter history, keyed ``ib:<hca>/<port>``."""
    from slurmhealth.rdma.model import ERROR_COUNTERS

    out: dict[str, dict[str, int]] = {}
    for p in rdma.ports() if rdma is not None else ():
        values = {k: v for k, v in p.counters.items() if k in ERROR_COUNTERS}
        if values:
            out[COUNTER_KEY.format(port=p.name)] = values
    return out


def _ports(ctx: CheckContext) -> list[tuple[Hca, IbPort]]:
    """The judged ports (``[rdma] devices`` / ``link_layer``) with their HCA."""
    if ctx.rdma is None:
        return []
    return [(h, p) for h in ctx.rdma.hcas for p in h.ports if _expect(ctx).judged(p)]


def near_gpus(ctx: CheckContext, hca: Hca) -> tuple[list[int], list[str]]:
    """The GPUs behind the same PCIe switch as ``hca``: indices of those the GPU snapshot
    knows, and the PCI bus ids of all of them."""
    from slurmhealth.rdma.model import gpus_near

    buses = list(gpus_near(hca, ctx.rdma.gpus, ctx.rdma.hcas)) if ctx.rdma is not None else []
    index: dict[str, int] = {}
    for g in ctx.snapshot.gpus:
        try:
            index[normalize_pci_bus_id(g.pci_bus_id or "")] = g.index
        except ValueError:
            continue
    return sorted(index[b] for b in buses if b in index), buses


def _behind(gpus: Sequence[int], buses: Sequence[str]) -> str:
    if gpus:
        return f" (GPU{'s' if len(gpus) > 1 else ''} {','.join(map(str, gpus))} behind it)"
    return f" (GPUs {','.join(buses)} behind it)" if buses else ""


def _port_finding(
    ctx: CheckContext,
    name: str,
    severity: Severity,
    hca: Hca,
    port: IbPort | None,
    text: str,
    action: Action | None = None,
    **evidence: Any,
) -> Finding:
    gpus, buses = near_gpus(ctx, hca)
    where = port.name if port is not None else hca.name
    return finding(
        name,
        severity,
        None,
        f"{where} {text}{_behind(gpus, buses)}",
        action=action,
        hca=hca.name,
        port=None if port is None else port.port,
        pci_bus_id=hca.pci_bus_id,
        netdevs=list(port.netdevs or hca.netdevs) if port is not None else list(hca.netdevs),
        gpus=gpus,
        gpu_pci_bus_ids=buses,
        **evidence,
    )


@check(
    "ib_port_state",
    "Every judged RDMA port ([rdma] devices / link_layer) is ACTIVE with its physical link "
    "LinkUp (ibstat State: Active, Physical state: LinkUp).",
    action=Action.DRAIN,
    hint="DOWN/Polling: no link (cable, transceiver or switch port); INIT/LinkUp: the subnet "
    "manager has not configured the port; Disabled: the port was shut. Check `ibstat`, "
    "the cable and the switch side; reseat or replace",
    phases=EVERYWHERE,
)
def ib_port_state(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    out = []
    for hca, p in _ports(ctx):
        if p.active is not False and p.link_up is not False:
            continue
        state = f"{p.state_name or '?'}/{p.phys_state_name or '?'}"
        # an unnamed fabric: a port down may be one nobody cabled (the second port of a
        # dual-port card, a management port): recorded, never drained on
        named = bool(_expect(ctx).devices)
        out.append(
            _port_finding(
                ctx,
                "ib_port_state",
                Severity.FAIL if named else Severity.INFO,
                hca,
                p,
                f"port {state}"
                + ("" if named else " (not drained: name the fabric's ports in [rdma] devices)"),
                action=None if named else Action.RECORD,
                state=p.state,
                phys_state=p.phys_state,
                link_layer=p.link_layer,
            )
        )
    return out


@check(
    "ib_rate",
    "Every judged active RDMA port runs at least at [rdma] expected_rate_gbps (the rate the "
    "kernel reports, active width x lane speed; not checked when 0).",
    action=Action.DRAIN,
    hint="the link trained below its speed or width (a damaged cable, a dirty connector, a "
    "port forced to a lower speed): check `ibstat` Rate and the switch side; reseat or "
    "replace the cable",
)
def ib_rate(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    if ctx.rdma is None:
        return []
    expected = _expect(ctx).rate_gbps
    out = []
    for hca, p in _ports(ctx) if expected > 0 else ():
        if p.rate is None or p.active is False or p.rate.gbps >= expected:
            continue  # a down port is ib_port_state's; an unknown rate is not a failure
        out.append(
            _port_finding(
                ctx,
                "ib_rate",
                Severity.FAIL,
                hca,
                p,
                f"rate {p.rate.text}, expected {expected:g} Gb/sec",
                rate_gbps=p.rate.gbps,
                width=p.rate.width,
                speed=p.rate.speed,
                expected_gbps=expected,
            )
        )
    return out


@check(
    "ib_hca_count",
    "The node shows [rdma] expected_hcas RDMA devices (those [rdma] devices names, when set); "
    "not checked when 0.",
    action=Action.DRAIN,
    hint="an HCA is missing from /sys/class/infiniband: check `lspci -d 15b3:`, the mlx5_core "
    "driver (dmesg), the card's seating and firmware; reboot",
)
def ib_hca_count(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    if ctx.rdma is None or (want := _expect(ctx).hca_count) <= 0:
        return []
    if ctx.rdma.error:  # the read failed: unknown, not missing (fail open, loudly)
        text = f"RDMA devices unreadable: {ctx.rdma.error}"
        return [finding("ib_hca_count", Severity.WARN, None, text, action=Action.RECORD)]
    named = {d.split("/")[0] for d in _expect(ctx).devices}
    present = [h.name for h in ctx.rdma.hcas if not named or h.name in named]
    if len(present) >= want:
        return []
    missing = sorted(named - set(present))
    text = f"{len(present)} RDMA devices, expected {want}"
    if missing:
        text += f": {', '.join(missing)} missing"
    return [
        finding(
            "ib_hca_count",
            Severity.FAIL,
            None,
            text,
            present=present,
            expected=want,
            missing=missing,
        )
    ]


_LIMITS = {  # counter -> threshold key (errors per minute)
    "symbol_error": "symbol_error_per_min",
    "link_error_recovery": "link_error_recovery_per_min",
    "link_downed": "link_downed_per_min",
    "port_rcv_errors": "port_rcv_errors_per_min",
    "local_link_integrity_errors": "local_link_integrity_errors_per_min",
    "excessive_buffer_overrun_errors": "excessive_buffer_overrun_errors_per_min",
    "port_xmit_discards": "port_xmit_discards_per_min",
}
_CONGESTION = ("port_xmit_discards",)
SATURATED = {  # the PortCounters widths (16, 8 or 4 bits): a full counter stops counting
    "symbol_error": 0xFFFF,
    "link_error_recovery": 0xFF,
    "link_downed": 0xFF,
    "port_rcv_errors": 0xFFFF,
    "local_link_integrity_errors": 0xF,
    "excessive_buffer_overrun_errors": 0xF,
    "port_xmit_discards": 0xFFFF,
}  # also grow under congestion: silent below the limit


@check(
    "ib_errors",
    "RDMA port error counters (counters/*) grow slower than the thresholds, judged over at "
    "least min_window_s seconds and min_count errors of earlier runs' reads (shorter "
    "evidence warns): symbol errors, link error recoveries, link downed (flaps), receive "
    "errors, local link integrity errors, excessive buffer overruns, transmit discards "
    "(<counter>_per_min each); other growth warns, transmit discards only at their limit.",
    action=Action.DRAIN,
    hint="a marginal link (cable, transceiver, connector or switch port): check "
    "`perfquery -x` and the switch side's counters, reseat or replace the cable, then "
    "re-run ib_write_bw",
    thresholds={
        "symbol_error_per_min": 10,
        "link_error_recovery_per_min": 1,
        "link_downed_per_min": 1,
        "port_rcv_errors_per_min": 10,
        "local_link_integrity_errors_per_min": 1,
        "excessive_buffer_overrun_errors_per_min": 1,
        "port_xmit_discards_per_min": 100,
        **RATE,
    },
    phases=EVERYWHERE,
)
def ib_errors(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    out = []
    now = ctx.rdma.ts if ctx.rdma is not None else ctx.snapshot.ts
    for hca, p in _ports(ctx):
        rings = rings_of(ctx.counter_history, COUNTER_KEY.format(port=p.name))
        grown = {}
        for name in _LIMITS:
            found = growth(rings.get(name), now, p.counters.get(name), th)
            if found is not None:
                grown[name] = found
        if grown and (f := _errors_finding(ctx, hca, p, grown, th)) is not None:
            out.append(f)
        elif full := [n for n, top in SATURATED.items() if p.counters.get(n) == top]:
            text = f"{', '.join(full)} saturated: error rates unknown until reset (perfquery -R)"
            out.append(
                _port_finding(
                    ctx, "ib_errors", Severity.WARN, hca, p, text, Action.WARN, saturated=full
                )
            )
    return out


def _errors_finding(
    ctx: CheckContext, hca: Hca, p: IbPort, grown: Mapping[str, Growth], th: Mapping[str, float]
) -> Finding | None:
    """Fail on a counter that grew at its limit over enough evidence; warn on other growth
    (transmit discards only at their limit: congestion makes a few)."""
    limit = {n: th[_LIMITS[n]] for n in grown}
    failing = [n for n, g in grown.items() if g.enough and g.per_min >= limit[n]]
    shown = {n: g for n, g in grown.items() if n not in _CONGESTION or g.per_min >= limit[n]}
    if not shown:
        return None
    span = max(g.span_s for g in shown.values())
    text = ", ".join(f"{n} +{g.delta:g} ({g.per_min:.3g}/min)" for n, g in shown.items())
    text += f" over {span:.0f} s"
    if not failing:
        text += f" (fails at its rate over {th['min_window_s']:g} s and {th['min_count']:g} errors)"
    return _port_finding(
        ctx,
        "ib_errors",
        Severity.FAIL if failing else Severity.WARN,
        hca,
        p,
        f"errors growing: {text}",
        action=None if failing else Action.WARN,
        counts={n: g.delta for n, g in shown.items()},
        per_min={n: round(g.per_min, 3) for n, g in shown.items()},
        window_s=round(span, 3),
        failing=failing,
    )


@check(
    "gpudirect",
    "GPUDirect RDMA is available where [rdma] gpudirect is set: the nvidia_peermem kernel "
    "module (or the older nv_peer_mem) is loaded.",
    action=Action.DRAIN,
    hint="without nvidia_peermem NCCL stages inter-node traffic through host memory (much "
    "slower): `modprobe nvidia_peermem` and make it load at boot",
)
def gpudirect(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    if ctx.rdma is None or not _expect(ctx).gpudirect or ctx.rdma.peermem_loaded is not False:
        return []
    return [
        finding(
            "gpudirect",
            Severity.FAIL,
            None,
            "nvidia_peermem not loaded: GPUDirect RDMA unavailable",
            module="nvidia_peermem",
        )
    ]
