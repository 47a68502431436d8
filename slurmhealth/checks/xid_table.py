"""What each NVIDIA Xid means and what to do about it, from ``xid_catalog.toml`` (pure data).

The table follows the immediate actions of NVIDIA's Xid catalog (ignore, restart the app,
reset the GPU, reboot the node, check mechanicals, contact support, or a workflow): Xids
that point at the node (ECC, NVLink, bus, GSP firmware) take it out of service (``drain``
or ``reset``); application-level Xids (13, 31, 43, 45, 68) are recorded only. An Xid missing
from the table, or listed by NVIDIA without a resolution bucket yet (bucket ``UNBUCKETED``,
e.g. 162-172), is a warning, never a reason to drain. NVLink5 Xids 144-150 are decoded by
their status fields (:mod:`slurmhealth.checks.xid_nvlink5`). When the Xid line carries
the driver's own verdict (``Contained:``, ``RST:``, ``D-RST:``, Xid 154's recovery action),
:func:`judge` lets it override the table.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

from slurmhealth.model import Action, Severity, XidEvent

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/"


@dataclass(frozen=True)
class XidInfo:
    """One Xid's meaning: catalog name, how bad it is, what to do, and a one-line hint.

    ``immediate`` is the catalog's immediate action (e.g. ``RESET_GPU``), ``source`` the
    catalog row (and any departure from it), ``basis`` what decided the verdict: ``catalog``,
    ``driver`` (the line's own fields), ``decode`` (NVLink5 status fields) or ``unknown``.
    """

    xid: int
    name: str
    severity: Severity
    action: Action
    hint: str
    mnemonic: str = ""
    immediate: str = ""
    source: str = ""
    basis: str = "catalog"

    @property
    def acts(self) -> bool:
        """True when the Xid takes the node out of service (drain or reset)."""
        return self.action.takes_node_out


class _Catalog(NamedTuple):
    rows: Mapping[int, XidInfo]  # every row of the file, 63 included
    buckets: Mapping[str, Mapping[str, str]]
    table: Mapping[int, XidInfo]  # without 63
    xid63: tuple[XidInfo, XidInfo, XidInfo]  # remap pending, done, unknown


@functools.cache
def _catalog() -> _Catalog:
    """Read the packaged catalog on first use (a check run without Xids never pays for it);
    a broken file is a packaging bug and raises."""
    import tomllib

    from slurmhealth.checks.packaged import packaged_text

    text = packaged_text("xid_catalog.toml")
    data: dict[str, Any] = tomllib.loads(text)
    buckets: dict[str, dict[str, str]] = data["bucket"]
    rows: dict[int, XidInfo] = {}
    for key, row in data["xid"].items():
        bucket = buckets[row["immediate"]]
        rows[int(key)] = XidInfo(
            xid=int(key),
            name=row["name"],
            severity=Severity.parse(row.get("severity", bucket["severity"])),
            action=Action(row.get("action", bucket["action"])),
            hint=row.get("hint", bucket["hint"]),
            mnemonic=row["mnemonic"],
            immediate=row["immediate"],
            source=row["source"],
        )
    table = MappingProxyType({x: r for x, r in rows.items() if x != 63})
    return _Catalog(MappingProxyType(rows), MappingProxyType(buckets), table, _xid63(rows[63]))


def _xid63(row: XidInfo) -> tuple[XidInfo, XidInfo, XidInfo]:
    """Xid 63: a row remap (or page retirement) was recorded. Harmless on its own; a pending
    remap only takes effect after a GPU reset, so until then the GPU must not take new jobs.
    Returns the verdicts for: remap pending, nothing pending, state unknown."""
    pending, done, unknown = (
        dataclasses.replace(row, severity=severity, action=action, hint=hint)
        for severity, action, hint in (
            (Severity.FAIL, Action.DRAIN, "row remap pending: drain and reset the GPU "
             "(nvidia-smi -r) to activate it (nvidia-smi -q -d ROW_REMAPPER)"),
            (Severity.INFO, Action.RECORD, "row remap/page retirement recorded, nothing "
             "pending: watch the trend (nvidia-smi -q -d ROW_REMAPPER)"),
            (Severity.WARN, Action.RECORD, "row remap state unknown: check nvidia-smi -q -d "
             "ROW_REMAPPER for a pending remap"),
        )
    )  # fmt: skip
    return pending, done, unknown


_LAZY = ("XID_TABLE", "BUCKETS", "XID63_PENDING", "XID63_DONE", "XID63_UNKNOWN")


def __getattr__(name: str) -> Any:
    """``XID_TABLE`` (every Xid this package knows, except 63 whose meaning depends on the
    row-remap state), ``BUCKETS`` and the three Xid 63 verdicts, loaded on first use."""
    if name not in _LAZY:  # e.g. the import system asking for __path__: load nothing
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cat = _catalog()
    values = (cat.table, cat.buckets, *cat.xid63)
    return values[_LAZY.index(name)]


# Xid 154's recovery actions (NVML's nvmlDeviceGpuRecoveryAction_t values).
_RECOVERY: Mapping[int, tuple[str, Severity, Action, str]] = {
    0: ("none", Severity.INFO, Action.RECORD, "no recovery action needed"),
    1: ("GPU reset", Severity.FAIL, Action.RESET, "reset the GPU (nvidia-smi -r)"),
    2: ("node reboot", Severity.CRITICAL, Action.RESET, "reboot the node"),
    3: ("drain P2P", Severity.FAIL, Action.DRAIN, "drain: peer-to-peer traffic is unsafe"),
    4: ("drain and reset", Severity.FAIL, Action.RESET, "drain, then reset the GPU"),
}


def classify(xid: int, remap_pending: bool | None = None) -> XidInfo:
    """Return what Xid ``xid`` means and what to do about it, from the catalog alone.

    ``remap_pending`` is NVML's row-remap "pending" flag for the GPU (``nvidia-smi -q -d
    ROW_REMAPPER``); it only matters for Xid 63. ``None`` means unknown.
    """
    cat = _catalog()
    if xid == 63:
        pending, done, unknown = cat.xid63
        return unknown if remap_pending is None else pending if remap_pending else done
    known = cat.table.get(xid)
    if known is not None:
        return known
    return XidInfo(
        xid=xid,
        name="unknown Xid",
        severity=Severity.WARN,
        action=Action.RECORD,
        hint=f"look up Xid {xid} in NVIDIA's Xid catalog ({CATALOG_URL})",
        basis="unknown",
    )


def judge(event: XidEvent, remap_pending: bool | None = None, driver: str | None = None) -> XidInfo:
    """:func:`classify`, overridden by the driver's own verdict on the line when present.

    ``D-RST: Yes`` drains and resets; ``RST: Yes`` or ``Uncontained:`` resets; a contained
    error the driver needs no reset for (``Contained: ... RST: No, D-RST: No``) warns and is
    recorded, never drained (a pending row remap is the row-remap check's to judge). Xid 154
    does the recovery action it names; Xid 45 points at the Xid that caused it. NVLink5 Xids
    144-150 go by their decoded status fields (``driver``: the driver version, which picks
    the encoding when the line does not tell).
    """
    info = classify(event.xid, remap_pending)
    if event.drain_reset_required:
        return _driver(info, Severity.CRITICAL, Action.RESET, _DRST_HINT)
    if event.reset_required or event.contained is False:
        return _driver(info, max(info.severity, Severity.FAIL), Action.RESET, _RST_HINT)
    if event.contained or (event.reset_required is False and event.drain_reset_required is False):
        return _driver(info, Severity.WARN, Action.RECORD, _CONTAINED_HINT)
    if 144 <= event.xid <= 150:
        from slurmhealth.checks.xid_nvlink5 import decode, verdict

        decoded = decode(event.xid, event.raw, driver)
        if decoded is not None:
            severity, action, hint = verdict(decoded)
            return dataclasses.replace(
                info, severity=severity, action=action, hint=hint, basis="decode"
            )
    recovery = _RECOVERY.get(-1 if event.recovery_action is None else event.recovery_action)
    if event.xid == 154 and recovery is not None:
        what, severity, action, hint = recovery
        return _driver(info, severity, action, f"the driver asks for {what}: {hint}")
    if event.xid == 45 and event.caused_by is not None:
        hint = f"caused by previous Xid {event.caused_by}: that Xid's finding decides"
        return dataclasses.replace(info, hint=hint)
    return info


def _driver(info: XidInfo, severity: Severity, action: Action, hint: str) -> XidInfo:
    return dataclasses.replace(info, severity=severity, action=action, hint=hint, basis="driver")


_DRST_HINT = "the driver asks to drain and reset (D-RST: Yes): drain, then reset the GPU"
_RST_HINT = (
    "the driver asks for a GPU reset (RST: Yes / uncontained): reset the GPU (nvidia-smi -r)"
)
_CONTAINED_HINT = (
    "contained by the driver (RST: No, D-RST: No): only the faulting application was "
    "affected; a pending row remap is applied at the next GPU reset (the row-remap check "
    "decides)"
)


def catalog_rows() -> dict[int, tuple[str, str]]:
    """``{xid: (mnemonic, immediate action)}`` for every row of the packaged catalog (what
    ``scripts/xid-catalog-diff`` compares with NVIDIA's published spreadsheet)."""
    return {x: (r.mnemonic, r.immediate) for x, r in _catalog().rows.items()}


def explain(xid: int) -> dict[str, Any]:
    """Everything slurmhealth knows about Xid ``xid``, for ``slurmhealth xid N``."""
    cat = _catalog()
    info = cat.rows.get(xid) or classify(xid)
    bucket = cat.buckets.get(info.immediate, {})
    out: dict[str, Any] = {
        "xid": xid,
        "known": xid in cat.rows,
        "name": info.name,
        "mnemonic": info.mnemonic or None,
        "immediate_action": info.immediate or None,
        "immediate_action_meaning": bucket.get("meaning"),
        "severity": info.severity.label,
        "action": info.action.value,
        "hint": info.hint,
        "source": info.source or None,
        "catalog": CATALOG_URL,
    }
    if 144 <= xid <= 150:
        out["decode"] = (
            "judged by the line's sub component and error status (the catalog's XID 144-150 "
            "Decode, intrInfo encoded as before or from driver R575): fatal rows reset the GPU, "
            "others are recorded; this row applies when the line carries no such fields"
        )
    if info.immediate == "UNBUCKETED":
        out["reason"] = (
            "NVIDIA's catalog lists this Xid without a resolution bucket yet, so slurmhealth "
            "records it as a warning and never drains for it"
        )
    if xid == 63:
        out["severity"] = "fail if a row remap is pending, info if not, warn if unknown"
        out["action"] = "drain if a row remap is pending, else record"
        out["hint"] = cat.xid63[0].hint
    out["driver_override"] = (
        "when the line carries the driver's verdict (Contained:/Uncontained:, RST:, D-RST:, "
        "Xid 154's recovery action), it overrides this table"
    )
    return out
