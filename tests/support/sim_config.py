"""The configuration of a simulated node whose hooks run in a test directory."""

from __future__ import annotations

import os
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


def sidecar_config(
    tmp: Path, scenario: str, *, db: str = "db/history.db", extra: str = "", **sidecar: object
) -> Path:
    """``tmp/config.toml`` for real ``slurmhealth sidecar`` processes on the simulated GPUs
    of ``scenario`` (written to ``tmp/scenario.toml``): the history at ``tmp/db``, the run
    dir and kernel log under ``tmp``, a 1 s interval and no job checks unless ``sidecar``
    (more ``[sidecar]`` keys, values as TOML text) says otherwise; ``extra`` is appended
    (more sections)."""
    (tmp / "scenario.toml").write_text(scenario)
    keys = {"interval_s": 1.0, "job_check_interval_s": 100000, **sidecar}
    lines = "".join(f"{k} = {v}\n" for k, v in keys.items())
    path = tmp / "config.toml"
    path.write_text(
        f"""
[gpu]
backend = "sim"
sim_scenario = "{tmp}/scenario.toml"
sim_kernel_log = "{tmp}/kmsg"
[paths]
db = "{tmp}/{db}"
run_dir = "{tmp}/run"
[sidecar]
{lines}{extra}"""
    )
    return path


def sidecar_env(config: Path, **more: str) -> dict[str, str]:
    """The environment of a sidecar started by hand on node1 with ``config``: none of this
    process's Slurm or slurmhealth settings, plus ``more``."""
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SLURMHEALTH"))}
    return {**keep, "SLURMHEALTH_CONFIG": str(config), "SLURMD_NODENAME": "node1", **more}
