"""A check run's kernel-log read: from the newest stored position, kept twice.

The position lives in the history (a kv row) and in a root-owned state file beside it, so a
history that cannot be read (disk full, restored from a backup, moved) does not make old
faults new. Of the two the newest readable one counts. With neither, the position is rebuilt
from the end of the log: what the lookback window held is recorded, never acted on, so a
healthy node is not drained for a fault from before the position (nor at install time).

The file is rewritten when a read found a fault line, the stream changed, or it is an hour
behind: a position that lags only over quiet records is as good, and most runs save the
write and its fsync (~15 ms on a VM disk).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from slurmhealth.model import Action, Finding, Severity

if TYPE_CHECKING:
    from slurmhealth.checks import CheckContext
    from slurmhealth.kernel_log import KernelLogReader, ReadResult

log = logging.getLogger("slurmhealth.check")

KERNEL_CHECKS = ("xid", "kernel_log", "ib_kernel_log")
PREDATES = "logged before the kernel-log position was rebuilt: recorded, not acted on"


def _note(notes: list[str], text: str) -> None:
    log.warning("%s", text)
    notes.append(text)


def read_kernel_log(
    reader: KernelLogReader, stored: Any, db_path: str, notes: list[str]
) -> ReadResult:
    """Read the faults logged since the newest of ``stored`` (the history's copy of the
    position) and the state file beside ``db_path``; save the new position to the state file.
    Problems become ``notes`` (and log warnings); nothing here raises."""
    from slurmhealth.kernel_log.position import decode, load, newest, save, state_path, still_good

    path = state_path(db_path)
    in_file, problem = load(path) if path else (None, None)
    if problem:
        _note(notes, problem)
    in_db = decode(stored)
    if stored is not None and in_db is None:
        _note(notes, f"stored kernel-log position unreadable, ignored: {str(stored)[:80]!r}")

    def usable(p: dict[str, Any] | None) -> dict[str, Any] | None:  # another source's: none
        return p if p is not None and p["source"] == reader.kind else None

    res = reader.read_new(newest(usable(in_db), usable(in_file)), time.time())
    if res.rebuilt and res.available:
        old = len(res.old_events) + len(res.old_kernel_events)
        _note(notes, f"kernel-log position rebuilt from the end of the log; {old} earlier "
                     "fault line(s) recorded, not acted on")  # fmt: skip
    found = res.events or res.kernel_events or res.old_events or res.old_kernel_events
    if path and res.available and not still_good(in_file, decode(res.cursor), not found):
        problem = save(path, res.cursor)
        if problem:
            _note(notes, problem)
    return res


def predating_findings(
    ctx: CheckContext,
    res: ReadResult,
    settings: Mapping[str, Mapping[str, float]],
    disabled: Iterable[str],
) -> list[Finding]:
    """The kernel-log checks' findings on the faults logged before a rebuilt position, as
    records: at most a warning, never an action, the message saying why."""
    if not (res.old_events or res.old_kernel_events):
        return []
    from slurmhealth.checks import catalog, run_checks

    old = dataclasses.replace(ctx, xids=res.old_events, kernel_events=res.old_kernel_events)
    others = set(catalog()) - set(KERNEL_CHECKS)
    return [
        dataclasses.replace(
            f,
            severity=min(f.severity, Severity.WARN),
            action=Action.RECORD,
            message=f"{f.message} ({PREDATES})",
            evidence={**f.evidence, "predates_position": True},
        )
        for f in run_checks(old, settings, {*disabled, *others})
    ]
