"""NVSwitch fabric registration (``nvidia-smi -q | grep -A3 Fabric``)."""

from __future__ import annotations

from collections.abc import Mapping

from slurmhealth.checks import CheckContext, check, finding, readable
from slurmhealth.model import Action, Finding, Severity


@check(
    "fabric_state",
    "On NVSwitch systems the GPU's fabric registration is completed with status success.",
    action=Action.DRAIN,
    hint="the GPU is not part of the NVLink fabric: check `systemctl status "
    "nvidia-fabricmanager` and its log; restart it or reboot",
)
def fabric_state(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
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
    return out
