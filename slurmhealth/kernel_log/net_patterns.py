"""RDMA network faults in the kernel log (the mlx5 driver, ConnectX HCAs).

The driver's own messages (``drivers/net/ethernet/mellanox/mlx5/core``), each prefixed by
the device as ``dev_*()`` prints it (``mlx5_core 0000:5e:00.0: ``, or with the net device
``mlx5_core 0000:5e:00.0 ens1f0np0: ``) and on older kernels by the function
(``mlx5_port_module_event:1147:(pid 0): ``):

- ``net_link_down`` / ``net_link_up``: ``Link down`` / ``Link up`` (the net device's
  carrier, RoCE and IPoIB ports);
- ``net_module``: ``Port module event: module 0, Cable plugged`` (also ``Cable unplugged``,
  ``Cable disabled``): ``level`` is ``info`` for plugged, ``warn`` otherwise;
- ``net_module_error``: ``Port module event[error]: module 0, Cable error, High
  Temperature`` (or ``Bad or shorted cable/module``, ``Power budget exceeded``, ``Bus stuck
  (I2C or data shorted)``, ``No EEPROM/retry timeout``, ...): ``level`` ``error``;
- ``net_pcie_power``: ``Detected insufficient power on the PCIe slot (27W).``;
- ``net_health``: ``device's health compromised - reached miss count``,
  ``unrecoverable hardware error``, ``High temperature on sensors with bit set ...``.

``pci_bus_id`` is the HCA's PCI function (normalised) when the line names it, ``device``
the net device when it does (else the driver), ``code`` the module number of a module event.
Pure functions; nothing here raises on odd input.
"""

from __future__ import annotations

import re

from slurmhealth.kernel_log.parse import might_be_net
from slurmhealth.model import normalize_pci_bus_id
from slurmhealth.model_records import KernelEvent

NET_EVENT_KINDS = (
    "net_link_down",
    "net_link_up",
    "net_module",
    "net_module_error",
    "net_pcie_power",
    "net_health",
)

_PREFIX_RE = re.compile(
    r"(?P<drv>mlx5_(?:core|ib)\w{0,8})"
    r"(?: (?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]))?"
    r"(?: (?P<dev>[\w.@-]{1,32}))?:\s"
    r"(?:\w{1,64}:[0-9]{1,6}:(?:\(pid [0-9]{1,10}\):)?\s?)?"  # older: "func:line:(pid N): "
    r"(?P<msg>.*)",
    re.DOTALL,
)
_MODULE_RE = re.compile(
    r"Port module event(?P<err>\[error\])?: module (?P<mod>[0-9]{1,4}), (?P<status>[^,]{1,40})"
    r"(?:, (?P<error>.{1,200}))?"
)
_LINK_RE = re.compile(r"^Link (?P<state>up|down)\b", re.IGNORECASE)
_POWER_RE = re.compile(r"insufficient power on the PCIe slot(?: \((?P<w>[0-9]{1,4})W\))?")
_HEALTH_RE = re.compile(
    r"health compromised|unrecoverable hardware error|High temperature on sensors"
    r"|Fatal error detected|firmware (?:is )?stuck|device is in error state"
)


def parse_net_event(
    text: str, *, seq: int | None = None, ts: float | None = None
) -> KernelEvent | None:
    """The network fault one kernel-log message reports (no time prefix), or ``None``."""
    try:
        return _parse(text.strip(), seq, ts)
    except (ValueError, TypeError, IndexError):
        return None


def _parse(text: str, seq: int | None, ts: float | None) -> KernelEvent | None:
    if not might_be_net(text) or (m := _PREFIX_RE.search(text)) is None:
        return None
    msg = m["msg"].strip()
    bus = _bus(m["bus"])
    device = m["dev"] or m["drv"]
    kind, code, level = _classify(msg)
    if kind is None:
        return None
    return KernelEvent(kind, text, text, ts, seq, bus, None, code, level, device)


def _classify(msg: str) -> tuple[str | None, int | None, str | None]:
    """(kind, module number, level) of the message after the device prefix."""
    if (link := _LINK_RE.match(msg)) is not None:
        down = link["state"].lower() == "down"
        return ("net_link_down", None, "warn") if down else ("net_link_up", None, "info")
    if (mod := _MODULE_RE.search(msg)) is not None:
        number = int(mod["mod"])
        if mod["err"] or mod["status"].strip().lower() == "cable error":
            return "net_module_error", number, "error"
        plugged = mod["status"].strip().lower() == "cable plugged"
        return "net_module", number, "info" if plugged else "warn"
    if _POWER_RE.search(msg):
        return "net_pcie_power", None, "error"
    if _HEALTH_RE.search(msg):
        return "net_health", None, "error"
    return None, None, None


def _bus(text: str | None) -> str | None:
    try:
        return None if text is None else normalize_pci_bus_id(text)
    except ValueError:
        return None


def parse_net_events(lines: list[str]) -> list[KernelEvent]:
    """Every network fault in ``lines`` (message texts, no time prefix)."""
    return [e for line in lines if (e := parse_net_event(line)) is not None]
