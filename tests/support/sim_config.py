"""The configuration of a simulated node whose hooks run in a test directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def hook_flags(root: Path, scenario: str | Path) -> dict[str, Any]:
    """Config flags for hooks on the simulated GPUs of ``scenario``, with the history,
    evidence and kernel log under ``root``, no sidecar, and no real cluster touched."""
    missing = str(root / "absent")
    return {
        "node.name": "n1",
        "gpu.backend": "sim",  # the epilog's evidence capture opens its own backend
        "gpu.sim_scenario": str(scenario),
        "gpu.sim_kernel_log": str(root / "kmsg"),
        "paths.db": str(root / "history.db"),
        "paths.evidence_dir": str(root / "evidence"),
        "paths.run_dir": str(root / "run"),
        "sidecar.enabled": False,
        "evidence.scontrol": missing,  # never the machine's real cluster
        "evidence.nvidia_smi": missing,
        "evidence.py_spy": missing,
        "evidence.budget_s": 1.0,
    }
