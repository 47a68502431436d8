"""Scenario files for the simulated NVML: parsing, validation and presets.

A scenario is TOML (format in ``docs/scenarios.md``). Loading flattens every GPU into a
dict of dotted field paths (``temperature``, ``nvlink.7.state``) so faults can address any
field the same way. Every error names the file and the key.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurmhealth.errors import ScenarioError
from slurmhealth.gpu.presets import PRESETS, preset_gpu
from slurmhealth.model import CLOCK_EVENT_REASONS

CLOCK_REASONS = CLOCK_EVENT_REASONS  # scenario `clock_event_reasons` names
FABRIC_STATES = ("not_supported", "not_started", "in_progress", "completed")
# groups of NVML calls a scenario can mark unsupported (they raise NVMLError_NotSupported)
SUPPORT_GROUPS = (
    "serial", "minor_number", "persistence_mode", "temperature", "margin_temperature",
    "power", "power_limit", "energy", "utilization", "memory", "clocks", "clock_event_reasons",
    "pcie", "pcie_replay", "ecc", "row_remap", "retired_pages", "nvlink", "nvlink_errors",
    "nvlink_counter_api", "fabric", "processes",
    "fabric_v", "mig",  # nvmlDeviceGetGpuFabricInfoV; the MIG calls
)  # fmt: skip

GPU_FIELDS: dict[str, type] = {
    "name": str, "uuid": str, "serial": str, "pci_bus_id": str, "minor_number": int,
    "persistence_mode": bool, "temperature": int, "margin_temperature": int,
    "power_usage_w": float, "power_limit_w": float, "energy_j": float,
    "utilization_gpu": int, "utilization_memory": int,
    "memory_total_mib": int, "memory_used_mib": int,
    "sm_clock": int, "sm_clock_max": int, "mem_clock": int, "clock_event_reasons": list,
    "pcie_gen": int, "pcie_gen_max": int, "pcie_width": int, "pcie_width_max": int,
    "pcie_replay": int, "ecc_enabled": bool, "ecc_volatile_uncorrectable": int,
    "ecc_volatile_correctable": int, "ecc_aggregate_uncorrectable": int,
    "remapped_rows_correctable": int, "remapped_rows_uncorrectable": int,
    "remap_pending": bool, "remap_failure": bool, "retired_pages_pending": bool,
    "fabric_state": str, "fabric_status": str, "processes": list,
    "lost": bool, "reset_required": bool, "hang": bool, "hang_s": float,
    "not_supported": list, "nvlink_count": int,
    # fabric info V (gpu/presets_more.py) and MIG mode
    "fabric_clique_id": int, "fabric_cluster_uuid": str, "fabric_health": list,
    "mig_mode": bool, "mig_devices": list,
}  # fmt: skip
NVLINK_FIELDS: dict[str, type] = {
    "state": str, "remote_pci_bus_id": str, "version": int,
    "replay": int, "recovery": int, "crc_flit": int, "crc_data": int,
}  # fmt: skip
CLEARS_ON = ("reset", "reboot", "never")  # a fault's lifetime: what makes it go away
NODE_KEYS = {"preset", "gpus", "driver_version", "nvml_version", "all_gpus", "gpu", "faults"}
TOP_KEYS = NODE_KEYS | {"name", "description", "expect", "nodes", "replay"}


@dataclass(frozen=True)
class Fault:
    """A change that starts ``at`` seconds into the scenario (and ends at ``until``)."""

    at: float
    gpus: tuple[int, ...] | None  # None: every GPU
    set: Mapping[str, Any] = field(default_factory=dict)
    rate: Mapping[str, float] = field(default_factory=dict)  # added per second after ``at``
    until: float | None = None
    xid: int | None = None
    xid_message: str = ""
    # what clears it: a GPU reset (or a reboot), a node reboot, nothing; None: time only
    clears_on: str | None = None
    xid_gpu_instance: int | None = None  # MIG: the line names this GPU instance (GPU-I:NN)


@dataclass(frozen=True)
class NodeScenario:
    node: str
    driver_version: str
    nvml_version: str
    gpus: tuple[dict[str, Any], ...]  # flat field dict per GPU index
    faults: tuple[Fault, ...]


@dataclass(frozen=True)
class Scenario:
    path: str
    name: str
    description: str
    data: Mapping[str, Any]
    expect: Mapping[str, Any]
    replay: str | None = None  # a recording of real NVML answers (gpu/replay.py) to replay

    def for_node(self, node: str) -> NodeScenario:
        return _build_node(self.path, self.data, node)


def _flatten(prefix: str, table: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out |= _flatten(path + ".", value)
        else:
            out[path] = value
    return out


def _table(src: str, where: str, value: Any) -> dict[str, Any]:
    """``value`` flattened (see :func:`_flatten`); anything but a table is an error at ``where``."""
    if not isinstance(value, dict):
        raise ScenarioError(src, where, f"expected a table, got {value!r}")
    return _flatten("", value)


def _check_field(src: str, where: str, path: str, value: Any, numeric_only: bool = False) -> None:
    parts = path.split(".")
    if parts[0] == "nvlink" and len(parts) == 3 and parts[1].isdigit():
        tp: type | None = NVLINK_FIELDS.get(parts[2])
    else:
        tp = GPU_FIELDS.get(path)
    if tp is None:
        raise ScenarioError(src, f"{where}.{path}", "unknown field (see docs/scenarios.md)")
    if numeric_only:
        tp = float
    ok = (
        (tp is bool and isinstance(value, bool))
        or (tp is int and isinstance(value, int) and not isinstance(value, bool))
        or (tp is float and isinstance(value, int | float) and not isinstance(value, bool))
        or (tp is str and isinstance(value, str))
        or (tp is list and isinstance(value, list))
    )
    if not ok:
        raise ScenarioError(src, f"{where}.{path}", f"expected {tp.__name__}, got {value!r}")
    if tp in (int, float) and not _finite(value):
        raise ScenarioError(src, f"{where}.{path}", f"out of range: {value!r}")
    if path == "fabric_state" and value not in FABRIC_STATES:
        raise ScenarioError(src, f"{where}.{path}", f"must be one of {', '.join(FABRIC_STATES)}")
    if path.endswith(".state") and parts[0] == "nvlink" and value not in ("active", "inactive"):
        raise ScenarioError(src, f"{where}.{path}", "must be 'active' or 'inactive'")
    if path == "clock_event_reasons":
        bad = [r for r in value if not isinstance(r, str) or r not in CLOCK_REASONS]
        if bad:
            raise ScenarioError(src, f"{where}.{path}", f"unknown reason(s) {bad}")
    if path == "processes":
        for p in value:
            if not isinstance(p, dict) or not isinstance(p.get("pid"), int):
                raise ScenarioError(src, f"{where}.{path}", "expected [{ pid = N, used_mib = M }]")
            if not isinstance(p.get("used_mib", 0), int) or set(p) - {"pid", "used_mib", "name"}:
                raise ScenarioError(src, f"{where}.{path}", "entries take pid, used_mib, name")
    if path in ("fabric_health", "mig_devices"):
        from slurmhealth.gpu.scenario_mig import check_fabric_health, check_mig_devices

        problem = (check_fabric_health if path == "fabric_health" else check_mig_devices)(value)
        if problem:
            raise ScenarioError(src, f"{where}.{path}", problem)
    if path == "not_supported":
        bad = [g for g in value if g not in SUPPORT_GROUPS]
        if bad:
            raise ScenarioError(src, f"{where}.{path}", f"unknown group(s) {bad}")


def _finite(value: int | float) -> bool:
    """A number TOML can hold (64-bit integers) and a float can represent (not nan/inf)."""
    if isinstance(value, int):
        return -(2**63) <= value < 2**63
    return math.isfinite(value)


def _gpu_list(src: str, where: str, value: Any, count: int) -> tuple[int, ...] | None:
    if value is None or value == "all":
        return None
    items = value if isinstance(value, list) else [value]
    for i in items:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < count:
            raise ScenarioError(src, where, f"GPU index {i!r} outside 0..{count - 1}")
    return tuple(items)


def _parse_fault(src: str, where: str, raw: Any, count: int) -> Fault:
    if not isinstance(raw, dict):
        raise ScenarioError(src, where, "expected a table")
    known = {"at", "until", "gpu", "node", "set", "rate", "xid", "xid_message", "note"}
    known |= {"clears_on", "xid_gpu_instance"}
    for key in raw:
        if key not in known:
            raise ScenarioError(src, f"{where}.{key}", f"unknown key (known: {sorted(known)})")
    sets = _table(src, f"{where}.set", raw.get("set", {}))
    rates = _table(src, f"{where}.rate", raw.get("rate", {}))
    for path, value in sets.items():
        _check_field(src, f"{where}.set", path, value)
    for path, value in rates.items():
        _check_field(src, f"{where}.rate", path, value, numeric_only=True)
    at, until, xid = raw.get("at", 0.0), raw.get("until"), raw.get("xid")
    if isinstance(at, bool) or not isinstance(at, int | float) or not (_finite(at) and at >= 0):
        raise ScenarioError(src, f"{where}.at", "expected seconds >= 0")
    if until is not None and (
        isinstance(until, bool) or not isinstance(until, int | float) or not _finite(until)
        or until <= at
    ):  # fmt: skip
        raise ScenarioError(src, f"{where}.until", "expected seconds after 'at'")
    if xid is not None and (isinstance(xid, bool) or not isinstance(xid, int) or xid <= 0):
        raise ScenarioError(src, f"{where}.xid", "expected a positive integer")
    if not (sets or rates or xid):
        raise ScenarioError(src, where, "a fault needs 'set', 'rate' or 'xid'")
    return Fault(
        clears_on=_clears_on(src, f"{where}.clears_on", raw.get("clears_on")),
        at=float(at),
        gpus=_gpu_list(src, f"{where}.gpu", raw.get("gpu"), count),
        set=sets,
        rate={k: float(v) for k, v in rates.items()},
        until=None if until is None else float(until),
        xid=xid,
        xid_message=str(raw.get("xid_message", "")),
        xid_gpu_instance=_gpu_instance(src, where, raw.get("xid_gpu_instance")),
    )


def _clears_on(src: str, where: str, value: Any) -> str | None:
    if value is not None and value not in CLEARS_ON:
        raise ScenarioError(src, where, f"must be one of {', '.join(CLEARS_ON)}")
    return None if value is None else str(value)


def _lifetime_faults(src: str, per_gpu: Mapping[str, Any]) -> list[Fault]:
    """A ``[gpu.N]`` table with ``clears_on`` is a fault from the start (``at = 0``) on
    that GPU, cleared as it says, instead of the GPU's lasting state."""
    out = []
    for key, table in per_gpu.items():
        if isinstance(table, dict) and "clears_on" in table:
            where = f"gpu.{key}"
            sets = _table(src, where, {k: v for k, v in table.items() if k != "clears_on"})
            for path, value in sets.items():
                _check_field(src, where, path, value)
            clears = _clears_on(src, f"{where}.clears_on", table["clears_on"])
            out.append(Fault(at=0.0, gpus=(int(key),), set=sets, clears_on=clears))
    return out


