"""NVLink5 Xids 144-150 decoded by their status fields (``xid_nvlink5.toml``, from the
catalog's "XID 144-150 Decode" tab): the line's sub component, ``intrInfo`` and
``errorStatus`` decide whether the error is fatal (reset the GPU) or can be ignored, and the
encoding of ``intrInfo`` changed with driver R575 (V1 before, V2 from R575 on).

Which encoding a line uses: the one whose sub-component code in ``intrInfo`` matches the
name the line prints; when both or neither match, the driver version (R575 and later: V2).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurmhealth.model import Action, Severity

_LINE = re.compile(
    r"(?P<sub>[A-Z][A-Z0-9_/]*)\s+(?P<fatal>fatal|non-?fatal)\s+XC(?P<xc>\d+)\s+"
    r"i(?P<inj>\d+)\s+Link\s+(?P<link>-?\d+)\s*\((?P<regs>0x[0-9a-f]+(?:[\s,]+0x[0-9a-f]+)*)\)",
    re.IGNORECASE,
)
_BUCKETS: Mapping[str, tuple[Severity, Action, str]] = {
    "RESET_GPU": (Severity.FAIL, Action.RESET, "fatal NVLink5 error: drain and reset the GPU "
                  "(nvidia-smi -r); check the links and the fabric manager if it recurs"),
    "IGNORE": (Severity.INFO, Action.RECORD, "non-fatal NVLink5 error: nothing to do unless "
               "it repeats"),
    "XID_154_EVAL": (Severity.WARN, Action.RECORD, "follow the Xid 154 logged beside it (its "
                     "recovery action decides); without one, restart the application"),
}  # fmt: skip


@dataclass(frozen=True)
class Nvlink5:
    """One decoded 144-150 line."""

    sub: str  # the sub component the line prints
    fatal_text: bool  # the line says Fatal
    link: int
    intr_info: int
    error_status: int
    version: str  # "V1" (before R575) or "V2"
    bucket: str  # RESET_GPU, IGNORE, XID_154_EVAL, or "" (not in the decode table)
    reason: int | None = None  # NETIR_LINK_DOWN's link-down reason (V1)


@functools.cache
def _rows() -> tuple[Mapping[str, Any], ...]:
    import tomllib

    from slurmhealth.checks.packaged import packaged_text

    text = packaged_text("xid_nvlink5.toml")
    return tuple(tomllib.loads(text)["row"])


def _subcode(intr: int, version: str) -> int:
    return (intr >> 5) & 0x1F if version == "V1" else intr & 0x7F


def _row(xid: int, sub: str, intr: int, version: str) -> Mapping[str, Any] | None:
    code = _subcode(intr, version)
    key = "v1" if version == "V1" else "v2"
    name = sub.upper()
    rows = [r for r in _rows() if r["xid"] == xid and r[key] == code]
    return next((r for r in rows if name in r["names"]), rows[0] if rows else None)


def _version(xid: int, sub: str, intr: int, driver: str | None) -> str:
    named = [
        v for v in ("V1", "V2") if (r := _row(xid, sub, intr, v)) and sub.upper() in r["names"]
    ]
    if len(named) == 1:
        return named[0]
    major = re.match(r"(\d+)", driver or "")
    return "V2" if major and int(major.group(1)) >= 575 else "V1"


def decode(xid: int, message: str, driver: str | None = None) -> Nvlink5 | None:
    """The line's fields and the catalog's bucket; None if the line carries no such fields."""
    m = _LINE.search(message)
    if not 144 <= xid <= 150 or m is None:
        return None
    regs = [int(x, 16) for x in re.findall(r"0x[0-9a-f]+", m["regs"], re.IGNORECASE)]
    intr, status = regs[0], regs[1] if len(regs) > 1 else 0
    version = _version(xid, m["sub"], intr, driver)
    row = _row(xid, m["sub"], intr, version)
    bucket, reason = _bucket(row, version, intr, status)
    return Nvlink5(
        sub=m["sub"], fatal_text=m["fatal"].lower() == "fatal", link=int(m["link"]),
        intr_info=intr, error_status=status, version=version, bucket=bucket, reason=reason,
    )  # fmt: skip


def _bucket(
    row: Mapping[str, Any] | None, version: str, intr: int, status: int
) -> tuple[str, int | None]:
    if row is None:
        return "", None
    key = f"0x{status:08x}"
    bit = row.get(f"action2_bit_{version.lower()}")
    if bit is not None and intr >> int(bit) & 1 and key in row.get("action2_status", ()):
        return str(row["action2"]), None
    reason = None
    if version == "V1" and "reason_shift_v1" in row:
        reason = (intr >> int(row["reason_shift_v1"])) & 0x3F
        if reason in row.get("reason_ignore", ()):
            return "IGNORE", reason
    statuses: Mapping[str, str] = row.get("status", {})
    return str(statuses.get(key, row.get("default", ""))), reason


def verdict(d: Nvlink5) -> tuple[Severity, Action, str]:
    """Severity, action and hint of a decoded line. A status the decode table lacks follows
    the line's own word: Fatal resets, Nonfatal warns."""
    if d.bucket in _BUCKETS:
        severity, action, hint = _BUCKETS[d.bucket]
    elif d.fatal_text:
        severity, action, hint = _BUCKETS["RESET_GPU"]
        hint = "not in the catalog's decode table; the line says Fatal: " + hint
    else:
        severity, action = Severity.WARN, Action.RECORD
        hint = "not in the catalog's decode table; the line says Nonfatal: watch it"
    where = f"{d.sub} link {d.link}, status 0x{d.error_status:08x}, {d.version} decode"
    return severity, action, f"{where}: {hint}"


def describe(d: Nvlink5) -> dict[str, Any]:
    """The decoded fields, as a finding's evidence."""
    return {
        "sub_component": d.sub, "link": d.link, "intr_info": f"0x{d.intr_info:08x}",
        "error_status": f"0x{d.error_status:08x}", "decode": d.version,
        "bucket": d.bucket or None, "line_says": "fatal" if d.fatal_text else "nonfatal",
        "link_down_reason": d.reason,
    }  # fmt: skip


__all__: Sequence[str] = ("Nvlink5", "decode", "describe", "verdict")
