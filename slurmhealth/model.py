"""Plain, frozen data shared by every layer.

Nothing here talks to the outside world. Units are in the field names or docstrings;
``None`` always means "unknown / not supported", never zero.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

CLOCK_EVENT_REASONS: Mapping[str, int] = MappingProxyType(
    {
        "gpu_idle": 0x1,
        "applications_clocks": 0x2,
        "sw_power_cap": 0x4,
        "hw_slowdown": 0x8,
        "sync_boost": 0x10,
        "sw_thermal": 0x20,
        "hw_thermal": 0x40,
        "hw_power_brake": 0x80,
    }
)
"""nvmlClocksEventReason* bits by name: ``GpuState.clock_event_reasons`` is their OR
(nvidia-smi -q -d PERFORMANCE "Clocks Event Reasons", DCGM_FI_DEV_CLOCK_THROTTLE_REASONS)."""


FABRIC_HEALTH_FIELDS: Mapping[str, tuple[int, int, Mapping[int, str]]] = MappingProxyType(
    {  # name: (shift, width mask, {value: meaning}); value 0 is "not supported" in every one
        "degraded_bw": (0, 0x3, {1: "degraded", 2: "full"}),
        "route_recovery": (2, 0x3, {1: "in_progress", 2: "none"}),
        "route_unhealthy": (4, 0x3, {1: "unhealthy", 2: "healthy"}),
        "access_timeout_recovery": (6, 0x3, {1: "in_progress", 2: "none"}),
        "incorrect_configuration": (8, 0xF, {
            1: "none", 2: "incorrect_sysguid", 3: "incorrect_chassis_sn", 4: "no_partition",
            5: "insufficient_nvlinks", 6: "incompatible_gpu_fw", 7: "invalid_location",
            8: "gpu_state_invalid",
        }),
        "partition_assigned": (12, 0x3, {1: "assigned", 2: "unassigned"}),
        "gfm_state": (14, 0x3, {1: "connected", 2: "disconnected"}),
    }
)  # fmt: skip
"""The fields of ``nvmlGpuFabricInfo_v2_t.healthMask`` (NVML_GPU_FABRIC_HEALTH_MASK_*:
shift, width, values), as ``nvidia-smi -q`` prints them under "Fabric > Health"."""


def fabric_health(mask: int) -> dict[str, str]:
    """Each health field's meaning in a fabric health mask; fields not supported left out."""
    out = {}
    for name, (shift, width, values) in FABRIC_HEALTH_FIELDS.items():
        value = (mask >> shift) & width
        if value:
            out[name] = values.get(value, f"unknown({value})")
    return out


def clock_event_names(mask: int) -> list[str]:
    """The names of the reasons set in a clock-event bitmask, in bit order."""
    return [name for name, bit in CLOCK_EVENT_REASONS.items() if mask & bit]


class Severity(enum.IntEnum):
    """How bad a finding is. Ordered by value: ``max()`` of findings is the run's verdict."""

    OK = 0
    INFO = 10
    WARN = 20
    FAIL = 30
    CRITICAL = 40

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r}") from None


class Action(enum.StrEnum):
    """What an operator (or the prolog) should do about a finding.

    ``reset`` needs a GPU reset or a reboot, so like ``drain`` it keeps jobs off the node.
    """

    RECORD = "record"
    WARN = "warn"
    DRAIN = "drain"
    RESET = "reset"

    @property
    def takes_node_out(self) -> bool:
        return self in (Action.DRAIN, Action.RESET)


class GpuStatus(enum.StrEnum):
    OK = "ok"
    LOST = "lost"  # NVML_ERROR_GPU_IS_LOST: fell off the bus
    RESET_REQUIRED = "reset_required"
    UNRESPONSIVE = "unresponsive"  # a read missed the snapshot deadline
    ERROR = "error"  # any other failure to read the device


