"""Optional pyslurm backend behind :class:`slurmhealth.slurm.base.SlurmBackend`.

pyslurm links against one Slurm release (PyPI carries it for Slurm 25.11); it is used only
when it imports and its version matches the running Slurm (``scontrol --version``).
The scontrol/squeue/sinfo backend is the default and the one tested on the local cluster.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from slurmhealth.slurm.base import Job, NodeInfo, SlurmError, clean_reason


def _slurm_version() -> str | None:
    exe = shutil.which("scontrol")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.split()[-1] if out.split() else None  # "slurm 22.05.8" / "slurm-wlm 22.05.8"


def unavailable() -> str | None:
    """Why the pyslurm backend cannot be used here, or None when it can."""
    try:
        import pyslurm
    except ImportError as exc:
        return f"pyslurm is not installed ({exc})"
    except Exception as exc:  # a pyslurm built for another libslurm fails on import
        return f"pyslurm does not load ({type(exc).__name__}: {exc})"
    theirs = str(getattr(pyslurm, "__version__", ""))
    ours = _slurm_version()
    if not ours or ".".join(theirs.split(".")[:2]) != ".".join(ours.split(".")[:2]):
        return f"pyslurm {theirs or '?'} does not match the running Slurm {ours or '?'}"
    return None


class PySlurmBackend:
    """Node and job access through pyslurm's object API (``Nodes.load``, ``Node.modify``)."""

    def __init__(self) -> None:
        import pyslurm

        self._ps: Any = pyslurm

    def with_timeout(self, timeout_s: float) -> PySlurmBackend:
        """pyslurm calls run in this process and cannot be cut short: the same backend
        (the prolog's budget still skips calls once it is spent)."""
        return self

    def nodes(self) -> list[NodeInfo]:
        try:
            loaded = self._ps.Nodes.load()
        except Exception as exc:
            raise SlurmError(f"pyslurm Nodes.load failed: {exc}") from None
        out = []
        for name, node in dict(loaded).items():
            reason = str(getattr(node, "reason", "") or "")
            when = getattr(node, "reason_time", None)
            out.append(
                NodeInfo(
                    name=str(name),
                    state=str(getattr(node, "state", "")).lower().replace("_", "+"),
                    reason=reason,
                    reason_user=str(getattr(node, "reason_user", "") or ""),
                    reason_time=float(when) if isinstance(when, int | float) and reason else None,
                )
            )
        return out

    def _modify(self, node: str, **changes: str) -> None:
        try:
            self._ps.Node(node).modify(self._ps.Node(**changes))
        except Exception as exc:
            raise SlurmError(f"pyslurm Node.modify({node}) failed: {exc}") from None

    def drain(self, node: str, reason: str) -> None:
        self._modify(node, state="DRAIN", reason=clean_reason(reason))

    def resume(self, node: str) -> None:
        self._modify(node, state="RESUME")

    def show_job(self, job_id: str) -> dict[str, str]:
        """The few ``scontrol show job`` fields slurmhealth reads (output paths)."""
        try:
            job = self._ps.Job.load(int(job_id))
        except Exception:
            return {}
        return {
            "StdOut": str(getattr(job, "standard_output", "") or ""),
            "StdErr": str(getattr(job, "standard_error", "") or ""),
        }

    def job(self, job_id: str) -> Job | None:
        try:
            job = self._ps.Job.load(int(job_id))
        except Exception:
            return None
        prio = getattr(job, "priority", None)
        return Job(
            job_id=job_id,
            user=str(getattr(job, "user_name", "") or ""),
            account=str(getattr(job, "account", "") or ""),
            partition=str(getattr(job, "partition", "") or ""),
            qos=str(getattr(job, "qos", "") or ""),
            priority=int(prio) if isinstance(prio, int) else None,
            nodes=str(getattr(job, "nodes", "") or ""),
            state=str(getattr(job, "state", "") or "").lower(),
            comment=str(getattr(job, "comment", "") or ""),
        )
