"""GPU faults in the kernel log that come without an ``NVRM: Xid`` line.

- ``fallen_off_bus``: ``NVRM: GPU 0000:b3:00.0: GPU has fallen off the bus.`` and the
  three-line ``NVRM: The NVIDIA GPU 0000:b3:00.0`` / ``NVRM: (PCI ID: 10de:2330) installed
  in this system has`` / ``NVRM: fallen off the bus and is not responding to commands.``
  (one record with newlines, or one record per line);
- ``gsp_timeout``: GSP firmware heartbeat and RPC timeouts (``_kgspIsHeartbeatTimedOut``,
  ``*** GSP Timeout ***``, ``GPU0 GSP RPC buffer contains function 76 ...``);
- ``init_failed``: ``RmInitAdapter failed``, ``rm_init_adapter failed``, the nvidia driver's
  failed PCI probe, ``None of the NVIDIA devices were initialized``;
- ``sxid``: NVSwitch ``nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, ...``;
- ``pcie_aer``: PCIe AER reports (``AER: Uncorrected (Fatal) error received: 0000:b3:00.0``,
  ``nvidia 0000:b3:00.0: PCIe Bus Error: severity=Corrected, ...``).

Pure functions and one small line-joining state machine; nothing here raises on odd input.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence

from slurmhealth.kernel_log.parse import might_be_fault
from slurmhealth.model import XidEvent, normalize_pci_bus_id
from slurmhealth.model_records import KernelEvent

_BDF = r"(?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)"
_BUS_RE = re.compile(_BDF)
_GPU_NUMBER_RE = re.compile(r"\bGPU([0-9]{1,3})\b")
_FALLEN = "fallen off the bus"


_FALLEN_HEAD_RE = re.compile(r"NVRM: The NVIDIA GPU " + _BDF)
_GSP_RE = re.compile(
    r"_kgspIsHeartbeatTimedOut|heartbeat timed out|\*+ ?GSP Timeout ?\*+"
    r"|GSP RPC buffer contains function|GSP\b.{0,80}\btimed? ?out"
    r"|\btime(?:d ?)?out\b.{0,80}\bGSP\b",
    re.IGNORECASE,
)
_INIT_RE = re.compile(
    r"RmInitAdapter failed|rm_init_adapter(?:\([0-9]+\))? failed"
    r"|The NVIDIA probe routine failed|None of the NVIDIA devices were initiali[sz]ed"
)
_PROBE_RES = (
    re.compile(r"^nvidia " + _BDF + r": probe with driver nvidia failed"),
    re.compile(r"^nvidia: probe of " + _BDF + r" failed"),
)
_SXID_RE = re.compile(
    r"(?P<dev>nvidia-nvswitch[0-9]*): SXid \("
    + _BDF
    + r"\): (?P<code>[0-9]{1,6})\b,?\s*(?P<rest>.*)"
)
# an SXid report goes on with "<switch>: SXid (<bus>): <code>, Severity 1 Engine instance 60
# Sub-engine instance 00" and "..., Data {0x..., ...}" lines: details, not more errors
_SXID_MORE = ("Severity ", "Data {")
_AER_RECEIVED_RE = re.compile(
    r"AER: (?:Multiple )?(?P<sev>Correct(?:ed|able)|Uncorrect(?:ed|able) \((?:Non-)?Fatal\))"
    r" error (?:message )?received(?: from)?:? " + _BDF
)
_AER_DEVICE_RE = re.compile(
    r"^(?P<dev>[\w.-]+) " + _BDF + r": (?:AER: )?PCIe Bus Error: severity=(?P<sev>[^,]+)"
)


def _bus(text: str | None) -> str | None:
    try:
        return None if text is None else normalize_pci_bus_id(text)
    except ValueError:
        return None


def _level(text: str) -> str | None:
    t = text.lower()
    if "non-fatal" in t or "nonfatal" in t:
        return "non-fatal"
    if "fatal" in t:
        return "fatal"
    return "corrected" if "correct" in t else None


def _event(
    kind: str,
    text: str,
    ts: float | None,
    seq: int | None,
    *,
    bus: str | None = None,
    number: int | None = None,
    code: int | None = None,
    level: str | None = None,
    device: str | None = "nvidia",
) -> KernelEvent:
    return KernelEvent(kind, text.strip(), text, ts, seq, bus, number, code, level, device)


def parse_event(
    text: str, *, seq: int | None = None, ts: float | None = None
) -> KernelEvent | None:
    """The non-Xid GPU fault one line reports, or ``None``; never raises."""
    try:
        return _parse(text.strip(), seq, ts)
    except (ValueError, TypeError, IndexError):
        return None


def _parse(text: str, seq: int | None, ts: float | None) -> KernelEvent | None:
    if "NVRM" in text:
        return None if "NVRM: Xid (" in text else _nvrm(text, seq, ts)  # Xids: parse_xid's
    if "SXid" in text and (m := _SXID_RE.search(text)):
        if m["rest"].startswith(_SXID_MORE):
            return None  # the "Severity ..." and "Data {...}" lines of the SXid above
        level = _level(m["rest"].split(",", 1)[0])
        code = int(m["code"])
        return _event(
            "sxid", text, ts, seq, bus=_bus(m["bus"]), code=code, level=level, device=m["dev"]
        )
    if "AER" in text and (m := _AER_RECEIVED_RE.search(text)):
        bus, level = _bus(m["bus"]), _level(m["sev"])
        return _event("pcie_aer", text, ts, seq, bus=bus, level=level, device=None)
    if "PCIe Bus Error" in text and (m := _AER_DEVICE_RE.search(text)):
        bus, level = _bus(m["bus"]), _level(m["sev"])
        return _event("pcie_aer", text, ts, seq, bus=bus, level=level, device=m["dev"])
    for probe in _PROBE_RES if "probe" in text else ():
        if m := probe.search(text):
            return _event("init_failed", text, ts, seq, bus=_bus(m["bus"]))
    return None


def _nvrm(text: str, seq: int | None, ts: float | None) -> KernelEvent | None:
    """The nvidia driver's own messages (``NVRM: ...``): lost GPU, init failure, GSP."""
    kind = (
        "fallen_off_bus" if _FALLEN in text
        else "init_failed" if _INIT_RE.search(text)
        else "gsp_timeout" if ("GSP" in text or "gsp" in text or "eartbeat" in text)
        and _GSP_RE.search(text)
        else None
    )  # fmt: skip
    if kind is None:
        return None
    bm = _BUS_RE.search(text)
    gm = _GPU_NUMBER_RE.search(text)
    bus = _bus(bm["bus"]) if bm else None
    number = int(gm[1]) if gm and bus is None else None
    return _event(kind, text, ts, seq, bus=bus, number=number)