@dataclass(frozen=True)
class Finding:
    """One thing a check noticed. ``evidence`` holds the values that prove it."""

    check: str
    severity: Severity
    message: str
    action: Action
    hint: str = ""
    gpu: int | None = None
    uuid: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)

    @property
    def failing(self) -> bool:
        return self.severity >= Severity.FAIL

    def sort_key(self) -> tuple[int, int, str, str]:
        return (-int(self.severity), -1 if self.gpu is None else self.gpu, self.check, self.message)

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "severity": self.severity.label,
            "gpu": self.gpu,
            "uuid": self.uuid,
            "message": self.message,
            "action": self.action.value,
            "hint": self.hint,
            "evidence": dict(self.evidence),
        }


@dataclass(frozen=True)
class NvLink:
    """One NVLink of a GPU (``nvidia-smi nvlink -s`` / ``-e``). Counters are cumulative."""

    link: int
    active: bool | None
    remote_pci_bus_id: str | None = None
    version: int | None = None
    replay_errors: int | None = None
    recovery_errors: int | None = None
    crc_flit_errors: int | None = None
    crc_data_errors: int | None = None


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_memory_bytes: int | None
    name: str | None = None


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a compute instance of a GPU instance) of a GPU in MIG mode
    (``nvidia-smi -L`` lists it as ``MIG 1g.10gb Device 0: (UUID: MIG-...)``). Memory in
    bytes; ``processes`` run on this instance only."""

    index: int  # nvmlDeviceGetMigDeviceHandleByIndex's index on the parent GPU
    uuid: str | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    name: str | None = None  # e.g. "NVIDIA H100 80GB HBM3 MIG 1g.10gb"
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    processes: tuple[GpuProcess, ...] | None = None


@dataclass(frozen=True)
class GpuState:
    """Everything read from one GPU in one pass (``nvidia-smi -q -i N``).

    Temperatures in degrees C, power in W, energy in J, memory in bytes, clocks in MHz,
    utilisation in percent (0-100) as NVML reports it.
    """

    index: int
    status: GpuStatus = GpuStatus.OK
    error: str | None = None
    uuid: str | None = None
    name: str | None = None
    pci_bus_id: str | None = None
    serial: str | None = None
    minor_number: int | None = None  # N of /dev/nvidiaN, what gres.conf File= names
    persistence_mode: bool | None = None
    temperature_c: int | None = None
    margin_temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_j: float | None = None
    utilization_gpu_pct: int | None = None
    utilization_memory_pct: int | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    mem_clock_mhz: int | None = None
    clock_event_reasons: int | None = None
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    pcie_replay_errors: int | None = None
    ecc_enabled: bool | None = None
    ecc_volatile_uncorrectable: int | None = None
    ecc_volatile_correctable: int | None = None
    ecc_aggregate_uncorrectable: int | None = None
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remap_pending: bool | None = None
    remap_failure: bool | None = None
    retired_pages_pending: bool | None = None
    nvlinks: tuple[NvLink, ...] | None = None
    fabric_state: str | None = None  # not_started | in_progress | completed
    fabric_status: str | None = None  # "ok" or NVML's error text for the fabric
    processes: tuple[GpuProcess, ...] | None = None
    # nvmlDeviceGetGpuFabricInfoV (multi-node NVLink, GB200 NVL72): None where not supported
    fabric_clique_id: int | None = None
    fabric_cluster_uuid: str | None = None
    fabric_health_mask: int | None = None  # NVML_GPU_FABRIC_HEALTH_MASK_* fields
    mig_mode: bool | None = None  # nvmlDeviceGetMigMode's current mode
    mig_devices: tuple[MigDevice, ...] | None = None  # in MIG mode: its instances

    @property
    def readable(self) -> bool:
        return self.status is GpuStatus.OK


@dataclass(frozen=True)
class ImexState:
    """The node's IMEX service for multi-node NVLink (``slurmhealth.gpu.imex``)."""

    daemon_running: bool | None  # None: /proc could not be read
    channels: tuple[str, ...]  # character devices channelN in channel_dir
    channel_dir: str = "/dev/nvidia-caps-imex-channels"


@dataclass(frozen=True)
class NodeSnapshot:
    """One node's GPUs at one moment. ``ts`` is UTC seconds since the epoch."""

    node: str
    ts: float
    gpus: tuple[GpuState, ...]
    device_count: int | None = None  # what the driver enumerates, all GPUs of the node
    driver_version: str | None = None
    nvml_version: str | None = None
    duration_s: float = 0.0
    error: str | None = None  # node-level read failure (NVML did not start or answer)

    def gpu(self, index: int) -> GpuState | None:
        for g in self.gpus:
            if g.index == index:
                return g
        return None


