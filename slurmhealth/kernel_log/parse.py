"""One kernel-log line: its time prefix, its kmsg fields, and the Xid it reports.

Pure functions that never raise on odd input. Time prefixes understood:

- ``/dev/kmsg`` records ``6,1234,5678901,-;text`` (microseconds since boot),
- ``dmesg`` and ``dmesg --raw`` ``[ 1843.308145] text`` (seconds since boot), also with
  ``dmesg -x``'s ``kern  :err   : `` prefix,
- ``dmesg -T`` / ``--ctime`` ``[Tue Dec  1 01:02:03 2026] text`` (local time),
- ``dmesg --time-format iso`` ``2026-12-01T01:02:03,123456+00:00 text``,
- syslog ``Dec  1 01:02:03 host kernel: text`` (local time, no year), RFC 3339 rsyslog and
  ``journalctl -o short-iso`` / ``short-iso-precise`` ``2026-12-01T01:02:03.123456+00:00
  host kernel: text``, ``journalctl -o short-precise`` ``Dec 01 01:02:03.123456 host
  kernel: text`` and ``short-unix`` ``1764550923.123456 host kernel: text``.

Wall-clock times become UTC seconds (:attr:`LogLine.wall`); times since boot stay
microseconds (:attr:`LogLine.usec`) for the reader to add to the boot time.
"""

from __future__ import annotations

import re
import time
from typing import NamedTuple, TypedDict

from slurmhealth.model import XidEvent, normalize_pci_bus_id

# Every pattern here is a string that `re` compiles (and caches) on first use: a process
# whose log holds no line of a form (most prologs read no Xid at all) never pays for it.
_XID = (
    r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-f]{1,8}:[0-9a-f]{1,2}:[0-9a-f]{1,2}(?:\.[0-7])?)"
    r"(?:\s+(?P<gi>GPU-I:[0-9a-z]{1,8})(?:\s+GPU-CI:[0-9a-z]{1,8})?)?\):\s*"
    r"(?P<xid>[0-9]{1,5})(?![0-9])(?P<rest>.*)"
)
_XID_FLAGS = re.ASCII | re.IGNORECASE | re.DOTALL
_PID = r"pid=(?P<v>'[^']*'|<[^>]*>|[^,\s]*)\s*,?\s*"  # re.ASCII
_NAME = r"name=(?P<v>'[^']*'|<[^>]*>|[^,]*?)\s*(?:,\s*|$)"  # re.ASCII
# The driver's verdict fields, rare.
_CONTAINED = r"(?<![A-Za-z])(?P<un>Un)?[Cc]ontained:"
_RST = r"(?P<d>D-)?RST:\s*(?P<v>Yes|No)\b"
_RECOVERY = r"recovery action changed from .{0,60}?\bto 0x([0-9a-f]{1,8})"
_CAUSED = r"caused by previous Xid\s+([0-9]{1,5})\b"
# /dev/kmsg: "prio,seq,usec,flags[,caller=..];text" then " KEY=value" dictionary lines.
_KMSG = r"([0-9]{1,4}),([0-9]{1,20}),([0-9]{1,20})(?:,[^;]*)?;(.*)"  # re.DOTALL
_KMSG_ESCAPE = r"\\x([0-9a-f]{2})"
# dmesg / dmesg --raw / dmesg -x: "[12345.678901] text", "<6>[..] text", "kern  :err   : [..]".
_DMESG = (  # re.DOTALL
    r"(?:<[0-9]{1,4}>|[a-z]{1,8} *:[a-z]{1,8} *: )?\[\s*([0-9]{1,12})\.([0-9]{1,9})\] ?(.*)"
)
_MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
_MON = "(?P<mon>" + "|".join(_MONTHS) + ")"
_HMS = r"(?P<h>[0-9]{2}):(?P<mi>[0-9]{2}):(?P<s>[0-9]{2})"
_FRAC = r"(?:[.,](?P<frac>[0-9]{1,9}))?"
_HOST = r" \S+ kernel(?:\[[0-9]+\])?: "  # syslog / journal "host kernel: " (or "kernel[0]: ")
# The wall-clock forms: a process that only reads /dev/kmsg never compiles them. All are
# matched with re.DOTALL.
# dmesg -T / --ctime: "[Tue Dec  1 01:02:03 2026] text", local time.
_CTIME = (
    r"\[(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) " + _MON + r" {1,2}(?P<d>[0-9]{1,2}) " + _HMS
    + r" (?P<y>[0-9]{4})\] ?(?P<text>.*)"
)  # fmt: skip
# ISO 8601 / RFC 3339 with an offset: dmesg --time-format iso, rsyslog, journal short-iso.
_ISO = (
    r"(?P<y>[0-9]{4})-(?P<mo>[0-9]{2})-(?P<d>[0-9]{2})T" + _HMS + _FRAC
    + r"(?P<tz>Z|[+-][0-9]{2}:?[0-9]{2})(?:" + _HOST + r"| )(?P<text>.*)"
)  # fmt: skip
# syslog / journal short and short-precise: "Dec  1 01:02:03 host kernel: text", local time.
_SYSLOG = _MON + r" {1,2}(?P<d>[0-9]{1,2}) " + _HMS + _FRAC + _HOST + r"(?P<text>.*)"
_UNIX = r"(?P<sec>[0-9]{9,11})\.(?P<frac>[0-9]{1,9})" + _HOST + r"(?P<text>.*)"
_DICT = r"[ \t]+[A-Z_][A-Z0-9_]*="


