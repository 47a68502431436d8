"""PCIe link of the GPU (``nvidia-smi -q -d PCIE``)."""

from __future__ import annotations

from collections.abc import Mapping

from slurmhealth.checks.counters import RATE_THRESHOLDS, rate_warnings
from slurmhealth.checks.engine import CheckContext, check, finding, readable
from slurmhealth.model import Action, Finding, Severity


@check(
    "pcie_link",
    "The PCIe link runs at the GPU's maximum width, and at its maximum generation when the "
    "GPU is busy (GPUs lower the generation when idle to save power, so that is not judged "
    "below min_util_for_gen_pct).",
    action=Action.WARN,
    hint="a downgraded PCIe link halves host<->GPU and GPUDirect bandwidth: reseat the GPU "
    "or riser, check `lspci -vv` LnkSta, update the BIOS",
    thresholds={"min_util_for_gen_pct": 50},
)
def pcie_link(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _pcie_link(ctx, th)


def _pcie_link(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    out = []
    for g in readable(ctx):
        if g.pcie_width is not None and g.pcie_width_max and g.pcie_width < g.pcie_width_max:
            out.append(
                finding(
                    "pcie_link",
                    Severity.WARN,
                    g,
                    f"PCIe width x{g.pcie_width}, max x{g.pcie_width_max}",
                    width=g.pcie_width,
                    width_max=g.pcie_width_max,
                )
            )
        busy = (g.utilization_gpu_pct or 0) >= th["min_util_for_gen_pct"]
        if busy and g.pcie_gen is not None and g.pcie_gen_max and g.pcie_gen < g.pcie_gen_max:
            out.append(
                finding(
                    "pcie_link",
                    Severity.WARN,
                    g,
                    f"PCIe gen {g.pcie_gen} under load, max gen {g.pcie_gen_max}",
                    gen=g.pcie_gen,
                    gen_max=g.pcie_gen_max,
                    utilization_pct=g.utilization_gpu_pct,
                )
            )
    return out


@check(
    "pcie_replay",
    'PCIe replays (link-level retransmissions, nvidia-smi -q -d PCIE "Replays Since Reset") '
    "stay below warn_per_min, judged over at least min_window_s seconds and min_count "
    "replays (DCGM's health watch warns above 8 a minute).",
    action=Action.WARN,
    hint="PCIe replays: signal integrity on the GPU's link (riser, slot, cable); reseat the "
    "GPU, check `lspci -vv` for AER errors on its bus id",
    thresholds={"warn_per_min": 8, **RATE_THRESHOLDS},
)
def pcie_replay(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _pcie_replay(ctx, th)


def _pcie_replay(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return rate_warnings(ctx, th, "pcie_replay", "pcie_replay", "PCIe replays")
