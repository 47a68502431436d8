"""Operator commands around drains: resume a node, and the per-node overview."""

from __future__ import annotations

import getpass
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slurmhealth.config import Config
from slurmhealth.errors import UsageError
from slurmhealth.slurm import NodeInfo, SlurmBackend, open_slurm

if TYPE_CHECKING:
    from slurmhealth.history import History


@dataclass(frozen=True)
class ResumeOutcome:
    exit_code: int
    message: str


def _actor() -> str:
    return os.environ.get("SUDO_USER") or getpass.getuser()


def drained_since(reason_time: float | None, drains: Iterable[Mapping[str, Any]]) -> float | None:
    """When the node's current drain began: Slurm's reason time, else the latest ``drained``
    row of its history; None when neither is known."""
    if reason_time:
        return reason_time
    times = [float(d["ts"]) for d in drains if d.get("state") == "drained" and d.get("ts")]
    return max(times, default=None)


def passing_validation(
    runs: Iterable[Mapping[str, Any]], since: float | None
) -> Mapping[str, Any] | None:
    """The latest ``validate`` run after ``since`` (any time when None) if it passed (status
    ok); None when there is none or the latest one did not pass."""
    after = [
        r for r in runs
        if r.get("phase") == "validate" and r.get("ts") is not None
        and (since is None or float(r["ts"]) > since)
    ]  # fmt: skip
    if not after:
        return None
    last = max(after, key=lambda r: float(r["ts"]))
    return last if last.get("status") == "ok" else None


def _validated(cfg: Config, node: str, reason_time: float | None) -> bool:
    from slurmhealth.history import StoreError
    from slurmhealth.history.read import Reader, check_runs, drain_rows

    path = cfg.db_path(node)
    if not os.path.exists(path):
        return False
    try:
        with Reader(path) as db:  # an operator reads: never creates nor fixes files
            since = drained_since(reason_time, drain_rows(db, node=node, state="drained"))
            runs = check_runs(db, node=node, phase="validate", limit=50)
    except StoreError:
        return False
    return passing_validation(runs, since) is not None


def resume_node(cfg: Config, node: str, reason: str, *, force: bool = False) -> ResumeOutcome:
    """:func:`resume` over the configured Slurm backend and ``node``'s history."""
    from slurmhealth.history import History

    slurm = open_slurm(cfg.slurm.backend, cfg.slurm.command_timeout_s)
    with History.for_node(cfg, node) as history:
        history.refuse_newer()
        return resume(cfg, slurm, history, node, reason, force=force)


def resume(
    cfg: Config,
    slurm: SlurmBackend,
    history: History,
    node: str,
    reason: str,
    *,
    force: bool = False,
) -> ResumeOutcome:
    """Resume ``node`` if its current reason is slurmhealth's; someone else's needs --force.
    Every resume (and every refusal) is recorded in ``history``."""
    from slurmhealth.history import records, rows

    info = next((n for n in slurm.nodes() if n.name == node), None)
    if info is None:
        raise UsageError(f"no node named {node!r} in this cluster")
    if not info.drained:
        return ResumeOutcome(1, f"{node} is not drained (state {info.state}); nothing to do")
    unvalidated = info.ours and not _validated(cfg, node, info.reason_time)
    refused = (not info.ours or unvalidated) and not force
    forced = force and (not info.ours or unvalidated)
    if not refused:
        slurm.resume(node)
    detail = {
        "previous_reason": info.reason,
        "previous_by": info.reason_user,
        "forced": forced,
        "validated": info.ours and not unvalidated,
    }
    state = "resume_refused" if refused else "resumed"
    row = rows.drain_row(time.time(), node, state, reason, _actor(), detail)
    history.write(records.batch([records.drain(row)]))
    return _outcome(info, refused=refused, forced=forced)


def _outcome(info: NodeInfo, *, refused: bool, forced: bool) -> ResumeOutcome:
    node = info.name
    if refused and info.ours:
        return ResumeOutcome(
            1,
            f"{node} was drained by slurmhealth ({info.reason!r}) and has no passing validation "
            f"since; left drained. Run `slurmhealth validate --node {node}` on {node}, then "
            "resume again (or use --force to resume it without validation)",
        )
    if refused:
        who = f" by {info.reason_user}" if info.reason_user else ""
        return ResumeOutcome(
            1,
            f"{node} was drained{who} with reason {info.reason!r}, not by slurmhealth; "
            "left drained (use --force to resume it anyway)",
        )
    if forced:
        why = "without a passing validation" if info.ours else "over a reason not set by us"
        return ResumeOutcome(0, f"{node} resumed, forced {why} (was: {info.reason!r})")
    return ResumeOutcome(0, f"{node} resumed (was: {info.reason!r})")


def node_overview(cfg: Config) -> list[dict[str, Any]]:
    """:func:`overview` over the configured Slurm backend."""
    return overview(cfg, open_slurm(cfg.slurm.backend, cfg.slurm.command_timeout_s))


def overview(cfg: Config, slurm: SlurmBackend) -> list[dict[str, Any]]:
    """Slurm's view of every node next to the last check in that node's history."""
    from slurmhealth.history.read import Reader, remediation_rows, runs

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
            "remediation": None,
        }
        path = cfg.db_path(n.name)
        if ("{node}" in cfg.paths.db or n.name == cfg.node_name) and os.path.exists(path):
            with Reader(path) as db:
                last = runs(db, node=n.name, limit=1)
                steps = remediation_rows(db, node=n.name, limit=1)
            if steps:
                s = steps[0]
                row["remediation"] = {k: s[k] for k in ("action", "outcome", "started", "fault")}
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