def _gpu_instance(src: str, where: str, value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or not 0 <= value < 64):  # fmt: skip
        raise ScenarioError(src, f"{where}.xid_gpu_instance", "expected a GPU instance id 0..63")
    return value


def _merged_node(src: str, data: Mapping[str, Any], node: str) -> dict[str, Any]:
    spec = {k: v for k, v in data.items() if k in NODE_KEYS}
    nodes = data.get("nodes", {})
    name = node if node in nodes else "*"
    override = nodes.get(name)
    if override:
        for key, value in override.items():
            where = f"nodes.{name}.{key}"
            if key not in NODE_KEYS:
                raise ScenarioError(src, where, "unknown key")
            if key in ("gpu", "all_gpus") and not isinstance(value, dict):
                raise ScenarioError(src, where, "expected a table")
            tables = value.items() if key == "gpu" else [("", value)] if key == "all_gpus" else []
            for index, table in tables:
                if not isinstance(table, dict):
                    raise ScenarioError(src, f"{where}.{index}", "expected a table")
                for path, v in _flatten("", table).items():  # errors name the node's table
                    if path != "clears_on" or key != "gpu":
                        _check_field(src, f"{where}.{index}".rstrip("."), path, v)
            if key == "gpu":  # merge per GPU: [nodes.n2.gpu.1] adds to [gpu.1]
                merged = dict(spec.get("gpu", {}))
                for index, table in value.items():
                    merged[index] = {**merged.get(index, {}), **table}
                spec["gpu"] = merged
            elif key == "all_gpus":
                spec["all_gpus"] = {**spec.get("all_gpus", {}), **value}
            elif key == "faults":
                spec["faults"] = [*spec.get("faults", []), *value]
            else:
                spec[key] = value
    return spec


