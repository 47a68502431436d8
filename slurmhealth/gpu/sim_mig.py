"""The simulated NVML's fabric-info V and MIG calls (a mixin of
:class:`slurmhealth.gpu.sim.SimulatedNvml`); the checks of their scenario fields are
``scenario_mig``'s.

Scenario fields (docs/scenarios.md): ``fabric_clique_id``, ``fabric_cluster_uuid``,
``fabric_health`` (``"name:meaning"`` per health-mask field, e.g. ``"degraded_bw:degraded"``,
or ``["not_supported"]``), ``mig_mode`` and ``mig_devices`` (``[{ profile, gi, ci,
memory_mib, used_mib, processes }]``).
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass
from typing import Any

import pynvml

from slurmhealth.gpu.scenario import FABRIC_STATES
from slurmhealth.gpu.scenario_mig import MIG_SLOTS
from slurmhealth.gpu.sim_device import SimHandle, _Process, fabric_status_code
from slurmhealth.model import FABRIC_HEALTH_FIELDS


@dataclass(frozen=True)
class SimMigHandle(SimHandle):
    """A MIG device's handle: ``index`` is its parent GPU, ``mig`` its slot."""

    mig: int = 0


def health_mask(items: list[str]) -> int:
    """The healthMask of a scenario's ``fabric_health`` (fields not listed: not supported)."""
    mask = 0
    for item in items:
        name, _, meaning = item.partition(":")
        if name in FABRIC_HEALTH_FIELDS:
            shift, _, values = FABRIC_HEALTH_FIELDS[name]
            mask |= next(v for v, m in values.items() if m == meaning) << shift
    return mask


class MigQueries:
    """``nvmlDeviceGetGpuFabricInfoV`` and the MIG getters; on a MIG handle the identity,
    memory and process getters answer for that instance."""

    def field(self, index: int, path: str) -> Any:
        raise NotImplementedError

    def _device(self, handle: SimHandle, group: str | None = None) -> int:
        raise NotImplementedError

    def nvmlDeviceGetGpuFabricInfoV(self, h: SimHandle, ref: Any) -> int:
        i = self._device(h, "fabric")
        if "fabric_v" in self.field(i, "not_supported"):  # a library from before the V call
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        state = self.field(i, "fabric_state")
        if state == "not_supported":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = ref._obj  # ctypes.byref(struct)
        info.state = FABRIC_STATES.index(state)
        info.status = fabric_status_code(self.field(i, "fabric_status"))
        info.cliqueId = int(self.field(i, "fabric_clique_id"))
        cluster = str(self.field(i, "fabric_cluster_uuid"))
        info.clusterUuid[:] = list(uuidlib.UUID(cluster).bytes if cluster else bytes(16))
        info.healthMask = health_mask(list(self.field(i, "fabric_health")))
        return int(pynvml.NVML_SUCCESS)

    def _migs(self, h: SimHandle) -> tuple[int, list[dict[str, Any]]]:
        i = self._device(h, "mig")
        return i, list(self.field(i, "mig_devices")) if self.field(i, "mig_mode") else []

    def _mig(self, h: SimMigHandle) -> dict[str, Any]:
        i, devices = self._migs(h)
        if h.mig >= len(devices):  # the instance was destroyed since the handle was taken
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        parent = str(self.field(i, "uuid"))
        d = devices[h.mig]
        return d | {
            "uuid": "MIG-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{parent}/{d['gi']}")),
            "name": f"{self.field(i, 'name')} MIG {d.get('profile', '1g')}",
        }

    def nvmlDeviceGetMigMode(self, h: SimHandle) -> list[int]:
        i = self._device(h, "mig")
        mode = int(bool(self.field(i, "mig_mode")))
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, h: SimHandle) -> int:
        self._device(h, "mig")
        return MIG_SLOTS

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: SimHandle, index: int) -> SimMigHandle:
        i, devices = self._migs(h)
        if not 0 <= index < len(devices):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return SimMigHandle(i, index)

    def nvmlDeviceGetGpuInstanceId(self, h: SimHandle) -> int:
        if not isinstance(h, SimMigHandle):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(self._mig(h)["gi"])

    def nvmlDeviceGetComputeInstanceId(self, h: SimHandle) -> int:
        if not isinstance(h, SimMigHandle):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(self._mig(h).get("ci", 0))

    def nvmlDeviceGetUUID(self, h: SimHandle) -> str:
        if isinstance(h, SimMigHandle):
            return str(self._mig(h)["uuid"])
        return super().nvmlDeviceGetUUID(h)  # type: ignore[misc,no-any-return]

    def nvmlDeviceGetName(self, h: SimHandle) -> str:
        if isinstance(h, SimMigHandle):
            return str(self._mig(h)["name"])
        return super().nvmlDeviceGetName(h)  # type: ignore[misc,no-any-return]

    def nvmlDeviceGetMemoryInfo(self, h: SimHandle) -> Any:
        if isinstance(h, SimMigHandle):
            d = self._mig(h)
            total, used = int(d.get("memory_mib", 0)) << 20, int(d.get("used_mib", 0)) << 20
            return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)
        return super().nvmlDeviceGetMemoryInfo(h)  # type: ignore[misc]

    def nvmlDeviceGetComputeRunningProcesses(self, h: SimHandle) -> list[_Process]:
        if isinstance(h, SimMigHandle):
            return [
                _Process(int(p["pid"]), int(p["used_mib"]) << 20 if "used_mib" in p else None)
                for p in self._mig(h).get("processes", [])
            ]
        return super().nvmlDeviceGetComputeRunningProcesses(h)  # type: ignore[misc,no-any-return]
