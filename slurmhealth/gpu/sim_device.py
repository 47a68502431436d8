"""The device queries of the simulated NVML: one method per ``pynvml`` getter.

Each answers from the scenario's flat field dict through :meth:`DeviceQueries.field` (faults
applied) after :meth:`DeviceQueries._device` has decided whether the GPU answers at all (lost,
reset required, hung, or the call's group marked unsupported). The library-level parts (init,
clock, events, kernel log) are in :mod:`slurmhealth.gpu.sim`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pynvml

_ERRORS = {  # error code -> pynvml's fabric-status text for fabric_status
    "ok": pynvml.NVML_SUCCESS,
    "timeout": pynvml.NVML_ERROR_TIMEOUT,
    "unknown": pynvml.NVML_ERROR_UNKNOWN,
    "not_ready": getattr(pynvml, "NVML_ERROR_NOT_READY", pynvml.NVML_ERROR_UNKNOWN),
}


def fabric_status_code(name: str) -> int:
    """The NVML return code a scenario's ``fabric_status`` stands for."""
    return int(_ERRORS.get(name, pynvml.NVML_ERROR_UNKNOWN))


@dataclass(frozen=True)
class SimHandle:
    index: int


@dataclass(frozen=True)
class _PciInfo:
    busId: bytes


@dataclass(frozen=True)
class _Process:
    pid: int
    usedGpuMemory: int | None


_COUNTER_API = {
    pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay",
    pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
    pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
    pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data",
}
# field ids scoped by link (scopeId = link), as Hopper and later answer them
_SCOPED_FIELDS = {
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: "replay",
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: "recovery",
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC: "crc_flit",
}
# one field id per link and counter, links 0..11
_PER_LINK_FIELDS = {
    getattr(pynvml, f"NVML_FI_DEV_NVLINK_{kind}_ERROR_COUNT_L{link}"): (link, name)
    for link in range(12)
    for kind, name in (
        ("REPLAY", "replay"), ("RECOVERY", "recovery"),
        ("CRC_FLIT", "crc_flit"), ("CRC_DATA", "crc_data"),
    )
}  # fmt: skip


