"""A simulated NVML library that stands in for the ``pynvml`` module itself.

``SimulatedNvml(scenario, node)`` has the same function names, arguments and return shapes
as the subset of ``pynvml`` that :class:`slurmhealth.gpu.nvml.NvmlBackend` calls, and raises
pynvml's own exception classes, so ``NvmlBackend(lib=SimulatedNvml(...))`` runs the real
adapter code. Time-varying faults are evaluated against a scenario clock:
``t = now - epoch`` (epoch: config ``gpu.sim_epoch`` or the scenario file's mtime), so every
process on a node sees the same timeline.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

from slurmhealth.gpu.scenario import CLOCK_REASONS, FABRIC_STATES, Fault, NodeScenario, Scenario
from slurmhealth.gpu.sim_device import DeviceQueries, SimHandle, fabric_status_code
from slurmhealth.gpu.sim_lifetime import read_lifetime, record_resets
from slurmhealth.gpu.sim_mig import MigQueries

_CONSTANTS = (
    "NVMLError", "NVML_TEMPERATURE_GPU", "NVML_CLOCK_SM", "NVML_CLOCK_MEM",
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_MEMORY_ERROR_TYPE_CORRECTED",
    "NVML_VOLATILE_ECC", "NVML_AGGREGATE_ECC", "NVML_FEATURE_ENABLED",
    "NVML_NVLINK_MAX_LINKS", "NVML_NVLINK_ERROR_DL_REPLAY", "NVML_NVLINK_ERROR_DL_RECOVERY",
    "NVML_NVLINK_ERROR_DL_CRC_FLIT", "NVML_NVLINK_ERROR_DL_CRC_DATA",
    "NVML_GPU_FABRIC_STATE_COMPLETED", "nvmlEventTypeXidCriticalError",
    "c_nvmlGpuFabricInfo_t", "c_nvmlUtilization_t", "c_nvmlMemory_t",
    "NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_RESET_REQUIRED",
    "NVML_ERROR_INVALID_ARGUMENT", "NVML_ERROR_TIMEOUT", "NVML_ERROR_UNINITIALIZED",
    "NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH", "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_NOT_FOUND",
    "NVML_SUCCESS", "NVML_ERROR_UNKNOWN", "c_nvmlFieldValue_t",
    *(name for name in dir(pynvml) if name.startswith(("NVML_FI_DEV_NVLINK_", "NVML_VALUE_TYPE_"))),
    "c_nvmlGpuFabricInfoV_t", "nvmlGpuFabricInfo_v2", "NVML_DEVICE_MIG_ENABLE",
)  # fmt: skip

DEFAULT_RUN_DIR = "/run/slurmhealth"  # config's paths.run_dir default: root-owned


def default_kernel_log(scenario_name: str, node: str, run_dir: str = DEFAULT_RUN_DIR) -> str:
    """Where a simulated node's kernel log (and its scenario clock) goes unless
    ``gpu.sim_kernel_log`` says: under the run dir, never a shared temp dir, since root
    reads it as the kernel's own log."""
    return os.path.join(run_dir, "sim", f"{scenario_name}-{node}.kmsg")


@dataclass(frozen=True)
class _EventData:
    device: SimHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


class _EventSet:
    """What ``nvmlEventSetCreate`` returns: the GPUs registered, and whether it was freed."""

    def __init__(self) -> None:
        self.handles: list[SimHandle] = []
        self.freed = False


