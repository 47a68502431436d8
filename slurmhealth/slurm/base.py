"""What every Slurm backend shares: the interface, its records, its error, the reason rules.

Both backends (``slurm.SlurmCli`` over the command-line tools, ``slurm_pyslurm``) import
this module; ``slurm.open_slurm`` picks one. Everyone else imports these names from
``slurmhealth.slurm``.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Protocol

from slurmhealth.errors import SlurmhealthError, UsageError
from slurmhealth.model_records import Job as Job  # the one job record: the backends make it

REASON_PREFIX = "slurmhealth:"
MAX_REASON = 200
MAX_HOSTS = 65_536
"""The most names one hostlist may expand to (Slurm's own cap: 64K hosts); more is refused
before any name is built, so ``n[1-99999999999]`` costs nothing."""


class SlurmError(SlurmhealthError):
    """A Slurm command failed or could not be run."""


class HostlistError(UsageError):
    """A hostlist expression Slurm would not write, or one of more than ``MAX_HOSTS`` names."""


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


class SlurmBackend(Protocol):
    def nodes(self) -> list[NodeInfo]: ...

    def drain(self, node: str, reason: str) -> None: ...

    def resume(self, node: str) -> None: ...

    def job(self, job_id: str) -> Job | None: ...

    def show_job(self, job_id: str) -> dict[str, str]: ...

    def with_timeout(self, timeout_s: float) -> SlurmBackend:
        """This backend with each call bounded by ``timeout_s`` (the prolog's budget)."""
        ...


def clean_reason(text: str) -> str:
    """One line, no control characters, short enough for ``sinfo -R``."""
    flat = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return flat if len(flat) <= MAX_REASON else flat[: MAX_REASON - 3] + "..."


def null(value: str) -> str:
    """A field as Slurm prints it, stripped, with ``(null)`` (Slurm's "unset") made empty,
    so no record, report or metric label shows it."""
    text = value.strip()
    return "" if text == "(null)" else text


# a hostlist: expressions separated by commas or blanks; in one, literal runs and [idlist]s
_HOST_TOKEN = re.compile(r"\[([^\[\]]*)\]|([^\[\]\s,]+)|([\s,]+)|(.)", re.DOTALL)
_ID_RANGE = re.compile(r"([0-9]{1,18})(?:-([0-9]{1,18}))?")
_Part = str | list[tuple[int, int, int]]  # a literal, or an idlist's (lo, hi, width) ranges


def expand_hostlist(text: str, limit: int = MAX_HOSTS) -> tuple[str, ...]:
    """Slurm's hostlist expression as names, in order (``scontrol show hostnames``):
    ``n[1-3,7],login1`` -> n1 n2 n3 n7 login1; ``gpu[08-10]`` keeps the first number's
    zero padding; several bracket groups multiply, the first outermost
    (``rack[1-2]-n[1-3]`` -> rack1-n1 ... rack2-n3). Raises :class:`HostlistError` for
    unbalanced or nested brackets, an id that is not ``N`` or ``N-M`` (M >= N), or more than
    ``limit`` names, counted before any is built."""
    names: list[str] = []
    for parts in _expressions(text):
        if _count(parts, limit) > limit - len(names):
            raise HostlistError(f"hostlist {_short(text)}: more than {limit} names")
        names.extend("".join(p) for p in itertools.product(*(_ids(q) for q in parts)))
    return tuple(names)


def _expressions(text: str) -> list[list[_Part]]:
    out: list[list[_Part]] = [[]]
    for m in _HOST_TOKEN.finditer(text):
        idlist, literal, sep, stray = m.groups()
        if stray is not None:
            raise HostlistError(f"hostlist {_short(text)}: unbalanced or nested bracket")
        if sep is not None:
            out.append([])
        elif literal is not None:
            out[-1].append(literal)
        else:
            out[-1].append(_idlist(idlist, text))
    return [parts for parts in out if parts]


def _idlist(body: str, text: str) -> list[tuple[int, int, int]]:
    ranges = []
    for item in body.split(","):
        m = _ID_RANGE.fullmatch(item.strip())
        if m is None or (m[2] is not None and int(m[2]) < int(m[1])):
            raise HostlistError(f"hostlist {_short(text)}: {_short(item.strip())} is not N or N-M")
        ranges.append((int(m[1]), int(m[2] or m[1]), len(m[1])))
    return ranges


def _count(parts: list[_Part], limit: int) -> int:
    """How many names the expression stands for; stops counting past ``limit``."""
    n = 1
    for part in parts:
        if not isinstance(part, str):
            n *= sum(hi - lo + 1 for lo, hi, _ in part)
        if n > limit:
            break
    return n


def _ids(part: _Part) -> list[str]:
    if isinstance(part, str):
        return [part]
    return [f"{i:0{width}d}" for lo, hi, width in part for i in range(lo, hi + 1)]


def _short(text: str) -> str:
    flat = clean_reason(text)
    return repr(flat if len(flat) <= 60 else flat[:57] + "...")
