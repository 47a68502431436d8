"""RDMA network faults in the kernel log (the mlx5 driver, ConnectX HCAs).

The driver's own messages (``drivers/net/ethernet/mellanox/mlx5/core``), each prefixed by
the device as ``dev_*()`` prints it (``mlx5_core 0000:5e:00.0: ``, or with the net device
``mlx5_core 0000:5e:00.0 ens1f0np0: ``) and, by ``mlx5_core_err/warn/info``, by the
function (``poll_health:800:(pid 0): ``). :data:`PATTERNS` is one row per message: the
driver's format string (``fmt``, what the tests fill in), the expression that reads it, the
event kind and the level the line itself implies. The kinds:

- ``net_link_down`` / ``net_link_up``: the net device's carrier (``Link down``);
- ``net_module`` / ``net_module_error``: ``Port module event: module %u, %s`` /
  ``Port module event[error]: module %u, %s, %s`` (events.c); ``code`` the module;
- ``net_temperature``: ``High temperature on sensors with bit set %llx %llx``;
- ``net_pcie_power``: ``Detected insufficient power on the PCIe slot (%uW).``;
- ``net_health``: firmware health failures (health.c): ``Fatal error %u detected``
  (``code`` the sensor: 1 PCI communication lost, 2 PCI channel offline, 3 NIC interface
  disabled, 4 NIC software reset, 5 firmware asks for a reset), ``device's health
  compromised - reached miss count``, ``FW is unable to respond to initialization segment
  reads``, ``internal state error detected``, ``health recovery flow aborted, PCI reads
  still not working``, ``Health issue observed, %s, severity(%d) %s:`` at severity 3
  (error) or worse and the older ``synd 0x%x: %s``;
- ``net_health_warn``: ``Health issue observed`` at severity 4 (warning) or milder;
- ``net_cmd_timeout``: the command interface hung (cmd.c): ``cmd[%d]: %s(0x%x) No done
  completion``, ``%s(0x%x) timeout. Will cause a leak of a command resource``, ``%s(0x%x)
  canceled on out of queue timeout.``; ``code`` the opcode, ``detail`` the command's name;
- ``net_cmd_late``: ``cmd[%d]: %s(0x%x) recovered after timeout``, ``Command completion
  arrived after timeout (entry idx = %d).``;
- ``net_cmd_error``: ``%s(0x%x) op_mod(0x%x) failed, status %s(0x%x), syndrome (0x%x),
  err(%d)``: the firmware refused one command (informational);
- ``net_pci_error``: the PCI error handler (main.c ``mlx5_pci_err_detected``): ``... Enter,
  pci channel state = %d`` (``code``: 1 normal, 2 frozen, 3 permanent failure), and
  health.c's ``PCI slot is unavailable``.

``pci_bus_id`` is the HCA's PCI function (normalised) when the line names it, ``device``
the net device when it does (else the driver). Pure functions; nothing here raises on odd
input.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

from slurmhealth.kernel_log.parse import guarded, might_be_net
from slurmhealth.model import normalize_pci_bus_id
from slurmhealth.model_records import KernelEvent

_PREFIX_RE = re.compile(
    r"(?P<drv>mlx5_(?:core|ib)\w{0,8})"
    r"(?: (?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]))?"
    r"(?: (?P<dev>[\w.@-]{1,32}))?:\s"
    r"(?:\w{1,64}:[0-9]{1,6}:(?:\(pid [0-9]{1,10}\):)?\s?)?"  # "func:line:(pid N): "
    r"(?P<msg>.*)",
    re.DOTALL,
)
_CMD = r"(?P<cmd>[A-Z0-9_]{1,64}|unknown command opcode)\(0x(?P<op>[0-9a-fA-F]{1,4})\)"
Level = Callable[[re.Match[str]], str]


def _fixed(level: str) -> Level:
    return lambda _m: level


def _module_level(m: re.Match[str]) -> str:
    return "info" if m["status"].strip().lower() == "cable plugged" else "warn"


def _health_level(m: re.Match[str]) -> str:
    return "error" if int(m["sev"]) <= 3 else "warn"  # syslog levels: 3 ERR, 4 WARNING


def _pci_level(m: re.Match[str]) -> str:
    return "warn" if m["code"] == "1" else "fatal"  # pci_channel_io_normal


class Pattern(NamedTuple):
    """One driver message: ``fmt`` as the driver prints it (after the device prefix)."""

    name: str
    fmt: str
    regex: re.Pattern[str]
    kind: str
    level: Level
    code: str | None = None  # the group holding the event's number
    code_base: int = 10


def _p(name: str, fmt: str, regex: str, kind: str, level: Level | str, **kw: object) -> Pattern:
    lv = _fixed(level) if isinstance(level, str) else level
    return Pattern(name, fmt, re.compile(regex), kind, lv, **kw)  # type: ignore[arg-type]


PATTERNS: tuple[Pattern, ...] = (
    _p("link_down", "Link down", r"^Link down\b", "net_link_down", "warn"),
    _p("link_up", "Link up", r"^Link up\b", "net_link_up", "info"),
    _p("module_error", "Port module event[error]: module %u, %s, %s",
       r"Port module event\[error\]: module (?P<code>[0-9]{1,4}), (?P<status>[^,]{1,40})"
       r"(?:, (?P<error>.{1,200}))?", "net_module_error", "error", code="code"),
    _p("module_cable_error", "Port module event: module %u, %s",
       r"Port module event: module (?P<code>[0-9]{1,4}), (?P<status>Cable error)\b",
       "net_module_error", "error", code="code"),
    _p("module", "Port module event: module %u, %s",
       r"Port module event: module (?P<code>[0-9]{1,4}), (?P<status>[^,]{1,40})",
       "net_module", _module_level, code="code"),
    _p("temperature", "High temperature on sensors with bit set %llx %llx",
       r"High temperature on sensors with bit set", "net_temperature", "warn"),
    _p("pcie_power", "Detected insufficient power on the PCIe slot (%uW).",
       r"insufficient power on the PCIe slot(?: \((?P<code>[0-9]{1,4})W\))?",
       "net_pcie_power", "error", code="code"),
    _p("fatal_error", "Fatal error %u detected", r"Fatal error (?P<code>[0-9]{1,10}) detected",
       "net_health", "fatal", code="code"),
    _p("miss_count", "device's health compromised - reached miss count",
       r"health compromised - reached miss count", "net_health", "fatal"),
    _p("iseg_reads", "FW is unable to respond to initialization segment reads",
       r"FW is unable to respond to initialization segment reads", "net_health", "fatal"),
    _p("internal_state", "internal state error detected", r"internal state error detected",
       "net_health", "fatal"),
    _p("recovery_aborted", "health recovery flow aborted, PCI reads still not working",
       r"health recovery flow aborted", "net_health", "fatal"),
    _p("health_issue", "Health issue observed, %s, severity(%d) %s:",
       r"Health issue observed, (?P<what>[^,]{1,60}), severity\((?P<sev>[0-9]{1,2})\)",
       "net_health", _health_level),
    _p("health_synd", "synd 0x%x: %s",
       r"^synd 0x(?P<code>[0-9a-fA-F]{1,2}): (?P<what>\S.{0,60})", "net_health", "error",
       code="code", code_base=16),
    _p("cmd_no_completion", "cmd[%d]: %s(0x%x) No done completion",
       r"cmd\[-?[0-9]{1,3}\]: " + _CMD + r" No done completion", "net_cmd_timeout", "fatal",
       code="op", code_base=16),
    _p("cmd_leak", "%s(0x%x) timeout. Will cause a leak of a command resource",
       _CMD + r" timeout\. Will cause a leak of a command resource", "net_cmd_timeout",
       "fatal", code="op", code_base=16),
    _p("cmd_canceled", "%s(0x%x) canceled on out of queue timeout.",
       _CMD + r" canceled on out of queue timeout", "net_cmd_timeout", "fatal", code="op",
       code_base=16),
    _p("cmd_recovered", "cmd[%d]: %s(0x%x) recovered after timeout",
       r"cmd\[-?[0-9]{1,3}\]: " + _CMD + r" recovered after timeout", "net_cmd_late", "warn",
       code="op", code_base=16),
    _p("cmd_late", "Command completion arrived after timeout (entry idx = %d).",
       r"Command completion arrived after timeout", "net_cmd_late", "warn"),
    _p("cmd_failed", "%s(0x%x) op_mod(0x%x) failed, status %s(0x%x), syndrome (0x%x), err(%d)",
       _CMD + r" op_mod\(0x[0-9a-fA-F]{1,4}\) failed, status ", "net_cmd_error", "info",
       code="op", code_base=16),
    _p("pci_error", "%s Device state = %d health sensors: %d pci_status: %d. "
       "Enter, pci channel state = %d",
       r"mlx5_pci_err_detected Device state = .{0,80}Enter, pci channel state = "
       r"(?P<code>[0-9])", "net_pci_error", _pci_level, code="code"),
    _p("pci_slot", "PCI slot is unavailable", r"^PCI slot is unavailable", "net_pci_error",
       "fatal"),
)  # fmt: skip

NET_EVENT_KINDS = tuple(dict.fromkeys(p.kind for p in PATTERNS))


def parse_net_event(
    text: str, *, seq: int | None = None, ts: float | None = None
) -> KernelEvent | None:
    """The network fault one kernel-log message reports (no time prefix), or ``None``."""
    return guarded(_parse, text, seq, ts)


def _parse(text: str, seq: int | None, ts: float | None) -> KernelEvent | None:
    if not might_be_net(text) or (m := _PREFIX_RE.search(text)) is None:
        return None
    msg = m["msg"].strip()
    for p in PATTERNS:
        if (found := p.regex.search(msg)) is None:
            continue
        raw_code = found[p.code] if p.code else None
        code = int(raw_code, p.code_base) if raw_code else None
        return KernelEvent(p.kind, text, text, ts, seq, _bus(m["bus"]), None, code,
                           p.level(found), m["dev"] or m["drv"])  # fmt: skip
    return None


def pattern_of(message: str) -> Pattern | None:
    """The row of :data:`PATTERNS` a message (after the device prefix) matches first."""
    return next((p for p in PATTERNS if p.regex.search(message)), None)


def _bus(text: str | None) -> str | None:
    try:
        return None if text is None else normalize_pci_bus_id(text)
    except ValueError:
        return None


def parse_net_events(lines: list[str]) -> list[KernelEvent]:
    """Every network fault in ``lines`` (message texts, no time prefix)."""
    return [e for line in lines if (e := parse_net_event(line)) is not None]