class DeviceQueries:
    """The ``nvmlDeviceGet*`` functions of :class:`slurmhealth.gpu.sim.SimulatedNvml`."""

    def field(self, index: int, path: str) -> Any:
        """The value of one scenario field of GPU ``index`` now (faults applied)."""
        raise NotImplementedError

    def _device(self, handle: SimHandle, group: str | None = None) -> int:
        """The GPU index of ``handle``; raises what the GPU (or the call's group) answers."""
        raise NotImplementedError

    # -- identity ------------------------------------------------------------------
    def nvmlDeviceGetUUID(self, h: SimHandle) -> str:
        return str(self.field(self._device(h), "uuid"))

    def nvmlDeviceGetName(self, h: SimHandle) -> str:
        return str(self.field(self._device(h), "name"))

    def nvmlDeviceGetSerial(self, h: SimHandle) -> str:
        return str(self.field(self._device(h, "serial"), "serial"))

    def nvmlDeviceGetPciInfo(self, h: SimHandle) -> _PciInfo:
        return _PciInfo(str(self.field(self._device(h), "pci_bus_id")).encode())

    def nvmlDeviceGetMinorNumber(self, h: SimHandle) -> int:
        return int(self.field(self._device(h, "minor_number"), "minor_number"))

    def nvmlDeviceGetPersistenceMode(self, h: SimHandle) -> int:
        return int(bool(self.field(self._device(h, "persistence_mode"), "persistence_mode")))

    # -- thermals, power, utilisation, memory, clocks --------------------------------
    def nvmlDeviceGetTemperature(self, h: SimHandle, sensor: int) -> int:
        return int(self.field(self._device(h, "temperature"), "temperature"))

    def nvmlDeviceGetMarginTemperature(self, h: SimHandle) -> int:
        return int(self.field(self._device(h, "margin_temperature"), "margin_temperature"))

    def nvmlDeviceGetPowerUsage(self, h: SimHandle) -> int:
        return int(self.field(self._device(h, "power"), "power_usage_w") * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: SimHandle) -> int:
        return int(self.field(self._device(h, "power_limit"), "power_limit_w") * 1000)

    def nvmlDeviceGetTotalEnergyConsumption(self, h: SimHandle) -> int:
        return int(self.field(self._device(h, "energy"), "energy_j") * 1000)

    def nvmlDeviceGetUtilizationRates(self, h: SimHandle) -> Any:
        i = self._device(h, "utilization")
        return pynvml.c_nvmlUtilization_t(
            gpu=int(self.field(i, "utilization_gpu")),
            memory=int(self.field(i, "utilization_memory")),
        )

    def nvmlDeviceGetMemoryInfo(self, h: SimHandle) -> Any:
        i = self._device(h, "memory")
        total = int(self.field(i, "memory_total_mib")) << 20
        used = int(self.field(i, "memory_used_mib")) << 20
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetClockInfo(self, h: SimHandle, kind: int) -> int:
        i = self._device(h, "clocks")
        return int(self.field(i, "sm_clock" if kind == pynvml.NVML_CLOCK_SM else "mem_clock"))

    def nvmlDeviceGetMaxClockInfo(self, h: SimHandle, kind: int) -> int:
        i = self._device(h, "clocks")
        return int(self.field(i, "sm_clock_max" if kind == pynvml.NVML_CLOCK_SM else "mem_clock"))

    # -- PCIe ------------------------------------------------------------------------
    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: SimHandle) -> int:
        return int(self.field(self._device(h, "pcie"), "pcie_gen"))

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: SimHandle) -> int:
        return int(self.field(self._device(h, "pcie"), "pcie_gen_max"))

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: SimHandle) -> int:
        return int(self.field(self._device(h, "pcie"), "pcie_width"))

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: SimHandle) -> int:
        return int(self.field(self._device(h, "pcie"), "pcie_width_max"))

    def nvmlDeviceGetPcieReplayCounter(self, h: SimHandle) -> int:
        return int(self.field(self._device(h, "pcie_replay"), "pcie_replay"))

    # -- memory errors ---------------------------------------------------------------
    def nvmlDeviceGetEccMode(self, h: SimHandle) -> list[int]:
        on = int(bool(self.field(self._device(h, "ecc"), "ecc_enabled")))
        return [on, on]

    def nvmlDeviceGetTotalEccErrors(self, h: SimHandle, kind: int, counter: int) -> int:
        i = self._device(h, "ecc")
        if kind == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            name = "volatile" if counter == pynvml.NVML_VOLATILE_ECC else "aggregate"
            return int(self.field(i, f"ecc_{name}_uncorrectable"))
        if counter == pynvml.NVML_VOLATILE_ECC:
            return int(self.field(i, "ecc_volatile_correctable"))
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlDeviceGetRemappedRows(self, h: SimHandle) -> tuple[int, int, int, int]:
        i = self._device(h, "row_remap")
        return (
            int(self.field(i, "remapped_rows_correctable")),
            int(self.field(i, "remapped_rows_uncorrectable")),
            int(bool(self.field(i, "remap_pending"))),
            int(bool(self.field(i, "remap_failure"))),
        )

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: SimHandle) -> int:
        return int(bool(self.field(self._device(h, "retired_pages"), "retired_pages_pending")))

    # -- NVLink ----------------------------------------------------------------------
    def _link(self, h: SimHandle, link: int, group: str = "nvlink") -> int:
        i = self._device(h, group)
        if not 0 <= link < int(self.field(i, "nvlink_count")):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return i

    def nvmlDeviceGetNvLinkState(self, h: SimHandle, link: int) -> int:
        i = self._link(h, link)
        return int(self.field(i, f"nvlink.{link}.state") == "active")

    def nvmlDeviceGetNvLinkVersion(self, h: SimHandle, link: int) -> int:
        return int(self.field(self._link(h, link), f"nvlink.{link}.version"))

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: SimHandle, link: int) -> _PciInfo:
        i = self._link(h, link)
        return _PciInfo(str(self.field(i, f"nvlink.{link}.remote_pci_bus_id")).encode())

    def nvmlDeviceGetNvLinkErrorCounter(self, h: SimHandle, link: int, counter: int) -> int:
        i = self._link(h, link, "nvlink_errors")
        name = _COUNTER_API.get(counter)
        if name is None or "nvlink_counter_api" in self.field(i, "not_supported"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(self.field(i, f"nvlink.{link}.{name}"))

    def nvmlDeviceGetFieldValues(self, h: SimHandle, field_ids: list[Any]) -> Any:
        """pynvml's shape: an array of ``c_nvmlFieldValue_t``, one ``nvmlReturn`` each.
        Answers the NVLink error counters; every other field is NotSupported."""
        i = self._device(h)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for fv, wanted in zip(values, field_ids, strict=True):
            field_id, scope = wanted if isinstance(wanted, tuple | list) else (wanted, 0)
            fv.fieldId, fv.scopeId = field_id, scope
            path = self._counter_field(i, field_id, scope)
            if path is None:
                fv.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            fv.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            fv.value.ullVal = int(self.field(i, path))
            fv.nvmlReturn = pynvml.NVML_SUCCESS
        return values

    def _counter_field(self, i: int, field_id: int, scope: int) -> str | None:
        if field_id in _SCOPED_FIELDS:
            link, name = scope, _SCOPED_FIELDS[field_id]
        elif field_id in _PER_LINK_FIELDS:
            link, name = _PER_LINK_FIELDS[field_id]
        else:
            return None
        if "nvlink_errors" in self.field(i, "not_supported"):
            return None
        if not 0 <= link < int(self.field(i, "nvlink_count")):
            return None
        return f"nvlink.{link}.{name}"

    # -- processes -----------------------------------------------------------------
    def nvmlDeviceGetComputeRunningProcesses(self, h: SimHandle) -> list[_Process]:
        i = self._device(h, "processes")
        return [
            _Process(int(p.get("pid", 0)), int(p["used_mib"]) << 20 if "used_mib" in p else None)
            for p in self.field(i, "processes")
        ]
