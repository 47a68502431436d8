"""The NVML reads of a GPU's NVLink fabric registration and its MIG devices, for
:class:`slurmhealth.gpu.nvml._Reader` (every call goes through the reader, which gives NVML
errors their meaning: NotSupported or an older library without the function -> unknown).

Fabric: ``nvmlDeviceGetGpuFabricInfoV`` (the versioned struct: state, status, clique id,
cluster UUID, health mask; ``nvidia-smi -q`` "Fabric" section) where the library has it, else
``nvmlDeviceGetGpuFabricInfo`` (state and status only).

MIG: ``nvmlDeviceGetMigMode``, then each MIG device by ``nvmlDeviceGetMigDeviceHandleByIndex``
(``nvidia-smi -L`` lists them as ``MIG 1g.10gb Device N``): its UUID, GPU and compute
instance ids, memory and processes.
"""

from __future__ import annotations

import ctypes
from typing import Any, Protocol

from slurmhealth.model import GpuProcess, MigDevice

FABRIC_STATES = {0: None, 1: "not_started", 2: "in_progress", 3: "completed"}


class Reader(Protocol):
    lib: Any

    def call(self, name: str, *args: Any) -> Any: ...

    def attempt(self, name: str, *args: Any) -> tuple[Any, int | None]: ...


def read_fabric(r: Reader, h: Any) -> dict[str, Any]:
    """The GpuState fabric fields; all None where the GPU has no NVLink fabric."""
    lib = r.lib
    out: dict[str, Any] = {
        "fabric_state": None, "fabric_status": None, "fabric_clique_id": None,
        "fabric_cluster_uuid": None, "fabric_health_mask": None,
    }  # fmt: skip
    struct = getattr(lib, "c_nvmlGpuFabricInfoV_t", None)
    if struct is not None:
        info = struct()
        info.version = int(getattr(lib, "nvmlGpuFabricInfo_v2", 0))
        answer, code = r.attempt("nvmlDeviceGetGpuFabricInfoV", h, ctypes.byref(info))
        if code is None and answer is not None:
            import uuid as uuidlib  # here: 2.5 ms of every hook's start otherwise

            cluster = bytes(info.clusterUuid)
            return (
                out
                | _state(lib, info)
                | {
                    "fabric_clique_id": int(info.cliqueId),
                    "fabric_cluster_uuid": str(uuidlib.UUID(bytes=cluster))
                    if any(cluster)
                    else None,
                    "fabric_health_mask": int(info.healthMask),
                }
            )
        if code != getattr(lib, "NVML_ERROR_FUNCTION_NOT_FOUND", 13):
            return out  # NotSupported (no fabric) or an error the reader noted
    info = lib.c_nvmlGpuFabricInfo_t()
    if r.call("nvmlDeviceGetGpuFabricInfo", h, ctypes.byref(info)) is None:
        return out
    return out | _state(lib, info)


def _state(lib: Any, info: Any) -> dict[str, Any]:
    status = int(info.status)
    return {
        "fabric_state": FABRIC_STATES.get(int(info.state)),
        "fabric_status": "ok" if status == 0 else str(lib.NVMLError(status)),
    }


def read_mig(r: Reader, h: Any) -> dict[str, Any]:
    """``mig_mode`` (None: not supported) and, in MIG mode, ``mig_devices``."""
    mode = r.call("nvmlDeviceGetMigMode", h)
    if mode is None:
        return {"mig_mode": None, "mig_devices": None}
    if int(mode[0]) != int(getattr(r.lib, "NVML_DEVICE_MIG_ENABLE", 1)):
        return {"mig_mode": False, "mig_devices": None}
    devices = []
    for index in range(int(r.call("nvmlDeviceGetMaxMigDeviceCount", h) or 0)):
        mh = r.call("nvmlDeviceGetMigDeviceHandleByIndex", h, index)
        if mh is None:  # NotFound: no MIG device in this slot
            continue
        devices.append(_mig_device(r, index, mh))
    return {"mig_mode": True, "mig_devices": tuple(devices)}


def _mig_device(r: Reader, index: int, mh: Any) -> MigDevice:
    c = r.call
    uuid, name = c("nvmlDeviceGetUUID", mh), c("nvmlDeviceGetName", mh)
    mem = c("nvmlDeviceGetMemoryInfo", mh)
    procs = c("nvmlDeviceGetComputeRunningProcesses", mh)
    return MigDevice(
        index=index,
        uuid=None if uuid is None else _text(uuid),
        gpu_instance_id=c("nvmlDeviceGetGpuInstanceId", mh),
        compute_instance_id=c("nvmlDeviceGetComputeInstanceId", mh),
        name=None if name is None else _text(name),
        memory_total_bytes=None if mem is None else int(mem.total),
        memory_used_bytes=None if mem is None else int(mem.used),
        processes=None
        if procs is None
        else tuple(
            GpuProcess(int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
            for p in procs
        ),
    )


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