@dataclass(frozen=True)
class XidEvent:
    """One ``NVRM: Xid`` kernel-log line.

    ``pci_bus_id`` is normalised (see :func:`slurmhealth.model.normalize_pci_bus_id`);
    ``ts`` is UTC seconds when known.
    """

    xid: int
    pci_bus_id: str
    message: str
    raw: str
    ts: float | None = None
    pid: int | None = None
    process_name: str | None = None
    gpu_instance: str | None = None  # MIG "GPU-I:05"
    seq: int | None = None
    # The driver's own verdict, when the line carries one (newer drivers):
    contained: bool | None = None  # "Contained: ..." True, "Uncontained: ..." False
    reset_required: bool | None = None  # "RST: Yes/No"
    drain_reset_required: bool | None = None  # "D-RST: Yes/No"
    recovery_action: int | None = None  # Xid 154 "... to 0x2 (Node Reboot Required)"
    caused_by: int | None = None  # Xid 45 "... caused by previous Xid 149"


KERNEL_EVENT_KINDS = ("fallen_off_bus", "gsp_timeout", "init_failed", "sxid", "pcie_aer")
"""The kinds of :class:`slurmhealth.model_records.KernelEvent` (GPU faults without an Xid)."""

MAX_GPU_INDEX = 1023
"""The highest GPU index a list may name (1024 GPUs per node): ``0-99999999999`` is a typo,
refused in one line rather than built."""


def parse_gpu_list(text: str, source: str = "SLURM_JOB_GPUS") -> tuple[int, ...]:
    """GPU indices written the way Slurm writes ``SLURM_JOB_GPUS``: ``0,1,3`` or ranges
    ``0-3`` (some versions), sorted without repeats; empty text is no GPU.

    ``source`` names where the text came from in the error (an option, a variable). Raises
    ``UsageError`` for text that is not such a list or names an index above
    :data:`MAX_GPU_INDEX`.
    """
    from slurmhealth.errors import UsageError

    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        shown = repr(part if len(part) <= 40 else part[:37] + "...")
        lo, dash, hi = part.partition("-")
        if not _is_index(lo) or (dash and not _is_index(hi)):
            raise UsageError(f"{source}: {shown} is not a GPU index or range (e.g. 0,3 or 0-7)")
        first, last = _index(lo), _index(hi or lo)
        if last > MAX_GPU_INDEX:
            raise UsageError(f"{source}: {shown} names a GPU above {MAX_GPU_INDEX}")
        if last < first:
            raise UsageError(f"{source}: range {shown} goes backwards")
        out.update(range(first, last + 1))
    return tuple(sorted(out))


def _is_index(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _index(digits: str) -> int:
    """The value of ASCII digits, any length (past 4 digits: above every GPU index)."""
    significant = digits.lstrip("0")
    return int(significant or "0") if len(significant) <= 4 else MAX_GPU_INDEX + 1


def normalize_pci_bus_id(text: str) -> str:
    """Return ``dddd:bb:dd.f`` in lower case for any spelling NVML or the kernel log uses.

    NVML: ``00000000:53:00.0``; kernel log: ``0000:53:00`` or ``PCI:0000:53:00``.
    Raises ``ValueError`` for text that is not a PCI address.
    """
    t = text.strip().lower()
    if t.startswith("pci:"):
        t = t[4:]
    func = "0"
    if "." in t:
        t, func = t.rsplit(".", 1)
    parts = t.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3 or not func.isdigit():
        raise ValueError(f"not a PCI bus id: {text!r}")
    domain, bus, dev = parts
    try:
        d, b, v, f = int(domain, 16), int(bus, 16), int(dev, 16), int(func, 16)
    except ValueError:
        raise ValueError(f"not a PCI bus id: {text!r}") from None
    if d > 0xFFFF or b > 0xFF or v > 0x1F or f > 7:
        raise ValueError(f"not a PCI bus id: {text!r}")
    return f"{d:04x}:{b:02x}:{v:02x}.{f}"