def _build_node(src: str, data: Mapping[str, Any], node: str) -> NodeScenario:
    spec = _merged_node(src, data, node)
    preset = spec.get("preset", "h100-sxm")
    if preset not in PRESETS:
        raise ScenarioError(src, "preset", f"unknown preset {preset!r} (known: {PRESETS})")
    count = spec.get("gpus", 8)
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= 64:
        raise ScenarioError(src, "gpus", "expected a GPU count 0..64")
    all_gpus = _table(src, "all_gpus", spec.get("all_gpus", {}))
    per_gpu = spec.get("gpu", {})
    if not isinstance(per_gpu, dict):
        raise ScenarioError(src, "gpu", "expected tables [gpu.N]")
    for key in per_gpu:
        if not key.isdigit() or int(key) >= count:
            raise ScenarioError(src, f"gpu.{key}", f"GPU index outside 0..{count - 1}")
    gpus = []
    lifetimes = _lifetime_faults(src, per_gpu)
    for i in range(count):
        state = preset_gpu(preset, node, i)
        own = per_gpu.get(str(i), {})
        own = {} if isinstance(own, dict) and "clears_on" in own else own
        for where, table in (("all_gpus", all_gpus), (f"gpu.{i}", _table(src, f"gpu.{i}", own))):
            for path, value in table.items():
                _check_field(src, where, path, value)
                state[path] = value
        for link in range(state["nvlink_count"], 64):
            if f"nvlink.{link}.state" in state:
                raise ScenarioError(src, f"gpu.{i}.nvlink.{link}", "link beyond nvlink_count")
        gpus.append(state)
    faults = spec.get("faults", [])
    if not isinstance(faults, list):
        raise ScenarioError(src, "faults", "expected an array of tables [[faults]]")
    parsed = tuple(
        _parse_fault(src, f"faults[{n}]", raw, count)
        for n, raw in enumerate(faults)
        if not isinstance(raw, dict) or raw.get("node") in (None, node)
    )
    return NodeScenario(
        node=node,
        driver_version=str(spec.get("driver_version", "550.90.07")),
        nvml_version=str(spec.get("nvml_version", "12.550.90.07")),
        gpus=tuple(gpus),
        faults=(*lifetimes, *parsed),
    )


