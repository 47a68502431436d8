"""What each NVIDIA Xid means and what to do about it (pure data, no I/O).

Names follow NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors). Xids that point at the
node (ECC, NVLink, bus, GSP firmware) take it out of service: ``drain`` or ``reset``.
Xids that point at the application (13, 31, 43, 45, 68) are recorded only. An Xid missing
from the table is a warning to look up, never a reason to drain.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from slurmhealth.model import Action, Severity

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/"


@dataclass(frozen=True)
class XidInfo:
    """One Xid's meaning: catalog name, how bad it is, what to do, and a one-line hint."""

    xid: int
    name: str
    severity: Severity
    action: Action
    hint: str

    @property
    def acts(self) -> bool:
        """True when the Xid takes the node out of service (drain or reset)."""
        return self.action.takes_node_out


_APP_HINT = (
    "application-level error, the GPU is usually fine: check the job "
    "(compute-sanitizer, cuda-gdb); investigate the GPU only if it repeats across jobs"
)
_NVLINK5_HINT = (
    "NVLink5 {part} error: drain, check links (nvidia-smi nvlink -s -e) and the fabric "
    "manager, then reset the GPU (nvidia-smi -r) or reboot; RMA if it recurs"
)


def _row(xid: int, name: str, severity: Severity, action: Action, hint: str) -> XidInfo:
    return XidInfo(xid=xid, name=name, severity=severity, action=action, hint=hint)


_INFO, _WARN, _FAIL, _CRIT = Severity.INFO, Severity.WARN, Severity.FAIL, Severity.CRITICAL
_RECORD, _DRAIN, _RESET = Action.RECORD, Action.DRAIN, Action.RESET

_ROWS: tuple[XidInfo, ...] = (
    # Application-level: recorded, never acted on.
    _row(13, "Graphics Engine Exception", _INFO, _RECORD, _APP_HINT),
    _row(31, "GPU memory page fault", _INFO, _RECORD, _APP_HINT),
    _row(43, "GPU stopped processing", _INFO, _RECORD, _APP_HINT),
    _row(45, "Preemptive cleanup, due to previous errors", _INFO, _RECORD, _APP_HINT),
    _row(68, "NVDEC0 exception (video decoder)", _INFO, _RECORD, _APP_HINT),
    # Known, not acted on by default: worth a look when they repeat.
    _row(
        32,
        "Invalid or corrupted push buffer stream (PBDMA error)",
        _WARN,
        _RECORD,
        "often PCIe signal quality: check PCIe replay counters and lspci -vv link status",
    ),
    _row(
        61,
        "Internal micro-controller breakpoint/warning",
        _WARN,
        _RECORD,
        "usually followed by Xid 62; reset the GPU (nvidia-smi -r) if the GPU misbehaves",
    ),
    _row(
        69,
        "Graphics Engine class error",
        _WARN,
        _RECORD,
        "often an application or driver problem; reset the GPU if it repeats across jobs",
    ),
    # Node-level: drain or reset.
    _row(
        48,
        "Double Bit ECC Error (DBE)",
        _FAIL,
        _DRAIN,
        "uncorrectable ECC error: drain, reset the GPU (nvidia-smi -r) or reboot to clear; "
        "RMA if it recurs",
    ),
    _row(
        62,
        "Internal micro-controller halt",
        _FAIL,
        _DRAIN,
        "drain, reset the GPU (nvidia-smi -r) or reboot the node; contact NVIDIA support "
        "if it recurs",
    ),
    _row(
        64,
        "ECC page retirement or row remapper recording failure",
        _FAIL,
        _DRAIN,
        "a bad row could not be remapped/retired: drain and RMA the GPU "
        "(nvidia-smi -q -d ROW_REMAPPER)",
    ),
    _row(
        74,
        "NVLink Error",
        _FAIL,
        _DRAIN,
        "drain, check nvidia-smi nvlink -s -e on this GPU and its peers, reset the GPU "
        "or reboot; reseat/RMA if it recurs",
    ),
    _row(
        79,
        "GPU has fallen off the bus",
        _CRIT,
        _RESET,
        "reset the GPU (nvidia-smi -r) or reboot the node; check PCIe, power and cooling; "
        "RMA if it recurs",
    ),
    _row(
        92,
        "High single-bit ECC error rate",
        _FAIL,
        _DRAIN,
        "drain and run diagnostics (dcgmi diag -r 3); RMA if the error rate stays high",
    ),
    _row(
        94,
        "Contained ECC error",
        _FAIL,
        _RESET,
        "the affected application was stopped; reset the GPU (nvidia-smi -r) to clear the error",
    ),
    _row(
        95,
        "Uncontained ECC error",
        _CRIT,
        _RESET,
        "every application on the GPU is affected: reset the GPU (nvidia-smi -r) or "
        "reboot the node; RMA if it recurs",
    ),
    _row(
        119,
        "GSP RPC timeout",
        _FAIL,
        _RESET,
        "GPU firmware stopped answering: reset the GPU (nvidia-smi -r) or reboot the node; "
        "update driver/firmware if it recurs",
    ),
    _row(
        120,
        "GSP error",
        _FAIL,
        _RESET,
        "GPU firmware error: reset the GPU (nvidia-smi -r) or reboot the node; "
        "update driver/firmware if it recurs",
    ),
    _row(
        140,
        "Unrecovered ECC error",
        _FAIL,
        _DRAIN,
        "drain, reset the GPU (nvidia-smi -r) or reboot; RMA if it recurs",
    ),
    _row(144, "NVLink SAW error", _FAIL, _DRAIN, _NVLINK5_HINT.format(part="SAW")),
    _row(145, "NVLink RLW error", _FAIL, _DRAIN, _NVLINK5_HINT.format(part="RLW")),
    _row(146, "NVLink TLW error", _FAIL, _DRAIN, _NVLINK5_HINT.format(part="TLW")),
    _row(147, "NVLink TREX error", _FAIL, _DRAIN, _NVLINK5_HINT.format(part="TREX")),
    _row(148, "NVLink NVLPW control error", _FAIL, _DRAIN, _NVLINK5_HINT.format(part="NVLPW")),
    _row(149, "NVLink NETIR error", _FAIL, _DRAIN, _NVLINK5_HINT.format(part="NETIR")),
    _row(150, "NVLink MSE error", _FAIL, _DRAIN, _NVLINK5_HINT.format(part="MSE")),
    _row(
        154,
        "GPU recovery action changed",
        _FAIL,
        _DRAIN,
        "the driver asks for recovery (reset, reboot or drain P2P, see the message): drain "
        "and do what it asks",
    ),
)

