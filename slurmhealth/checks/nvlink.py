"""NVLink state and error growth (``nvidia-smi nvlink -s`` and ``nvidia-smi nvlink -e``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurmhealth.checks import EVERYWHERE, CheckContext, check, finding, readable
from slurmhealth.model import Action, Finding, NodeSnapshot, Severity

COUNTERS = ("replay_errors", "recovery_errors", "crc_flit_errors", "crc_data_errors")


def counters_of(snapshot: NodeSnapshot) -> dict[str, dict[str, int]]:
    """Cumulative NVLink error counters per GPU UUID, keyed ``"<link>.<counter>"``."""
    out: dict[str, dict[str, int]] = {}
    for g in snapshot.gpus:
        if not g.uuid or not g.nvlinks:
            continue
        values = {
            f"{link.link}.{name}": value
            for link in g.nvlinks
            for name in COUNTERS
            if (value := getattr(link, name)) is not None
        }
        if values:
            out[g.uuid] = values
    return out


@check(
    "nvlink_inactive",
    "Every NVLink the GPU model should have is active (gpu.nvlinks_per_model; for models not "
    "listed, every link NVML reports on a node that has active links).",
    action=Action.DRAIN,
    hint="an NVLink is down and NCCL will fall back to slower paths: check "
    "`nvidia-smi nvlink -s -i N`, the NVSwitch trays and fabric manager; reset or reboot",
    phases=EVERYWHERE,
)
def nvlink_inactive(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    node_has_links = any(link.active for g in readable(ctx) for link in g.nvlinks or ())
    out = []
    for g in readable(ctx):
        expected = ctx.nvlinks_per_model.get(g.name or "")
        if g.nvlinks is None:  # NVLink state not supported: unknown, never a failure
            continue
        state = {link.link: link for link in g.nvlinks or ()}
        if expected:
            wanted = list(range(expected))
        elif node_has_links:
            wanted = sorted(state)
        else:
            continue
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


@check(
    "nvlink_errors",
    "NVLink error counters grow slower than the thresholds since the last run: replays and "
    "recoveries per minute fail at replay_per_min / recovery_per_min; CRC errors per second "
    "fail at crc_fail_per_s and warn above zero.",
    action=Action.DRAIN,
    hint="a marginal NVLink (cable, connector or NVSwitch port): check "
    "`nvidia-smi nvlink -e -i N`; reseat/replace and re-run nccl-tests",
    thresholds={"replay_per_min": 1, "recovery_per_min": 1, "crc_fail_per_s": 100},
    phases=EVERYWHERE,
)
def nvlink_errors(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    prev: Mapping[str, Any] = ctx.previous_counters or {}
    prev_ts, prev_gpus = prev.get("ts"), prev.get("gpus", {})
    if not isinstance(prev_ts, int | float):
        return []
    dt = ctx.snapshot.ts - prev_ts
    if dt <= 0:
        return []
    now = counters_of(ctx.snapshot)
    out = []
    for g in readable(ctx):
        before = prev_gpus.get(g.uuid or "", {})
        grown: dict[int, dict[str, float]] = {}
        for key, value in now.get(g.uuid or "", {}).items():
            old = before.get(key)
            if (
                isinstance(old, int | float) and value > old
            ):  # lower: counters reset by a driver reload
                link_no, name = key.split(".", 1)
                grown.setdefault(int(link_no), {})[name] = (value - old) / dt
        for link, rates in sorted(grown.items()):
            replay_pm = rates.get("replay_errors", 0.0) * 60
            recovery_pm = rates.get("recovery_errors", 0.0) * 60
            crc_ps = rates.get("crc_flit_errors", 0.0) + rates.get("crc_data_errors", 0.0)
            failing = (
                replay_pm >= th["replay_per_min"]
                or recovery_pm >= th["recovery_per_min"]
                or crc_ps >= th["crc_fail_per_s"]
            )
            parts = [
                f"{label} {v:.3g}/{unit}"
                for label, v, unit in (
                    ("replay", replay_pm, "min"),
                    ("recovery", recovery_pm, "min"),
                    ("CRC", crc_ps, "s"),
                )
                if v > 0
            ]
            out.append(
                finding(
                    "nvlink_errors",
                    Severity.FAIL if failing else Severity.WARN,
                    g,
                    f"NVLink {link} errors growing: {', '.join(parts)} over {dt:.0f} s",
                    action=None if failing else Action.WARN,
                    link=link,
                    replay_per_min=round(replay_pm, 3),
                    recovery_per_min=round(recovery_pm, 3),
                    crc_per_s=round(crc_ps, 3),
                    window_s=round(dt, 3),
                )
            )
    return out
