"""Operator commands around drains: resume a node, and the per-node overview."""

from __future__ import annotations

import getpass
import os
import time
from dataclasses import dataclass
from typing import Any

from slurmhealth.config import Config
from slurmhealth.errors import UsageError
from slurmhealth.slurm import open_slurm


@dataclass(frozen=True)
class ResumeOutcome:
    exit_code: int
    message: str


def _actor() -> str:
    return os.environ.get("SUDO_USER") or getpass.getuser()


def resume_node(cfg: Config, node: str, reason: str, *, force: bool = False) -> ResumeOutcome:
    """Resume ``node`` if its current reason is slurmhealth's; someone else's needs --force.
    Every resume (and every refusal) is recorded in the node's history."""
    from slurmhealth.store import Batch, History

    slurm = open_slurm(cfg.slurm.backend, cfg.slurm.command_timeout_s)
    info = next((n for n in slurm.nodes() if n.name == node), None)
    if info is None:
        raise UsageError(f"no node named {node!r} in this cluster")
    if not info.drained:
        return ResumeOutcome(1, f"{node} is not drained (state {info.state}); nothing to do")
    refused = not info.ours and not force
    if not refused:
        slurm.resume(node)
    history = History(cfg.db_path(node), spool_path=cfg.spool_path(node) or None)
    history.write(
        Batch(
            inserts=[
                (
                    "drains",
                    {
                        "ts": time.time(),
                        "node": node,
                        "state": "resume_refused" if refused else "resumed",
                        "reason": reason,
                        "actor": _actor(),
                        "detail": {
                            "previous_reason": info.reason,
                            "previous_by": info.reason_user,
                            "forced": force and not info.ours,
                        },
                    },
                )
            ]
        )
    )
    history.close()
    if refused:
        who = f" by {info.reason_user}" if info.reason_user else ""
        return ResumeOutcome(
            1,
            f"{node} was drained{who} with reason {info.reason!r}, not by slurmhealth; "
            "left drained (use --force to resume it anyway)",
        )
    return ResumeOutcome(0, f"{node} resumed (was: {info.reason!r})")


def node_overview(cfg: Config) -> list[dict[str, Any]]:
    """Slurm's view of every node next to the last check in that node's history."""
    from slurmhealth.store import History

    slurm = open_slurm(cfg.slurm.backend, cfg.slurm.command_timeout_s)
    rows = []
    for n in sorted(slurm.nodes(), key=lambda n: n.name):
        row: dict[str, Any] = {
            "node": n.name,
            "state": n.state,
            "reason": n.reason,
            "reason_by": n.reason_user,
            "last_check_ts": None,
            "last_phase": None,
            "last_status": None,
            "worst_finding": None,
        }
        path = cfg.db_path(n.name)
        if ("{node}" in cfg.paths.db or n.name == cfg.node_name) and os.path.exists(path):
            with History(path) as db:
                last = db.runs(node=n.name, limit=1)
            if last:
                run = last[0]
                worst = run["findings"][0] if run["findings"] else None
                row.update(
                    last_check_ts=run["ts"],
                    last_phase=run["phase"],
                    last_status=run["status"],
                    worst_finding=None
                    if worst is None
                    else f"{worst['check_name']}: {worst['message']}",
                )
        rows.append(row)
    return rows