class EventJoiner:
    """Turn a stream of log lines into :class:`KernelEvent` s, joining multi-line messages.

    The driver's "The NVIDIA GPU <bus> ... has fallen off the bus" message spans three
    lines, which may be one record with newlines or one record per line; the bus id is on
    the first line and "fallen off the bus" on the last.
    """

    WINDOW = 2  # the message is three lines: it ends at most two lines after its head

    def __init__(self) -> None:
        self._head: tuple[str, float | None, int | None, list[str]] | None = None
        self._left = 0

    def feed(
        self, text: str, *, seq: int | None = None, ts: float | None = None
    ) -> list[KernelEvent]:
        if self._head is None and not might_be_fault(text):
            return []
        out: list[KernelEvent] = []
        for line in text.split("\n"):
            out.extend(self._line(line.strip(), seq, ts))
        return out

    def _line(self, line: str, seq: int | None, ts: float | None) -> list[KernelEvent]:
        head = _FALLEN_HEAD_RE.search(line)
        if head is not None and _FALLEN not in line:
            self._head, self._left = (head["bus"], ts, seq, [line]), self.WINDOW
            return []
        if self._head is not None:
            bus, hts, hseq, lines = self._head
            lines.append(line)
            self._left -= 1
            if _FALLEN in line:
                self._head = None
                raw = "\n".join(lines)
                return [_event("fallen_off_bus", raw, hts, hseq, bus=_bus(bus))]
            if self._left <= 0 or not line.startswith("NVRM:"):
                self._head = None  # another message (e.g. "not supported by this driver")
        event = parse_event(line, seq=seq, ts=ts)
        return [] if event is None else [event]


def parse_events(lines: Iterable[str]) -> list[KernelEvent]:
    """Every non-Xid GPU fault in ``lines`` (message texts, no time prefix)."""
    joiner = EventJoiner()
    return [e for line in lines for e in joiner.feed(line)]


def resolve_gpu_numbers(
    events: Sequence[KernelEvent], xids: Sequence[XidEvent]
) -> list[KernelEvent]:
    """Give ``GPU<n>`` events the bus id of an Xid line of the same read that names ``GPU<n>``
    (Xid 119: ``Timeout waiting for RPC from GPU0 GSP!`` carries both)."""
    numbers: dict[int, str] = {}
    for x in xids:
        for m in _GPU_NUMBER_RE.finditer(x.message):
            numbers.setdefault(int(m[1]), x.pci_bus_id)
    out = []
    for e in events:
        bus = None if e.gpu_number is None else numbers.get(e.gpu_number)
        out.append(
            e if e.pci_bus_id is not None or bus is None else dataclasses.replace(e, pci_bus_id=bus)
        )
    return out
