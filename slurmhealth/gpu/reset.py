"""GPU reset and ``nvidia-bug-report.sh``: the GPU layer's two repair-side tools.

A reset is ``nvidia-smi --gpu-reset -i N`` (NVML has no public reset call). nvidia-smi
refuses while anything holds the GPU (processes, nvidia-persistenced, a monitoring agent),
and on HGX systems with NVSwitches the GPUs of one baseboard reset together (nvidia-smi
without ``-i``), after which the fabric manager re-trains the NVLinks. So the preconditions
are checked first, from a snapshot taken just before (:func:`preconditions`): no process on
a GPU to reset; on an NVSwitch system every GPU of the node is reset at once. What
nvidia-smi printed is kept in the result, for the history.

The simulator stands in through the same interface (:class:`SimReset`): its scenario's fault
lifetimes (``clears_on``, ``gpu/sim_lifetime.py``) decide whether the reset helps.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from slurmhealth.model import NodeSnapshot

if TYPE_CHECKING:
    from slurmhealth.config import Config
    from slurmhealth.gpu.sim import SimulatedNvml

RESET_TIMEOUT_S = 120.0
BUG_REPORT_TIMEOUT_S = 300.0
_FABRIC_ON = ("not_started", "in_progress", "completed")


@dataclass(frozen=True)
class ResetResult:
    """One reset: ``ok`` when every GPU asked came back; ``refused`` when a precondition
    failed (nothing was reset); the command run and its output; notes on the system."""

    ok: bool
    gpus: tuple[int, ...]
    command: str = ""
    output: str = ""
    refused: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "gpus": list(self.gpus), "command": self.command,
                "output": self.output[-4000:], "refused": self.refused,
                "notes": list(self.notes)}  # fmt: skip


class GpuReset(Protocol):
    def reset(self, indices: Sequence[int], snapshot: NodeSnapshot) -> ResetResult: ...


def preconditions(
    snapshot: NodeSnapshot, indices: Sequence[int]
) -> tuple[tuple[int, ...], str, tuple[str, ...]]:
    """(the GPUs to reset, why not ("" when allowed), notes). An NVSwitch system (fabric
    state reported) resets the whole baseboard: every GPU, each must be free."""
    notes: list[str] = []
    gpus = tuple(sorted(set(indices)))
    if any(g.fabric_state in _FABRIC_ON for g in snapshot.gpus):
        gpus = tuple(g.index for g in snapshot.gpus)
        notes.append(
            "NVSwitch system (HGX): the GPUs of the baseboard reset together; the fabric "
            "manager must be running to re-train the NVLinks afterwards"
        )
    if any(g.persistence_mode for g in snapshot.gpus if g.index in gpus):
        notes.append("persistence mode is on: stop nvidia-persistenced if nvidia-smi reports "
                     "the GPU in use")  # fmt: skip
    busy = [f"GPU {g.index} (pids {', '.join(str(p.pid) for p in g.processes)})"
            for g in snapshot.gpus if g.index in gpus and g.processes]  # fmt: skip
    if busy:
        return gpus, f"processes still use {'; '.join(busy)}", tuple(notes)
    return gpus, "", tuple(notes)


class NvidiaSmiReset:
    """``nvidia-smi --gpu-reset``: one GPU at a time, or the whole baseboard at once."""

    def __init__(self, timeout_s: float = RESET_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s

    def reset(self, indices: Sequence[int], snapshot: NodeSnapshot) -> ResetResult:
        gpus, refused, notes = preconditions(snapshot, indices)
        if refused:
            return ResetResult(False, gpus, refused=refused, notes=notes)
        whole = len(gpus) == len(snapshot.gpus) and len(gpus) > 1
        calls = [["nvidia-smi", "--gpu-reset"]] if whole else [
            ["nvidia-smi", "--gpu-reset", "-i", str(i)] for i in gpus
        ]  # fmt: skip
        out, ok = [], True
        for argv in calls:
            code, text = _run(argv, self.timeout_s)
            out.append(f"$ {' '.join(argv)}\n{text}".rstrip())
            ok = ok and code == 0
        return ResetResult(ok, gpus, " ; ".join(" ".join(a) for a in calls), "\n".join(out),
                           notes=notes)  # fmt: skip


class SimReset:
    """The simulator's reset, behind the same interface as nvidia-smi's."""

    def __init__(self, lib: SimulatedNvml) -> None:
        self.lib = lib

    def reset(self, indices: Sequence[int], snapshot: NodeSnapshot) -> ResetResult:
        gpus, refused, notes = preconditions(snapshot, indices)
        if refused:
            return ResetResult(False, gpus, refused=refused, notes=notes)
        ok, output = self.lib.simulate_reset(list(gpus))
        command = f"nvidia-smi --gpu-reset -i {','.join(map(str, gpus))} (simulated)"
        return ResetResult(ok, gpus, command, output, notes=notes)


def open_reset(cfg: Config) -> GpuReset:
    """The configured backend's reset: the simulator's, or nvidia-smi's."""
    if cfg.gpu.backend != "sim":
        return NvidiaSmiReset()
    from slurmhealth.gpu import open_library
    from slurmhealth.gpu.sim import SimulatedNvml

    lib, _clock = open_library(cfg)
    if not isinstance(lib, SimulatedNvml):  # a replayed recording cannot be reset
        return NvidiaSmiReset()
    return SimReset(lib)


def record_sim_reboot(cfg: Config, when: float | None = None) -> str:
    """The simulated node rebooted now (the local cluster's RebootProgram): its GPUs come
    back without their ``reset``/``reboot`` faults. Returns the file written."""
    from slurmhealth.gpu import sim_kernel_log_path
    from slurmhealth.gpu.sim_lifetime import lifetime_path, record_reboot

    path = sim_kernel_log_path(cfg)
    record_reboot(path, time.time() if when is None else when)
    return lifetime_path(path)


def bug_report(folder: str, timeout_s: float = BUG_REPORT_TIMEOUT_S) -> dict[str, Any]:
    """Run ``nvidia-bug-report.sh --output-file FOLDER/nvidia-bug-report.log`` where it is
    installed, bounded by ``timeout_s``; what happened, for the incident."""
    exe = shutil.which("nvidia-bug-report.sh")
    if exe is None:
        return {"status": "skipped", "why": "nvidia-bug-report.sh is not installed"}
    dest = os.path.join(folder, "nvidia-bug-report.log")
    code, text = _run([exe, "--output-file", dest], timeout_s)
    produced = [n for n in os.listdir(folder) if n.startswith("nvidia-bug-report")]
    return {"status": "ok" if code == 0 else "failed", "exit_code": code,
            "files": sorted(produced), "output": text[-2000:]}  # fmt: skip


def _run(argv: list[str], timeout_s: float) -> tuple[int, str]:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s,
                              check=False, stdin=subprocess.DEVNULL, errors="replace")  # fmt: skip
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]}: timed out after {timeout_s:g} s"
    return proc.returncode, (proc.stdout + proc.stderr).strip()
