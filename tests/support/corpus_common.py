"""Building blocks of the detection-quality corpus: scenario tables, bus ids, kernel lines.

Kernel-log texts follow the drivers' documented formats and public examples: Xid lines
``NVRM: Xid (PCI:0000:5d:00): 79, pid=..., name=..., <message>`` (older drivers without
pid/name, MIG with ``GPU-I:``), the nvidia driver's multi-line "fallen off the bus" message,
GSP heartbeat lines, NVSwitch SXid lines with their "Severity" and "Data" follow-ups, and
Linux's PCIe AER reports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

from tests.support.detection import gpu_buses

PRESETS = ("h100-sxm", "a100-sxm4", "v100-sxm2")
MODERN = ("h100-sxm", "a100-sxm4")  # row remapping, GSP, contained errors, NVSwitch
DURING = 1200.0  # a fault that appears during the job: the epilog must catch it
# NVML calls each preset's GPUs do not support (a scenario's own list replaces it)
PRESET_UNSUPPORTED = {
    "h100-sxm": [],
    "a100-sxm4": [],
    "v100-sxm2": ["row_remap", "margin_temperature", "fabric"],
}
# NVSwitch PCI addresses (DGX H100: 4 switches, DGX A100: 6); V100 SXM2 has none
SWITCHES = {
    "h100-sxm": ["0000:05:00.0", "0000:06:00.0", "0000:07:00.0", "0000:08:00.0"],
    "a100-sxm4": [f"0000:{0xC4 + s:02x}:00.0" for s in range(6)],
}
NVLINKS = {"h100-sxm": 18, "a100-sxm4": 12, "v100-sxm2": 6}


@cache
def buses(preset: str) -> tuple[str, ...]:
    """The normalized PCI bus id of each GPU of an 8-GPU node of ``preset``."""
    return tuple(gpu_buses({"preset": preset}))


def blame(preset: str, *gpus: int) -> tuple[str, ...]:
    return tuple(buses(preset)[g] for g in gpus)


def kbus(preset: str, gpu: int) -> str:
    """The GPU's bus as Xid lines write it: ``0000:5d:00`` (domain, bus, device)."""
    return buses(preset)[gpu].rsplit(".", 1)[0]


def scenario(
    preset: str,
    *,
    gpu: Mapping[int, Mapping[str, Any]] | None = None,
    all_gpus: Mapping[str, Any] | None = None,
    faults: Sequence[Mapping[str, Any]] = (),
    **top: Any,
) -> dict[str, Any]:
    """A scenario table: ``preset`` with per-GPU and all-GPU overrides and faults."""
    data: dict[str, Any] = {"preset": preset, **top}
    if all_gpus:
        data["all_gpus"] = dict(all_gpus)
    if gpu:
        data["gpu"] = {str(i): dict(v) for i, v in gpu.items()}
    if faults:
        data["faults"] = [dict(f) for f in faults]
    return data


def unsupported(preset: str, *more: str) -> list[str]:
    """The preset's unsupported NVML groups plus ``more``."""
    return [*PRESET_UNSUPPORTED[preset], *more]


def field_values(preset: str) -> dict[str, Any]:
    """H100 drivers answer the NVLink error counters through field values only."""
    return {"not_supported": unsupported(preset, "nvlink_counter_api")}


def fault(
    at: float,
    gpus: int | Sequence[int] | None = None,
    *,
    until: float | None = None,
    xid: int | None = None,
    msg: str = "",
    **set_: Any,
) -> dict[str, Any]:
    """A ``[[faults]]`` entry that sets fields from ``at`` (dotted names as keyword
    arguments with ``__`` for ``.``), and/or delivers Xid ``xid`` with message ``msg``."""
    out: dict[str, Any] = {"at": at}
    if gpus is not None:
        out["gpu"] = list(gpus) if not isinstance(gpus, int) else gpus
    if until is not None:
        out["until"] = until
    if set_:
        out["set"] = {k.replace("__", "."): v for k, v in set_.items()}
    if xid is not None:
        out["xid"] = xid
        out["xid_message"] = msg
    return out


def rate(at: float, gpus: int | Sequence[int], **per_s: float) -> dict[str, Any]:
    """A fault whose counters grow by ``per_s`` per second from ``at``."""
    out: dict[str, Any] = {"at": at, "gpu": gpus if isinstance(gpus, int) else list(gpus)}
    out["rate"] = {k.replace("__", "."): v for k, v in per_s.items()}
    return out


def xid_line(preset: str, gpu: int, xid: int, msg: str, *, pid: bool = True) -> str:
    """An Xid line as the driver writes it; ``pid=False``: an older driver's, without
    pid and name."""
    who = "pid='<unknown>', name=<unknown>, " if pid else ""
    return f"NVRM: Xid (PCI:{kbus(preset, gpu)}): {xid}, {who}{msg}"


def fallen_off(preset: str, gpu: int, style: str = "record") -> list[str]:
    """The driver's "fallen off the bus" message without an Xid: ``record`` one kmsg
    record with newlines (as the driver prints it), ``lines`` one record per line (a
    journal or syslog that splits it), ``old`` the two-line form of older drivers."""
    b, dev = buses(preset)[gpu], {"h100-sxm": "2330", "a100-sxm4": "20b2", "v100-sxm2": "1db5"}
    head = f"NVRM: The NVIDIA GPU {b}"
    pci = f"(PCI ID: 10de:{dev[preset]})"
    if style == "old":
        return [
            f"{head} {pci} installed in this\n"
            "NVRM: system has fallen off the bus and is not responding to commands."
        ]
    lines = [
        head,
        f"NVRM: {pci} installed in this system has",
        "NVRM: fallen off the bus and is not responding to commands.",
    ]
    return ["\n".join(lines)] if style == "record" else lines


def sxid(switch: str, n: int, code: int, level: str, what: str, link: int) -> list[str]:
    """An NVSwitch SXid report: the error line, then its "Severity" and "Data" lines."""
    dev = f"nvidia-nvswitch{n}: SXid (PCI:{switch}): {code}"
    return [
        f"{dev}, {level}, Link {link:02d} {what}",
        f"{dev}, Severity {1 if level == 'Non-fatal' else 5} Engine instance {link:02d} "
        "Sub-engine instance 00",
        f"{dev}, Data {{0x10000000, 0x10000000, 0x00000000, 0x10000000, 0x00000000, "
        "0x00000000, 0x00000000, 0x00000000, 0x00000000}",
    ]


def aer(preset: str, gpu: int, severity: str, kind: str = "Transaction Layer") -> list[str]:
    """Linux's AER report of an error on the GPU's link, from the root/switch port."""
    b = buses(preset)[gpu]
    port = f"{b[:5]}{int(b[5:7], 16) - 1:02x}:00.0"
    return [
        f"pcieport {port}: AER: {severity} error received: {b}",
        f"nvidia {b}: PCIe Bus Error: severity={severity}, type={kind}, (Receiver ID)",
        f"nvidia {b}:   device [10de:2330] error status/mask=00000001/0000e000",
    ]