class SimulatedNvml(MigQueries, DeviceQueries):
    """Stand-in for the ``pynvml`` module, for one node of a scenario."""

    def __init__(
        self,
        scenario: Scenario,
        node: str,
        *,
        epoch: float = 0.0,
        kernel_log_path: str = "",
        clock: Callable[[], float] = time.time,
    ) -> None:
        for name in _CONSTANTS:
            setattr(self, name, getattr(pynvml, name))
        self.scenario = scenario
        self.node: NodeScenario = scenario.for_node(node)
        self._clock = clock
        self.kernel_log_path = kernel_log_path or default_kernel_log(scenario.name, node)
        self.epoch = epoch or self._first_use()
        self.lifetime = read_lifetime(self.kernel_log_path)  # resets and reboots so far
        self._release = threading.Event()  # wakes calls hung by a fault when closing
        self._initialized = False
        self._delivered: set[tuple[int, int]] = set()  # (fault, GPU) Xids already delivered
        self.calls = 0
        self.event_sets: list[_EventSet] = []

    def _first_use(self) -> float:
        """The scenario clock starts when this version of the scenario file is first used on
        this node (remembered next to the simulated kernel log), so every process of a node
        shares one timeline and a fault "at = 60" means a minute after the scenario took
        effect, however old the file is."""
        st = os.stat(self.scenario.path)
        key = f"{os.path.realpath(self.scenario.path)}:{st.st_mtime_ns}:{st.st_size}"
        path = self.kernel_log_path + ".epoch.json"
        try:
            with open(path, encoding="utf-8") as fh:
                known = json.load(fh)
        except (OSError, ValueError):
            known = {}
        if not isinstance(known, dict):
            known = {}
        if isinstance(known.get(key), int | float):
            return float(known[key])
        now = self._clock()
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}"
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump({**known, key: now}, fh)
            os.replace(tmp, path)
        except OSError:
            pass  # an unwritable state dir: this process's own timeline
        return now

    # -- scenario clock and fields -------------------------------------------------
    def now(self) -> float:
        """Seconds since the scenario started."""
        return self._clock() - self.epoch

    def active(self, fault: Fault, index: int, t: float) -> bool:
        """Whether ``fault`` shows on GPU ``index`` at scenario time ``t``: inside its
        window, on that GPU, and not cleared by a reset or reboot since it began."""
        if t < fault.at or (fault.until is not None and t >= fault.until):
            return False
        if fault.gpus is not None and index not in fault.gpus:
            return False
        return not self.lifetime.cleared(fault, index, self.epoch + fault.at)

    def field(self, index: int, path: str) -> Any:
        value = self.node.gpus[index][path]
        t = self.now()
        for fault in self.node.faults:
            if not self.active(fault, index, t):
                continue
            if path in fault.set:
                value = fault.set[path]
            if path in fault.rate:
                value = value + fault.rate[path] * (t - fault.at)
        return value

    def _device(self, handle: SimHandle, group: str | None = None) -> int:
        self._require_init()
        self.calls += 1
        i = handle.index
        if self.field(i, "hang"):
            self._release.wait(self.field(i, "hang_s"))
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        if self.field(i, "lost"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if self.field(i, "reset_required"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_RESET_REQUIRED)
        if group is not None and group in self.field(i, "not_supported"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return i

    def _require_init(self) -> None:
        if not self._initialized:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def simulate_reset(self, indices: list[int]) -> tuple[bool, str]:
        """``nvidia-smi --gpu-reset`` on the simulated GPUs: each fault on them with
        ``clears_on = "reset"`` goes; a fault that clears only on a reboot (or never) makes
        the reset fail, as a GPU a reset cannot bring back does. Returns (ok, output)."""
        t = self.now()
        lines, stuck = [], False
        for i in indices:
            bus = str(self.node.gpus[i]["pci_bus_id"])
            held = [f.clears_on for f in self.node.faults
                    if self.active(f, i, t) and f.clears_on in ("reboot", "never")]  # fmt: skip
            if held:
                stuck = True
                lines.append(f"Unable to reset GPU {bus}: the GPU did not come back "
                             f"(simulated: a fault that clears on {held[0]})")  # fmt: skip
            else:
                lines.append(f"GPU {bus} was successfully reset.")
        if not stuck:
            record_resets(self.kernel_log_path, indices, self._clock())
            self.lifetime = read_lifetime(self.kernel_log_path)
        return not stuck, "\n".join(lines)

    # -- library -------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._initialized = True
        self.write_kernel_log()

    def nvmlShutdown(self) -> None:
        self._initialized = False
        self._release.set()

    def nvmlSystemGetDriverVersion(self) -> str:
        self._require_init()
        return self.node.driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._require_init()
        return self.node.nvml_version

    def nvmlDeviceGetCount(self) -> int:
        self._require_init()
        return len(self.node.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimHandle:
        self._require_init()
        if not 0 <= index < len(self.node.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        handle = SimHandle(index)
        self._device(handle)
        return handle

    # -- clocks events and fabric (the tables live in gpu/scenario.py) -------------
    def nvmlDeviceGetCurrentClocksEventReasons(self, h: SimHandle) -> int:
        i = self._device(h, "clock_event_reasons")
        mask = 0
        for reason in self.field(i, "clock_event_reasons"):
            mask |= CLOCK_REASONS[reason]
        return mask

    def nvmlDeviceGetGpuFabricInfo(self, h: SimHandle, ref: Any) -> int:
        i = self._device(h, "fabric")
        state = self.field(i, "fabric_state")
        if state == "not_supported":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = ref._obj  # ctypes.byref(struct)
        info.state = FABRIC_STATES.index(state)
        info.status = fabric_status_code(self.field(i, "fabric_status"))
        return int(pynvml.NVML_SUCCESS)

    # -- events (Xid) ----------------------------------------------------------------
    def nvmlEventSetCreate(self) -> _EventSet:
        self._require_init()
        event_set = _EventSet()
        self.event_sets.append(event_set)
        return event_set

    def _live(self, event_set: _EventSet) -> _EventSet:
        if event_set.freed:  # a use after nvmlEventSetFree: a crash on a real driver
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return event_set

    def nvmlDeviceRegisterEvents(self, h: SimHandle, types: int, event_set: _EventSet) -> None:
        self._device(h)
        self._live(event_set).handles.append(h)

    def nvmlEventSetFree(self, event_set: _EventSet) -> None:
        self._live(event_set).freed = True

    @property
    def open_event_sets(self) -> int:
        """Event sets created and not freed (each one a leak on a real driver)."""
        return sum(not s.freed for s in self.event_sets)

    def nvmlEventSetWait_v2(self, event_set: _EventSet, timeout_ms: int) -> _EventData:
        self._require_init()
        handles = self._live(event_set).handles
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            for n, fault in enumerate(self.node.faults):
                if fault.xid is None or self.now() < fault.at:
                    continue
                for h in handles:
                    if (n, h.index) in self._delivered:
                        continue
                    if fault.gpus is None or h.index in fault.gpus:
                        self._delivered.add((n, h.index))
                        self.write_kernel_log()
                        return _EventData(h, pynvml.nvmlEventTypeXidCriticalError, fault.xid)
            left = deadline - time.monotonic()
            if left <= 0:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
            if self._release.wait(min(left, 0.05)):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    nvmlEventSetWait = nvmlEventSetWait_v2

    # -- kernel log ------------------------------------------------------------------
    def kernel_log_lines(self, boot_time: float) -> list[str]:
        """The kmsg records the scenario's Xid faults have produced by now."""
        from slurmhealth.kernel_log import format_kmsg_record

        lines = []
        for n, fault in enumerate(self.node.faults):
            if fault.xid is None or self.now() < fault.at:
                continue
            usec = max(0, int((self.epoch + fault.at - boot_time) * 1e6))
            for g in fault.gpus if fault.gpus is not None else range(len(self.node.gpus)):
                domain, bus = str(self.node.gpus[g]["pci_bus_id"]).split(":", 1)
                bus = f"{domain[-4:]}:{bus.rsplit('.', 1)[0]}".lower()
                if fault.xid_gpu_instance is not None:  # MIG: the instance the Xid hit
                    bus += f" GPU-I:{fault.xid_gpu_instance:02d}"
                text = (
                    f"NVRM: Xid (PCI:{bus}): {fault.xid}, pid=4242, name=python3, "
                    f"{fault.xid_message or 'simulated fault'}"
                )
                # seq grows with the scenario's epoch: a later scenario's lines in the same
                # append-only file always come after an earlier one's
                seq = int(self.epoch) * 100_000 + n * 64 + g
                lines.append(format_kmsg_record(seq, usec, text))
        return lines

    def write_kernel_log(self) -> None:
        """Append records not yet in the file (append-only, so readers' cursors stay valid)."""
        with open("/proc/uptime", encoding="ascii") as fh:
            boot = time.time() - float(fh.read().split()[0])
        lines = self.kernel_log_lines(boot)
        path = self.kernel_log_path
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a+", encoding="utf-8") as fh:
                fh.seek(0)
                have = {line.split(";", 1)[0].split(",")[1] for line in fh if "," in line}
                new = [ln for ln in lines if ln.split(",")[1] not in have]
                fh.writelines(ln + "\n" for ln in new)
        except OSError:
            pass  # the simulator's kernel log is best effort, like the real one
