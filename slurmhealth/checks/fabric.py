"""NVSwitch fabric registration (``nvidia-smi -q | grep -A3 Fabric``) and, where NVML has
the fabric-info V API (GB200 NVL72, B200), the fabric's health mask: a GPU whose registration
is not complete or whose fabric health is degraded is not ready for a job, with the reason."""

from __future__ import annotations

from collections.abc import Mapping

from slurmhealth.checks.engine import CheckContext, check, finding, readable
from slurmhealth.model import Action, Finding, GpuState, Severity, fabric_health

# health-mask fields whose value means the GPU is not ready (FAIL) or is recovering (WARN)
_NOT_READY = {
    "degraded_bw": {"degraded"},
    "route_unhealthy": {"unhealthy"},
    "gfm_state": {"disconnected"},
    "partition_assigned": {"unassigned"},
}
_RECOVERING = {"route_recovery": {"in_progress"}, "access_timeout_recovery": {"in_progress"}}


@check(
    "fabric_state",
    "On NVSwitch systems the GPU's fabric registration is completed with status success, and "
    "where NVML reports the fabric health mask (GB200 NVL72), no field says degraded "
    "bandwidth, an unhealthy route, a disconnected fabric manager, no partition or an "
    "incorrect configuration (fail); route or access-timeout recovery in progress warns.",
    action=Action.DRAIN,
    hint="the GPU is not part of the NVLink fabric: check `systemctl status "
    "nvidia-fabricmanager` and its log; restart it or reboot",
)
def fabric_state(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _fabric_state(ctx, th)


def _fabric_state(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    out = []
    for g in readable(ctx):
        if g.fabric_state is None:
            continue
        if g.fabric_state != "completed":
            out.append(
                finding(
                    "fabric_state",
                    Severity.FAIL,
                    g,
                    f"NVSwitch fabric state {g.fabric_state.replace('_', ' ')}",
                    state=g.fabric_state,
                    status=g.fabric_status,
                )
            )
        elif g.fabric_status not in (None, "ok"):
            out.append(
                finding(
                    "fabric_state",
                    Severity.FAIL,
                    g,
                    f"NVSwitch fabric registration failed: {g.fabric_status}",
                    state=g.fabric_state,
                    status=g.fabric_status,
                )
            )
        else:
            out += _health(g)
    return out


def _health(g: GpuState) -> list[Finding]:
    """The health mask of a registered GPU: degraded fields fail, recoveries warn."""
    if not g.fabric_health_mask:
        return []
    health = fabric_health(g.fabric_health_mask)
    bad = [f"{k} {v}" for k, v in health.items() if v in _NOT_READY.get(k, ())]
    config = health.get("incorrect_configuration", "none")
    if config != "none":
        bad.append(f"incorrect_configuration {config}")
    slow = [f"{k} {v}" for k, v in health.items() if v in _RECOVERING.get(k, ())]
    if not (bad or slow):
        return []
    return [
        finding(
            "fabric_state",
            Severity.FAIL if bad else Severity.WARN,
            g,
            f"NVLink fabric health {'degraded' if bad else 'recovering'}: "
            + ", ".join(bad or slow),
            action=None if bad else Action.WARN,
            state=g.fabric_state,
            health=health,
            health_mask=g.fabric_health_mask,
            clique_id=g.fabric_clique_id,
            cluster_uuid=g.fabric_cluster_uuid,
        )
    ]


@check(
    "imex",
    "Where the job's partition runs multi-node NVLink jobs ([gpu] imex_partitions), the "
    "nvidia-imex daemon runs on the node and at least one IMEX channel exists "
    "(/dev/nvidia-caps-imex-channels/channelN).",
    action=Action.DRAIN,
    hint="multi-node NVLink jobs need IMEX: check `systemctl status nvidia-imex`, its "
    "nodes_config.cfg, and that the channel device exists (nvidia-modprobe -i 0 or the "
    "driver's NVreg_CreateImexChannel0=1)",
)
def imex(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _imex(ctx, th)


def _imex(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    state = ctx.imex
    if state is None:
        return []
    missing = []
    if state.daemon_running is False:
        missing.append("the nvidia-imex daemon is not running")
    if not state.channels:
        missing.append(f"no IMEX channel in {state.channel_dir}")
    if not missing:
        return []
    return [
        finding(
            "imex",
            Severity.FAIL,
            None,
            "IMEX not ready for multi-node NVLink: " + "; ".join(missing),
            daemon_running=state.daemon_running,
            channels=list(state.channels),
            channel_dir=state.channel_dir,
        )
    ]
