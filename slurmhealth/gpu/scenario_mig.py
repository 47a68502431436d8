"""The checks of a scenario's ``fabric_health`` and ``mig_devices`` fields (docs/scenarios.md),
below both the scenario loader and the simulated NVML's MIG calls, which read them."""

from __future__ import annotations

from typing import Any

from slurmhealth.model import FABRIC_HEALTH_FIELDS

MIG_SLOTS = 7  # nvmlDeviceGetMaxMigDeviceCount on A100/H100/B200
_MIG_KEYS = {"profile", "gi", "ci", "memory_mib", "used_mib", "processes"}


def check_fabric_health(value: list[Any]) -> str:
    """What is wrong with a scenario's ``fabric_health`` list ('' if nothing)."""
    if value == ["not_supported"]:
        return ""
    for item in value:
        name, _, meaning = str(item).partition(":")
        field = FABRIC_HEALTH_FIELDS.get(name)
        if field is None or meaning not in field[2].values():
            return f"{item!r}: expected 'field:meaning' of {sorted(FABRIC_HEALTH_FIELDS)}"
    return ""


def check_mig_devices(value: list[Any]) -> str:
    """What is wrong with a scenario's ``mig_devices`` list ('' if nothing)."""
    if len(value) > MIG_SLOTS:
        return f"at most {MIG_SLOTS} MIG devices"
    for item in value:
        if not isinstance(item, dict) or set(item) - _MIG_KEYS or "gi" not in item:
            return f"entries take {sorted(_MIG_KEYS)} (gi required)"
        ints = [item.get(k, 0) for k in ("gi", "ci", "memory_mib", "used_mib")]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints):
            return "gi, ci, memory_mib, used_mib are integers >= 0"
        procs = item.get("processes", [])
        if not isinstance(procs, list) or not all(
            isinstance(p, dict) and isinstance(p.get("pid"), int) and set(p) <= {"pid", "used_mib"}
            for p in procs
        ):
            return "processes are [{ pid = N, used_mib = M }]"
    return ""
