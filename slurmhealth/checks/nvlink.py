"""NVLink state and error growth (``nvidia-smi nvlink -s`` and ``nvidia-smi nvlink -e``)."""

from __future__ import annotations

from collections.abc import Mapping

from slurmhealth.checks.counters import RATE_THRESHOLDS as RATE
from slurmhealth.checks.counters import Growth, growth, rings_of
from slurmhealth.checks.engine import EVERYWHERE, CheckContext, check, finding, readable
from slurmhealth.model import Action, Finding, GpuState, Severity


@check(
    "nvlink_inactive",
    "As many NVLinks are active as the GPU's design has (gpu.nvlinks_per_model, else the "
    "SKU table or the node set's [gpu.topology]; a link the design lacks is never failed); "
    "for models neither knows, every link NVML reports on a node that has active links. Not "
    "judged in MIG mode.",
    action=Action.DRAIN,
    hint="an NVLink is down and NCCL will fall back to slower paths: check "
    "`nvidia-smi nvlink -s -i N`, the NVSwitch trays and fabric manager; reset or reboot",
    phases=EVERYWHERE,
)
def nvlink_inactive(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _nvlink_inactive(ctx, th)


def _nvlink_inactive(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    node_has_links = any(link.active for g in readable(ctx) for link in g.nvlinks or ())
    out = []
    for g in readable(ctx):
        if g.nvlinks is None or g.mig_mode:  # not supported, or not used in MIG mode
            continue
        expected = _expected_links(ctx, g)
        state = {link.link: link for link in g.nvlinks or ()}
        if expected is None and not node_has_links:
            continue
        if expected is None:  # a model the table does not know: every link NVML reports
            wanted = sorted(state)
        elif sum(link.active is not False for link in state.values()) >= expected:
            continue  # the design's count is up: links beyond it are off by design
        else:
            wanted = sorted(set(range(expected)) | {n for n, x in state.items() if not x.active})
        for n in wanted:
            link = state.get(n)
            if link is not None and link.active is not False:
                continue
            out.append(
                finding(
                    "nvlink_inactive",
                    Severity.FAIL,
                    g,
                    f"NVLink {n} {'inactive' if link else 'missing'}",
                    link=n,
                    remote_pci_bus_id=None if link is None else link.remote_pci_bus_id,
                    expected_links=expected,
                )
            )
    return out


def _expected_links(ctx: CheckContext, g: GpuState) -> int | None:
    """How many NVLinks the GPU's design has active: the node set's [gpu.topology]
    override, else gpu.nvlinks_per_model, else the SKU table; None for a model none knows."""
    from slurmhealth.checks.sku import design

    configured = ctx.nvlinks_per_model.get(g.name or "")
    if configured and not {"nvlinks", "sku"} & set(ctx.topology):
        return configured
    sku = design(g.name, ctx.topology)
    return None if sku is None else sku.nvlinks


@check(
    "nvlink_errors",
    "NVLink error counters grow slower than the thresholds, judged over at least "
    "min_window_s seconds and min_count errors of earlier runs' reads: replays and "
    "recoveries per minute fail at replay_per_min / recovery_per_min, CRC (flit + data) "
    "errors per second at crc_fail_per_s. Slower or shorter growth of min_count errors or "
    "more warns; fewer (a replay now and then, as healthy links show) are only recorded.",
    action=Action.DRAIN,
    hint="a marginal NVLink (cable, connector or NVSwitch port): check "
    "`nvidia-smi nvlink -e -i N`; reseat/replace and re-run nccl-tests",
    thresholds={"replay_per_min": 1, "recovery_per_min": 1, "crc_fail_per_s": 100, **RATE},
    phases=EVERYWHERE,
)
def nvlink_errors(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _nvlink_errors(ctx, th)


def _nvlink_errors(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    out = []
    for g in readable(ctx):
        grown: dict[int, dict[str, Growth]] = {}
        rings = rings_of(ctx.counter_history, g.uuid)
        for key, value in ctx.counters.get(g.uuid or "", {}).items():
            found = growth(rings.get(key), ctx.snapshot.ts, value, th)
            if found is not None and key.startswith("nvlink."):
                _, link, name = key.split(".")
                grown.setdefault(int(link), {})[name] = found
        out += [_link_finding(g, link, rates, th) for link, rates in sorted(grown.items())]
    return out


def _link_finding(
    g: GpuState, link: int, grown: Mapping[str, Growth], th: Mapping[str, float]
) -> Finding:
    """Replays and recoveries per minute, CRC errors per second; each fails only on enough
    evidence (window and count); other growth of at least min_count errors warns. Fewer
    (a replay now and then, which a healthy link shows) are recorded, not warned on, so
    they never cost an evidence bundle."""
    limits = {
        "replay": (th["replay_per_min"], 60.0, "min"),
        "recovery": (th["recovery_per_min"], 60.0, "min"),
        "crc": (th["crc_fail_per_s"], 1.0, "s"),
    }
    rates = {n: x.per_s * limits[n][1] for n, x in grown.items()}
    failing = [n for n, r in rates.items() if grown[n].enough and r >= limits[n][0]]
    warning = [n for n, x in grown.items() if x.delta >= th["min_count"]]
    severity = Severity.FAIL if failing else Severity.WARN if warning else Severity.INFO
    span = max(x.span_s for x in grown.values())
    text = ", ".join(f"{n} {r:.3g}/{limits[n][2]}" for n, r in rates.items())
    text += f" over {span:.0f} s"
    if not all(x.enough for x in grown.values()):
        text += f" (judged from {th['min_window_s']:g} s and {th['min_count']:g} errors)"
    return finding(
        "nvlink_errors",
        severity,
        g,
        f"NVLink {link} errors growing: {text}",
        action=None if failing else Action.WARN if warning else Action.RECORD,
        link=link,
        replay_per_min=round(rates.get("replay", 0.0), 3),
        recovery_per_min=round(rates.get("recovery", 0.0), 3),
        crc_per_s=round(rates.get("crc", 0.0), 3),
        counts={n: x.delta for n, x in grown.items()},
        window_s=round(span, 3),
        failing=failing,
    )