XID_TABLE: Mapping[int, XidInfo] = MappingProxyType({r.xid: r for r in _ROWS})
"""Every Xid this package knows, except 63 whose meaning depends on the row-remap state."""

# Xid 63: a row remap (or page retirement) was recorded. Harmless on its own; a pending remap
# only takes effect after a GPU reset, so until then the GPU must not take new jobs.
_XID63_NAME = "ECC page retirement or row remapping recording event"
XID63_PENDING = _row(
    63,
    _XID63_NAME,
    _FAIL,
    _DRAIN,
    "row remap pending: drain and reset the GPU (nvidia-smi -r) to activate it "
    "(nvidia-smi -q -d ROW_REMAPPER)",
)
XID63_DONE = _row(
    63,
    _XID63_NAME,
    _INFO,
    _RECORD,
    "row remap/page retirement recorded, nothing pending: watch the trend "
    "(nvidia-smi -q -d ROW_REMAPPER)",
)
XID63_UNKNOWN = _row(
    63,
    _XID63_NAME,
    _WARN,
    _RECORD,
    "row remap state unknown: check nvidia-smi -q -d ROW_REMAPPER for a pending remap",
)


def classify(xid: int, remap_pending: bool | None = None) -> XidInfo:
    """Return what Xid ``xid`` means and what to do about it.

    ``remap_pending`` is NVML's row-remap "pending" flag for the GPU (``nvidia-smi -q -d
    ROW_REMAPPER``); it only matters for Xid 63. ``None`` means unknown.
    """
    if xid == 63:
        if remap_pending is None:
            return XID63_UNKNOWN
        return XID63_PENDING if remap_pending else XID63_DONE
    known = XID_TABLE.get(xid)
    if known is not None:
        return known
    return XidInfo(
        xid=xid,
        name="unknown Xid",
        severity=Severity.WARN,
        action=Action.RECORD,
        hint=f"look up Xid {xid} in NVIDIA's Xid catalog ({CATALOG_URL})",
    )
