"""What every Slurm backend shares: the interface, its records, its error, the reason rules.

Both backends (``slurm.SlurmCli`` over the command-line tools, ``slurm_pyslurm``) import
this module; ``slurm.open_slurm`` picks one. Everyone else imports these names from
``slurmhealth.slurm``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from slurmhealth.errors import SlurmhealthError

REASON_PREFIX = "slurmhealth:"
MAX_REASON = 200


class SlurmError(SlurmhealthError):
    """A Slurm command failed or could not be run."""


@dataclass(frozen=True)
class NodeInfo:
    """One node as ``sinfo -N`` shows it. ``state`` is Slurm's long form, lower case
    (``idle``, ``mixed``, ``drained``, ``draining``, ``down*``, ...)."""

    name: str
    state: str
    reason: str = ""
    reason_user: str = ""
    reason_time: float | None = None  # UTC seconds

    @property
    def drained(self) -> bool:
        """Drained or draining: no new jobs."""
        return "drain" in self.state

    @property
    def ours(self) -> bool:
        """The current reason was set by slurmhealth."""
        return self.reason.startswith(REASON_PREFIX)


@dataclass(frozen=True)
class JobInfo:
    """What the prolog does not get in its environment on older Slurm (``squeue -j``)."""

    job_id: str
    user: str = ""
    account: str = ""
    partition: str = ""
    qos: str = ""
    priority: int | None = None
    nodes: str = ""
    state: str = ""
    comment: str = ""


class SlurmBackend(Protocol):
    def nodes(self) -> list[NodeInfo]: ...

    def drain(self, node: str, reason: str) -> None: ...

    def resume(self, node: str) -> None: ...

    def job(self, job_id: str) -> JobInfo | None: ...

    def show_job(self, job_id: str) -> dict[str, str]: ...

    def with_timeout(self, timeout_s: float) -> SlurmBackend:
        """This backend with each call bounded by ``timeout_s`` (the prolog's budget)."""
        ...


def clean_reason(text: str) -> str:
    """One line, no control characters, short enough for ``sinfo -R``."""
    flat = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return flat if len(flat) <= MAX_REASON else flat[: MAX_REASON - 3] + "..."
