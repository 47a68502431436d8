"""Slurm accounting (slurmdbd) as read from a login node: one job's record (``sacct``), the
nodes' drain events (``sacctmgr show event``) and the job summary slurmhealth keeps in the
job's ``AdminComment``. The command lines are in ``slurm.py``; this module parses what they
print.

One format for Slurm 22.05 through 24.11: ``sacct -P`` / ``sacctmgr -P`` (fields separated
by ``|``, the free-text field last) with ``SLURM_TIME_FORMAT=%s`` (times as UTC seconds).
``sacct --json`` exists on both but its schema differs between them (22.05's data_parser
0.0.38 prints ``state.current`` as a string and ``time.limit`` as minutes, 24.11's 0.0.42 as
a list and a ``{set, infinite, number}`` object), so the parsable text is the stable one.

Parsed defensively: a record of another shape is skipped, never an error; values are
bounded (a hostlist of at most ``MAX_HOSTS`` names, text fields cut).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from slurmhealth.slurm.base import HostlistError, Job, expand_hostlist, null

SACCT_FIELDS = (
    "JobIDRaw",
    "User",
    "Account",
    "Partition",
    "QOS",
    "NodeList",
    "State",
    "ExitCode",
    "Start",
    "End",
    "TimelimitRaw",
    "AllocTRES",
    "AdminComment",  # last: free text, may hold "|"
)
EVENT_FIELDS = ("NodeName", "TimeStart", "TimeEnd", "State", "User", "Reason")
MAX_TEXT = 8192  # an AdminComment longer than this is not ours
_WORD = re.compile(r"[A-Za-z_]+")
_EXIT = re.compile(r"[0-9]{1,3}:[0-9]{1,3}")
_GPUS = re.compile(r"(?:^|,)gres/gpu(?::[^=,]*)?=([0-9]{1,6})(?:,|$)")


@dataclass(frozen=True)
class NodeEvent:
    """A node state change slurmdbd recorded (a drain, a down), with its reason."""

    node: str
    start_ts: float | None
    end_ts: float | None  # None: still in that state
    state: str
    user: str
    reason: str


def _ts(text: str) -> float | None:
    text = null(text)
    if not text.isascii() or not text.isdigit() or len(text) > 12 or text == "0":
        return None  # Unknown, None, a date in another format
    return float(text)


def _minutes(text: str) -> float | None:
    text = null(text)
    return float(text) * 60 if text.isascii() and text.isdigit() and len(text) <= 9 else None


def _nodes(text: str) -> tuple[str, ...]:
    text = null(text)
    if not text or text in ("None assigned", "None"):
        return ()
    try:
        return expand_hostlist(text)
    except HostlistError:
        return ()


def _short(text: str, cap: int = 256) -> str:
    return "".join(ch for ch in null(text) if ch.isprintable())[:cap]


def parse_sacct(job_id: str, out: str) -> Job | None:
    """``sacct -j ID -X -P -n -o SACCT_FIELDS`` output as the job's record; the last line of
    that job id wins (a requeued job's latest run); None when no line has that shape."""
    found = None
    for line in out.splitlines():
        parts = line.split("|", len(SACCT_FIELDS) - 1)
        if len(parts) != len(SACCT_FIELDS) or null(parts[0]) != job_id:
            continue
        _, user, account, part, qos, nodes, state, code, start, end, limit, tres, comment = parts
        words = _WORD.findall(state)
        gpus = _GPUS.search(null(tres))
        found = Job(
            job_id=job_id,
            user=_short(user, 64),
            account=_short(account, 64),
            partition=_short(part, 64),
            qos=_short(qos, 64),
            nodes=_short(nodes, 4096),
            node_names=_nodes(nodes),
            state=words[0].lower() if words else "",
            exit_code=code.strip() if _EXIT.fullmatch(code.strip()) else None,
            start_ts=_ts(start),
            end_ts=_ts(end),
            time_limit_s=_minutes(limit),
            gpu_count=int(gpus.group(1)) if gpus else None,
            admin_comment=comment.strip() if len(comment) <= MAX_TEXT else "",
        )
    return found


def parse_events(out: str, nodes: tuple[str, ...] = ()) -> list[NodeEvent]:
    """``sacctmgr -n -P show event ... format=EVENT_FIELDS`` output, oldest first; only
    ``nodes`` when given (a cluster-wide event has no node name and is skipped)."""
    events = []
    for line in out.splitlines():
        parts = line.split("|", len(EVENT_FIELDS) - 1)
        if len(parts) != len(EVENT_FIELDS):
            continue
        node, start, end, state, user, reason = parts
        node = null(node)
        if not node or (nodes and node not in nodes):
            continue
        events.append(NodeEvent(node, _ts(start), _ts(end), _short(state, 32).lower(),
                                _short(user, 64), _short(reason)))  # fmt: skip
    return sorted(events, key=lambda e: (e.start_ts or 0.0, e.node))