def load_scenario(path: str) -> Scenario:
    """Read and validate a scenario file; raises :class:`ScenarioError` naming file and key."""
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ScenarioError(path, None, "file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(path, None, f"cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(path, None, f"invalid TOML: {exc}") from None
    for key in data:
        if key not in TOP_KEYS:
            raise ScenarioError(path, key, f"unknown key (known: {', '.join(sorted(TOP_KEYS))})")
    replay = None
    if "replay" in data:
        from slurmhealth.gpu.replay import replay_path

        replay = replay_path(path, data)
    else:
        _check_nodes(path, data)
    expect = data.get("expect", {})
    if not isinstance(expect, dict):
        raise ScenarioError(path, "expect", "expected a table")
    return Scenario(
        path=path,
        name=str(data.get("name", path.rsplit("/", 1)[-1].removesuffix(".toml"))),
        description=str(data.get("description", "")),
        data=data,
        expect=expect,
        replay=replay,
    )


def _check_nodes(path: str, data: Mapping[str, Any]) -> None:
    """Build every node of the scenario now, so an error shows at load, not at first use."""
    nodes = data.get("nodes", {})
    if not isinstance(nodes, dict) or not all(isinstance(v, dict) for v in nodes.values()):
        raise ScenarioError(path, "nodes", "expected tables [nodes.NAME]")
    for name in [*nodes, "__default__"]:
        _build_node(path, data, name)