def might_be_fault(text: str) -> bool:
    """False for lines that cannot be (part of) a GPU fault: a cheap filter before parsing.

    Every line of the multi-line fallen-off-the-bus message carries ``NVRM:``."""
    return (
        "NVRM" in text or "SXid" in text or "AER" in text or "PCIe Bus" in text or "probe" in text
    )


def might_be_net(text: str) -> bool:
    """False for lines that cannot be an RDMA network fault (the mlx5 driver's): a cheap
    filter (:mod:`.net_patterns` parses the rest)."""
    return "mlx5" in text


class LogLine(NamedTuple):
    """One log line split into its parts; unknown parts are ``None``."""

    text: str
    seq: int | None = None  # /dev/kmsg sequence number
    usec: int | None = None  # microseconds since boot
    wall: float | None = None  # UTC seconds, from a wall-clock prefix


def _frac(text: str | None) -> float:
    return int(text) / 10 ** len(text) if text else 0.0


def _local(y: int, mo: int, d: int, h: int, mi: int, s: int) -> float:
    """Seconds since the epoch of a local (this machine's time zone) wall-clock time."""
    return time.mktime((y, mo, d, h, mi, s, 0, 0, -1))


def _iso(m: re.Match[str]) -> float:
    tz = m["tz"]
    off = 0
    if tz != "Z":
        sign = -1 if tz[0] == "-" else 1
        digits = tz[1:].replace(":", "")
        off = sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    import calendar  # only ISO lines need it

    fields = (int(m["y"]), int(m["mo"]), int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]))
    return calendar.timegm((*fields, 0, 0, 0)) - off + _frac(m["frac"])


def _syslog(m: re.Match[str], now: float | None) -> float:
    """Syslog has no year: the one that puts the line at most a day after ``now``."""
    ref = time.time() if now is None else now
    year = time.localtime(ref).tm_year
    fields = (_MONTHS.index(m["mon"]) + 1, int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]))
    ts = _local(year, *fields)
    if ts > ref + 86400:
        ts = _local(year - 1, *fields)
    return ts + _frac(m["frac"])


def _wall(line: str, now: float | None) -> tuple[float | None, str] | None:
    """``(UTC seconds, rest)`` for a line with a wall-clock prefix, else ``None``."""
    try:
        if m := re.fullmatch(_CTIME, line, re.DOTALL):
            mon = _MONTHS.index(m["mon"]) + 1
            return _local(int(m["y"]), mon, int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"])), m[
                "text"
            ]
        if m := re.fullmatch(_ISO, line, re.DOTALL):
            return _iso(m), m["text"]
        if m := re.fullmatch(_SYSLOG, line, re.DOTALL):
            return _syslog(m, now), m["text"]
        if m := re.fullmatch(_UNIX, line, re.DOTALL):
            return int(m["sec"]) + _frac(m["frac"]), m["text"]
    except (ValueError, OverflowError, OSError):
        return None, line  # a prefix that names no real time: keep the text, no time
    return None


def split_line(line: str, *, now: float | None = None) -> LogLine:
    """Split one log line of any supported form into a :class:`LogLine`; never raises.

    ``now`` (UTC seconds, default the clock) only picks the year of syslog lines. kmsg
    dictionary lines (`` KEY=value``) give empty text; kmsg escapes (``\\x0a``) are undone.
    """
    line = line.rstrip("\r\n")
    if re.match(_DICT, line):
        return LogLine("")
    m = re.fullmatch(_KMSG, line, re.DOTALL)
    if m is not None:
        text = m[4]
        if "\\x" in text:
            text = re.sub(_KMSG_ESCAPE, lambda e: chr(int(e[1], 16)), text)
        return LogLine(text, int(m[2]), int(m[3]))
    wall: float | None = None
    stamped = _wall(line, now)
    if stamped is not None:
        wall, line = stamped
    dm = re.fullmatch(_DMESG, line, re.DOTALL)
    if dm is not None:
        usec = int(dm[1]) * 1_000_000 + int(dm[2].ljust(6, "0")[:6])
        return LogLine(dm[3], usec=usec, wall=wall)
    return LogLine(line, wall=wall)


