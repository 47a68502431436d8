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
        name = {
            pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay",
            pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
            pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
            pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data",
        }.get(counter)
        if name is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return int(self.field(i, f"nvlink.{link}.{name}"))

    # -- processes -----------------------------------------------------------------
    def nvmlDeviceGetComputeRunningProcesses(self, h: SimHandle) -> list[_Process]:
        i = self._device(h, "processes")
        return [
            _Process(int(p.get("pid", 0)), int(p["used_mib"]) << 20 if "used_mib" in p else None)
            for p in self.field(i, "processes")
        ]
