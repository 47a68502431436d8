"""Which repair a node's faults call for: the remediation policy, read from
``remediation.toml`` (pure data, beside the Xid catalog).

:func:`plan` takes the findings that took a node out (as its drain recorded them) and says
what to try first: reset some GPUs, or reboot the node, or nothing (a fault that needs
hands). The orchestration (``hooks/remediate.py``) escalates from there: a reset that fails
or a fault that returns becomes a reboot, and too many attempts become "service required".
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurmhealth.checks.packaged import packaged_text

STEPS = ("reset", "reboot", "none")


@dataclass(frozen=True)
class Plan:
    """``step``: reset | reboot | none; ``gpus`` to reset; ``fault`` one line naming it;
    ``why`` when the step is none."""

    step: str
    gpus: tuple[int, ...] = ()
    fault: str = ""
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "gpus": list(self.gpus), "fault": self.fault, "why": self.why}


@functools.cache
def policy() -> Mapping[str, Mapping[str, str]]:
    """The packaged table: ``check`` -> step, ``xid_immediate`` -> step."""
    text = packaged_text("remediation.toml")
    data = tomllib.loads(text)
    for section in ("check", "xid_immediate"):
        bad = {k: v for k, v in data.get(section, {}).items() if v not in STEPS}
        if bad:
            raise ValueError(f"remediation.toml [{section}]: unknown step(s) {bad}")
    return {s: dict(data.get(s, {})) for s in ("check", "xid_immediate")}


def first_step(finding: Mapping[str, Any]) -> str:
    """The step for one finding as a record (``Finding.to_dict()``): reset | reboot | none."""
    if finding.get("action") != "reset":
        return "none"
    table = policy()
    check = str(finding.get("check") or finding.get("check_name") or "")
    if check == "xid":
        evidence = finding.get("evidence") or {}
        xid = evidence.get("xid") if isinstance(evidence, Mapping) else None
        immediate = _immediate(xid)
        return table["xid_immediate"].get(immediate, "none") if immediate else "none"
    return table["check"].get(check, "none")


def _immediate(xid: Any) -> str:
    from slurmhealth.checks.xid_table import classify

    try:
        return classify(int(xid)).immediate
    except (TypeError, ValueError):
        return ""


def describe(finding: Mapping[str, Any]) -> str:
    check = str(finding.get("check") or finding.get("check_name") or "?")
    gpu = finding.get("gpu")
    where = f" gpu{gpu}" if gpu is not None else ""
    return f"{check}{where} {finding.get('message', '')}".strip()


def plan(findings: Sequence[Mapping[str, Any]]) -> Plan:
    """What to try first for the failing findings that took the node out. Any finding
    without an automatic repair stops it (none); a reset needs a GPU to reset (a node-wide
    finding with step reset is a reboot); a reboot step anywhere makes the plan a reboot."""
    acting = [f for f in findings if f.get("action") in ("drain", "reset")]
    if not acting:
        return Plan("none", why="no recorded fault to repair")
    fault = describe(acting[0]) + (f" (+{len(acting) - 1} more)" if len(acting) > 1 else "")
    steps = [(first_step(f), f) for f in acting]
    stuck = [f for s, f in steps if s == "none"]
    if stuck:
        return Plan("none", fault=fault, why=f"needs hands: {describe(stuck[0])}")
    if any(s == "reboot" or f.get("gpu") is None for s, f in steps):
        return Plan("reboot", fault=fault)
    return Plan("reset", tuple(sorted({int(f["gpu"]) for _, f in steps})), fault)
