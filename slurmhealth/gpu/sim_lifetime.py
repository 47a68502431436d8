"""Fault lifetimes in the simulator: GPU resets and node reboots, shared by every process.

A scenario fault may say ``clears_on = "reset" | "reboot" | "never"`` (docs/scenarios.md).
What happened to a simulated node (GPU ``i`` reset at time T, the node rebooted at time T)
is kept in one small JSON file beside the node's simulated kernel log
(``<kernel log>.lifetime.json``), so the process that resets a GPU, the one that validates
it a moment later and the RebootProgram that "reboots" the node all see one history:

- a reset of GPU ``i`` clears the faults on ``i`` with ``clears_on = "reset"`` that began
  before it; it fails (as ``nvidia-smi --gpu-reset`` does on a GPU a reset cannot bring
  back) when a fault on ``i`` that clears only on a reboot, or never, is active;
- a reboot clears every ``reset`` and ``reboot`` fault that began before it;
- ``never`` faults stay, and faults without ``clears_on`` keep their time window only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurmhealth.gpu.scenario import Fault


@dataclass(frozen=True)
class Lifetime:
    """When each GPU was last reset and the node last rebooted (UTC seconds)."""

    resets: Mapping[int, float] = field(default_factory=dict)
    reboot: float = 0.0

    def cleared(self, fault: Fault, index: int, started: float) -> bool:
        """Whether ``fault`` (begun at ``started``) no longer shows on GPU ``index``."""
        if fault.clears_on in ("reset", "reboot") and self.reboot >= started:
            return True
        return fault.clears_on == "reset" and self.resets.get(index, 0.0) >= started


def lifetime_path(kernel_log_path: str) -> str:
    return kernel_log_path + ".lifetime.json"


def read_lifetime(kernel_log_path: str) -> Lifetime:
    """The node's resets and reboot; nothing recorded (or an unreadable file): none."""
    try:
        with open(lifetime_path(kernel_log_path), encoding="utf-8") as fh:
            doc = json.load(fh)
        resets = {int(k): float(v) for k, v in dict(doc.get("resets", {})).items()}
        return Lifetime(resets, float(doc.get("reboot", 0.0)))
    except (OSError, ValueError, TypeError, AttributeError):
        return Lifetime()


def _write(kernel_log_path: str, doc: Mapping[str, Any]) -> None:
    path = lifetime_path(kernel_log_path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh)
    os.replace(tmp, path)


def record_resets(kernel_log_path: str, indices: Sequence[int], when: float) -> None:
    now = read_lifetime(kernel_log_path)
    resets = {**now.resets, **{i: when for i in indices}}
    _write(kernel_log_path, {"resets": {str(k): v for k, v in resets.items()},
                             "reboot": now.reboot})  # fmt: skip


def record_reboot(kernel_log_path: str, when: float) -> None:
    """The node rebooted at ``when``: every GPU came back as after a power cycle."""
    _write(kernel_log_path, {"resets": {}, "reboot": when})
