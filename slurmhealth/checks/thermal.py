"""Thermals and clocks: clock-event (throttle) reasons and the device's thermal margin."""

from __future__ import annotations

from collections.abc import Mapping

from slurmhealth.checks.engine import EVERYWHERE, CheckContext, check, finding, readable
from slurmhealth.model import Action, Finding, Severity, clock_event_names

# the clock-event reasons that are faults (bits: slurmhealth.model.CLOCK_EVENT_REASONS);
# SW power cap, idle, application clocks and sync boost are normal operation
SEVERITY = {
    "hw_slowdown": Severity.FAIL,
    "hw_thermal": Severity.FAIL,
    "hw_power_brake": Severity.FAIL,
    "sw_thermal": Severity.WARN,
}


@check(
    "clock_events",
    "No hardware slowdown, HW thermal slowdown or HW power brake (fail) and no SW thermal "
    "slowdown (warn) among the current clock-event reasons (nvidia-smi -q -d PERFORMANCE).",
    action=Action.DRAIN,
    hint="clocks are being cut: HW slowdown/thermal means cooling or a sensor fault "
    "(check fans, airflow, inlet temperature), power brake means the PSU/BMC asked for it",
    phases=EVERYWHERE,
)
def clock_events(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _clock_events(ctx, th)


def _clock_events(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    out = []
    for g in readable(ctx):
        mask = g.clock_event_reasons
        if not mask:
            continue
        for name in clock_event_names(mask):
            if (sev := SEVERITY.get(name)) is not None:
                out.append(
                    finding(
                        "clock_events",
                        sev,
                        g,
                        f"clocks limited by {name.replace('_', ' ')}",
                        action=None if sev >= Severity.FAIL else Action.WARN,
                        reason=name,
                        mask=f"0x{mask:x}",
                        sm_clock_mhz=g.sm_clock_mhz,
                    )
                )
    return out


@check(
    "thermal_margin",
    "Degrees C left before the GPU's own slowdown temperature (nvmlDeviceGetMarginTemperature): "
    "at or below fail_c fails, below warn_c warns.",
    action=Action.DRAIN,
    hint="the GPU runs at its thermal limit: check cooling (fans, airflow, liquid loop) "
    "and `nvidia-smi -q -d TEMPERATURE`",
    thresholds={"warn_c": 5, "fail_c": 0},
    phases=EVERYWHERE,
)
def thermal_margin(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _thermal_margin(ctx, th)


def _thermal_margin(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    out = []
    for g in readable(ctx):
        m = g.margin_temperature_c
        if m is None:
            continue
        if m <= th["fail_c"]:
            sev, action = Severity.FAIL, None
        elif m < th["warn_c"]:
            sev, action = Severity.WARN, Action.WARN
        else:
            continue
        out.append(
            finding(
                "thermal_margin",
                sev,
                g,
                f"{m} C of thermal margin left ({g.temperature_c} C)",
                action=action,
                margin_c=m,
                temperature_c=g.temperature_c,
            )
        )
    return out
