"""The NVML adapter: the one place where NVML calls are made and NVML errors get meaning.

``NvmlBackend(lib)`` takes the NVML module as a parameter: the real ``pynvml`` (from the
nvidia-ml-py package) on a GPU node, :class:`slurmhealth.gpu.sim.SimulatedNvml` in tests.

Error meaning (decided here, nowhere else):
- NotSupported, FunctionNotFound, NoPermission on an optional field -> ``None`` (unknown).
- GpuIsLost -> GPU status ``lost``; ResetRequired -> ``reset_required``. Decided once per GPU.
- LibraryNotFound / DriverNotLoaded at init -> :class:`GpuBackendError` with a hint.
- A GPU whose reads do not finish within the deadline -> status ``unresponsive``, naming the
  call it was stuck in. Reads run in daemon threads, so a hung call cannot hang the process.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from slurmhealth.errors import GpuBackendError
from slurmhealth.gpu.nvlink_counters import LINK_COUNTERS, read_link_errors
from slurmhealth.gpu.nvml_fabric_mig import read_fabric, read_mig
from slurmhealth.model import (
    GpuProcess,
    GpuState,
    GpuStatus,
    NodeSnapshot,
    NvLink,
    XidEvent,
    normalize_pci_bus_id,
)

_UNKNOWN_CODES = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_FUNCTION_NOT_FOUND",
                  "NVML_ERROR_NO_PERMISSION", "NVML_ERROR_INVALID_ARGUMENT",
                  "NVML_ERROR_NOT_FOUND")  # fmt: skip
_INIT_HINTS = {
    "NVML_ERROR_LIBRARY_NOT_FOUND": "libnvidia-ml.so.1 not found: is the NVIDIA driver "
    "installed? (set SLURMHEALTH_GPU_BACKEND=sim to use the simulator)",
    "NVML_ERROR_DRIVER_NOT_LOADED": "the nvidia kernel module is not loaded: check "
    "`lsmod | grep nvidia` and `dmesg | grep NVRM`",
    "NVML_ERROR_NO_PERMISSION": "no permission to open /dev/nvidia*: run as root",
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": "NVML and the kernel module differ: "
    "the driver was upgraded without a reboot",
}


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class _GpuGone(Exception):
    def __init__(self, status: GpuStatus, error: str) -> None:
        self.status = status
        self.error = error


class _Reader:
    """Reads one GPU. ``current`` names the NVML call in flight (for a hang's evidence)."""

    def __init__(self, lib: Any, index: int) -> None:
        self.lib = lib
        self.index = index
        self.current = "nvmlDeviceGetHandleByIndex"
        self.since = time.monotonic()  # when the call in flight started
        self.result: GpuState | None = None
        self.unknown = {getattr(lib, name) for name in _UNKNOWN_CODES if hasattr(lib, name)} or {3}
        self._lost = getattr(lib, "NVML_ERROR_GPU_IS_LOST", 15)
        self._reset = getattr(lib, "NVML_ERROR_RESET_REQUIRED", 16)
        self.errors: list[str] = []

    def call(self, name: str, *args: Any) -> Any:
        """Call ``lib.<name>``; unknown -> None; lost/reset -> :class:`_GpuGone`."""
        return self.attempt(name, *args)[0]

    def attempt(self, name: str, *args: Any) -> tuple[Any, int | None]:
        """``(answer, None)``, or ``(None, error code)`` once :meth:`judge` has judged it."""
        self.current, self.since = name, time.monotonic()
        fn = getattr(self.lib, name, None)
        if fn is None:  # an older pynvml without this function: unknown
            return None, getattr(self.lib, "NVML_ERROR_FUNCTION_NOT_FOUND", 13)
        try:
            return fn(*args), None
        except self.lib.NVMLError as exc:
            code = getattr(exc, "value", None)
            self.judge(name, code, str(exc))
            return None, code

    def judge(self, name: str, code: int | None, text: str) -> None:
        """Give an NVML error code its meaning: unknown is silent, lost/reset end the read of
        this GPU, anything else is noted on the GPU. Also used for the per-field return codes
        of ``nvmlDeviceGetFieldValues``."""
        if code == self._lost:
            raise _GpuGone(GpuStatus.LOST, f"{name}: GPU is lost")
        if code == self._reset:
            raise _GpuGone(GpuStatus.RESET_REQUIRED, f"{name}: GPU requires reset")
        if code not in self.unknown:
            self.errors.append(f"{name}: {text}")

    def run(self) -> None:
        try:
            self.result = self._read()
        except _GpuGone as gone:
            self.result = GpuState(index=self.index, status=gone.status, error=gone.error)
        except Exception as exc:  # a bug or an odd library: never kill the snapshot
            self.result = GpuState(
                index=self.index, status=GpuStatus.ERROR, error=f"{type(exc).__name__}: {exc}"
            )

    def _read(self) -> GpuState:
        h = self.call("nvmlDeviceGetHandleByIndex", self.index)
        if h is None:
            return GpuState(self.index, GpuStatus.ERROR, error="; ".join(self.errors) or None)
        fields = self._identity(h) | self._load(h) | self._links_and_clocks(h)
        fields |= self._memory_errors(h) | read_fabric(self, h) | read_mig(self, h)
        procs = self.call("nvmlDeviceGetComputeRunningProcesses", h)
        return GpuState(
            index=self.index,
            **fields,
            nvlinks=self._nvlinks(h),
            processes=None
            if procs is None
            else tuple(GpuProcess(int(p.pid), _opt_int(p.usedGpuMemory)) for p in procs),
            error="; ".join(self.errors) or None,
        )

    def _identity(self, h: Any) -> dict[str, Any]:
        c = self.call
        pci = c("nvmlDeviceGetPciInfo", h)
        persistence = c("nvmlDeviceGetPersistenceMode", h)
        return {
            "uuid": _opt_text(c("nvmlDeviceGetUUID", h)),
            "name": _opt_text(c("nvmlDeviceGetName", h)),
            "pci_bus_id": None if pci is None else _text(pci.busId),
            "serial": _opt_text(c("nvmlDeviceGetSerial", h)),
            "minor_number": c("nvmlDeviceGetMinorNumber", h),
            "persistence_mode": None if persistence is None else persistence == 1,
        }

    def _load(self, h: Any) -> dict[str, Any]:
        """Temperatures, power (mW -> W), energy (mJ -> J), utilisation, memory."""
        lib, c = self.lib, self.call
        util = c("nvmlDeviceGetUtilizationRates", h)
        mem = c("nvmlDeviceGetMemoryInfo", h)
        power = c("nvmlDeviceGetPowerUsage", h)
        limit = c("nvmlDeviceGetEnforcedPowerLimit", h)
        energy = c("nvmlDeviceGetTotalEnergyConsumption", h)
        return {
            "temperature_c": c("nvmlDeviceGetTemperature", h, lib.NVML_TEMPERATURE_GPU),
            "margin_temperature_c": c("nvmlDeviceGetMarginTemperature", h),
            "power_w": None if power is None else power / 1000.0,
            "power_limit_w": None if limit is None else limit / 1000.0,
            "energy_j": None if energy is None else energy / 1000.0,
            "utilization_gpu_pct": None if util is None else int(util.gpu),
            "utilization_memory_pct": None if util is None else int(util.memory),
            "memory_total_bytes": None if mem is None else int(mem.total),
            "memory_used_bytes": None if mem is None else int(mem.used),
        }

    def _links_and_clocks(self, h: Any) -> dict[str, Any]:
        """Clocks and their event reasons; PCIe generation, width and replays."""
        lib, c = self.lib, self.call
        return {
            "sm_clock_mhz": c("nvmlDeviceGetClockInfo", h, lib.NVML_CLOCK_SM),
            "sm_clock_max_mhz": c("nvmlDeviceGetMaxClockInfo", h, lib.NVML_CLOCK_SM),
            "mem_clock_mhz": c("nvmlDeviceGetClockInfo", h, lib.NVML_CLOCK_MEM),
            "clock_event_reasons": self._clock_reasons(h),
            "pcie_gen": c("nvmlDeviceGetCurrPcieLinkGeneration", h),
            "pcie_gen_max": c("nvmlDeviceGetMaxPcieLinkGeneration", h),
            "pcie_width": c("nvmlDeviceGetCurrPcieLinkWidth", h),
            "pcie_width_max": c("nvmlDeviceGetMaxPcieLinkWidth", h),
            "pcie_replay_errors": c("nvmlDeviceGetPcieReplayCounter", h),
        }

    def _memory_errors(self, h: Any) -> dict[str, Any]:
        """ECC mode and counts; remapped rows, or retired pages on GPUs without remapping."""
        lib, c = self.lib, self.call
        ecc = c("nvmlDeviceGetEccMode", h)
        rows = c("nvmlDeviceGetRemappedRows", h)
        retired = None if rows is not None else c("nvmlDeviceGetRetiredPagesPendingStatus", h)
        unc, cor = lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, lib.NVML_MEMORY_ERROR_TYPE_CORRECTED
        volatile, aggregate = lib.NVML_VOLATILE_ECC, lib.NVML_AGGREGATE_ECC
        return {
            "ecc_enabled": None if ecc is None else ecc[0] == lib.NVML_FEATURE_ENABLED,
            "ecc_volatile_uncorrectable": c("nvmlDeviceGetTotalEccErrors", h, unc, volatile),
            "ecc_volatile_correctable": c("nvmlDeviceGetTotalEccErrors", h, cor, volatile),
            "ecc_aggregate_uncorrectable": c("nvmlDeviceGetTotalEccErrors", h, unc, aggregate),
            "remapped_rows_correctable": None if rows is None else int(rows[0]),
            "remapped_rows_uncorrectable": None if rows is None else int(rows[1]),
            "remap_pending": None if rows is None else bool(rows[2]),
            "remap_failure": None if rows is None else bool(rows[3]),
            "retired_pages_pending": None if retired is None else bool(retired),
        }

    def _clock_reasons(self, h: Any) -> int | None:
        if hasattr(self.lib, "nvmlDeviceGetCurrentClocksEventReasons"):
            value = self.call("nvmlDeviceGetCurrentClocksEventReasons", h)
        else:  # drivers before 535 call them throttle reasons
            value = self.call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return None if value is None else int(value)

    def _nvlinks(self, h: Any) -> tuple[NvLink, ...] | None:
        c = self.call
        states = {}
        for link in range(int(getattr(self.lib, "NVML_NVLINK_MAX_LINKS", 18))):
            state = c("nvmlDeviceGetNvLinkState", h, link)
            if state is not None:  # None: the device has no such link
                states[link] = state
        errors = read_link_errors(self, h, list(states))
        links = []
        for link, state in states.items():
            remote = c("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
            links.append(
                NvLink(
                    link=link,
                    active=state == 1,
                    remote_pci_bus_id=None if remote is None else _text(remote.busId),
                    version=c("nvmlDeviceGetNvLinkVersion", h, link),
                    **{name: errors.get((link, name)) for name in LINK_COUNTERS},
                )
            )
        return tuple(links) if links else None


def _opt_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


class NvmlBackend:
    """GPU backend over an NVML module (``pynvml`` or :class:`SimulatedNvml`)."""

    def __init__(
        self,
        lib: Any,
        *,
        node: str,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.lib = lib
        self.node = node
        self.timeout_s = timeout_s
        self._clock = clock
        self._started = False
        self._event_set: Any = None
        self._event_lock = threading.Lock()  # a wait and the free never overlap

    @property
    def kernel_log_hint(self) -> str | None:
        """Where this backend's Xids are logged when it is not the system's kernel log."""
        return getattr(self.lib, "kernel_log_path", None)

    def _start(self) -> None:
        if self._started:
            return
        try:
            self.lib.nvmlInit()
        except self.lib.NVMLError as exc:
            code = getattr(exc, "value", None)
            hint = next(
                (h for name, h in _INIT_HINTS.items() if getattr(self.lib, name, -1) == code), ""
            )
            raise GpuBackendError(f"NVML did not start: {exc}", hint) from None
        self._started = True

    def close(self) -> None:
        """Free the Xid event set (if one was made) and shut NVML down."""
        if self._started:
            self._started = False
            self._free_event_set()
            with contextlib.suppress(self.lib.NVMLError):
                self.lib.nvmlShutdown()

    def _free_event_set(self) -> None:
        if self._event_set is None:
            return
        # a wait_xid in another thread is given its timeout to end; a set still waited on
        # after that is left to nvmlShutdown rather than freed under the waiting call
        if not self._event_lock.acquire(timeout=self.timeout_s):
            return
        try:
            event_set, self._event_set = self._event_set, None
            with contextlib.suppress(self.lib.NVMLError):
                self.lib.nvmlEventSetFree(event_set)
        finally:
            self._event_lock.release()

    def devices(self) -> list[int]:
        """Indices of the GPUs the driver enumerates (``nvidia-smi -L``)."""
        self._start()
        return list(range(int(self.lib.nvmlDeviceGetCount())))

    def snapshot(self, indices: Sequence[int] | None = None) -> NodeSnapshot:
        """Read the given GPUs (default all) in parallel under one deadline."""
        t0 = time.monotonic()
        ts = self._clock()
        self._start()
        count = int(self.lib.nvmlDeviceGetCount())
        wanted = list(range(count)) if indices is None else [i for i in indices if i < count]
        readers = [_Reader(self.lib, i) for i in wanted]
        threads = [
            threading.Thread(target=r.run, name=f"nvml-gpu{r.index}", daemon=True) for r in readers
        ]
        for t in threads:
            t.start()
        # unresponsive: one NVML call hung for timeout_s; a reader whose calls keep returning
        # (a CPU-starved process, not a hung GPU) may go on to twice the deadline
        for t, r in zip(threads, readers, strict=True):
            while t.is_alive():
                limit = min(max(t0, r.since) + self.timeout_s, t0 + 2 * self.timeout_s)
                if time.monotonic() >= limit:
                    break
                t.join(limit - time.monotonic())
        gpus = []
        for reader in readers:
            if reader.result is None:
                gpus.append(
                    GpuState(
                        index=reader.index,
                        status=GpuStatus.UNRESPONSIVE,
                        error=f"no answer within {self.timeout_s:g} s (stuck in {reader.current})",
                    )
                )
            else:
                gpus.append(reader.result)
        driver = self._system("nvmlSystemGetDriverVersion")
        return NodeSnapshot(
            node=self.node,
            ts=ts,
            gpus=tuple(gpus),
            device_count=count,
            driver_version=driver,
            nvml_version=self._system("nvmlSystemGetNVMLVersion"),
            duration_s=time.monotonic() - t0,
        )

    def _system(self, name: str) -> str | None:
        try:
            return _text(getattr(self.lib, name)())
        except (self.lib.NVMLError, AttributeError):
            return None

    def _register_xid_events(self) -> Any:
        """An event set with every GPU that can report Xids registered (freed by close)."""
        lib = self.lib
        event_set = lib.nvmlEventSetCreate()
        for i in range(int(lib.nvmlDeviceGetCount())):
            try:
                h = lib.nvmlDeviceGetHandleByIndex(i)
                lib.nvmlDeviceRegisterEvents(h, lib.nvmlEventTypeXidCriticalError, event_set)
            except lib.NVMLError:
                continue
        return event_set

    def wait_xid(self, timeout_s: float) -> list[XidEvent]:
        """Xids delivered by NVML's event API within ``timeout_s`` (empty on timeout)."""
        self._start()
        lib = self.lib
        with self._event_lock:
            if self._event_set is None:
                self._event_set = self._register_xid_events()
            try:
                data = lib.nvmlEventSetWait_v2(self._event_set, int(timeout_s * 1000))
            except lib.NVMLError:
                return []
        try:
            bus = normalize_pci_bus_id(_text(lib.nvmlDeviceGetPciInfo(data.device).busId))
        except (lib.NVMLError, ValueError):
            bus = "unknown"
        xid = int(data.eventData)
        return [
            XidEvent(
                xid=xid,
                pci_bus_id=bus,
                message="reported by NVML event API",
                raw=f"nvmlEventTypeXidCriticalError xid={xid}",
                ts=self._clock(),
            )
        ]