def parse_line(line: str) -> tuple[int | None, int | None, str]:
    """``(kmsg seq, usec since boot, message text)`` of one line (see :func:`split_line`)."""
    parts = split_line(line)
    return parts.seq, parts.usec, parts.text


def format_kmsg_record(seq: int, usec: int, text: str, prio: int = 3) -> str:
    """Return ``text`` as one ``/dev/kmsg`` record line, without the trailing newline.

    ``usec`` is microseconds since boot; newlines in ``text`` are escaped as the kernel does.
    """
    if seq < 0 or usec < 0 or not 0 <= prio <= 191:
        raise ValueError(f"bad kmsg record fields: seq={seq} usec={usec} prio={prio}")
    body = text.replace("\\", "\\x5c").replace("\n", "\\x0a").replace("\r", "\\x0d")
    return f"{prio},{seq},{usec},-;{body}"


def _unquote(value: str) -> str | None:
    v = value.strip().strip("'\"")
    return None if v in ("", "<unknown>") else v


class _Verdict(TypedDict, total=False):
    contained: bool | None
    reset_required: bool | None
    drain_reset_required: bool | None
    recovery_action: int | None
    caused_by: int | None


def _verdict(rest: str) -> _Verdict:
    """The driver's own fields on an Xid line, those present (cheap tests first)."""
    out = _Verdict()
    if "ontained:" in rest and (cm := re.search(_CONTAINED, rest, re.ASCII)) is not None:
        out["contained"] = cm["un"] is None
    if "RST:" in rest:
        out["reset_required"] = _yes(rest, "RST")
        out["drain_reset_required"] = _yes(rest, "D-RST")
    if "recovery action" in rest:
        out["recovery_action"] = _number(_RECOVERY, rest, 16)
    if "caused by" in rest:
        out["caused_by"] = _number(_CAUSED, rest)
    return out


def _yes(rest: str, key: str) -> bool | None:
    """The driver's ``RST:`` / ``D-RST:`` field: True for Yes, False for No, None if absent."""
    for rm in re.finditer(_RST, rest, re.ASCII | re.IGNORECASE):
        if (rm["d"] is not None) == (key == "D-RST"):
            return rm["v"].lower() == "yes"
    return None


def _number(pattern: str, rest: str, base: int = 10) -> int | None:
    m = re.search(pattern, rest, re.IGNORECASE)
    return None if m is None else int(m[1], base)


def parse_xid(text: str, *, seq: int | None = None, ts: float | None = None) -> XidEvent | None:
    """Parse one ``NVRM: Xid (...)`` kernel-log line; ``None`` for anything else, never raises.

    Understands ``NVRM: Xid (PCI:0000:53:00): 79, pid=1234, name=python3, <message>``, the
    older forms without pid/name or without ``PCI:``, MIG's ``(PCI:.. GPU-I:05 GPU-CI:01)``,
    and the driver's verdict fields (``Contained: SM (0x1). RST: No, D-RST: No``).
    """
    try:
        m = re.search(_XID, text, _XID_FLAGS)
        if m is None:
            return None
        bus = normalize_pci_bus_id(m["bus"])
        rest = m["rest"].lstrip(" \t,")
        pid: int | None = None
        name: str | None = None
        pm = re.match(_PID, rest, re.ASCII)
        if pm is not None:
            p = _unquote(pm["v"])
            pid = int(p) if p is not None and p.isascii() and p.isdigit() else None
            rest = rest[pm.end() :]
            nm = re.match(_NAME, rest, re.ASCII)
            if nm is not None:
                name = _unquote(nm["v"])
                rest = rest[nm.end() :]
        return XidEvent(
            xid=int(m["xid"]),
            pci_bus_id=bus,
            message=rest.strip(),
            raw=text.rstrip("\r\n"),
            ts=ts,
            pid=pid,
            process_name=name,
            gpu_instance=m["gi"].upper() if m["gi"] else None,
            seq=seq,
            **_verdict(rest),
        )
    except (ValueError, TypeError):
        return None
