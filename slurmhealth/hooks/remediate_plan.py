"""Remediation across the fleet: which nodes it may touch, how many at once, what it would
do (``slurmhealth remediate --dry-run``), and the "service required" incident.

Slurm is the one shared state: a node in remediation carries a reason of ours that says so
(``slurmhealth: remediating: ...`` while its GPUs are reset and validated, ``slurmhealth:
rebooting: ...`` while ``scontrol reboot`` runs), so every node counts the others the same
way the drain's circuit breaker does (``hooks/drain.py``): claim, re-read, and the later
claim over the limit gives way. The limit is ``max_concurrent`` nodes, and at most
``max_fraction`` of the nodes in scope (at least one).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from slurmhealth.config import Config
from slurmhealth.slurm import REASON_PREFIX, NodeInfo, SlurmBackend, expand_hostlist

REMEDIATING = f"{REASON_PREFIX} remediating:"
REBOOTING = f"{REASON_PREFIX} rebooting:"
SERVICE = f"{REASON_PREFIX} service required:"
BACK = " (back after reboot)"  # appended to the reason of a fault that survived a reboot
ATTEMPTS = ("reset", "reboot")  # the steps max_attempts counts

Partitions = Callable[[], Mapping[str, Sequence[str]]]


def in_remediation(n: NodeInfo) -> bool:
    return n.reason.startswith((REMEDIATING, REBOOTING)) or "reboot" in n.state


def fault_of(reason: str) -> str:
    """Our reason without its prefix and any remediation tag: the fault it names (the
    same text however many reboots it survived)."""
    text = reason
    for tag in (REMEDIATING, REBOOTING, SERVICE, REASON_PREFIX):
        if text.startswith(tag):
            text = text[len(tag) :].strip()
    return text.removesuffix(BACK)


def scope(cfg: Config, nodes: Sequence[NodeInfo], partitions: Partitions) -> list[NodeInfo]:
    """The nodes ``[remediate] partitions`` and ``nodes`` allow (every node when unset)."""
    rc = cfg.remediate
    out = list(nodes)
    if rc.nodes.strip():
        allowed = set(expand_hostlist(rc.nodes))
        out = [n for n in out if n.name in allowed]
    if rc.partitions:
        parts = partitions()
        out = [n for n in out if set(parts.get(n.name, ())) & set(rc.partitions)]
    return out


def limit(cfg: Config, in_scope: Sequence[NodeInfo]) -> int:
    share = max(1, math.floor(len(in_scope) * cfg.remediate.max_fraction + 1e-9))
    return min(cfg.remediate.max_concurrent, share)


def _ordered(nodes: Sequence[NodeInfo]) -> list[str]:
    busy = [n for n in nodes if in_remediation(n)]
    busy.sort(key=lambda n: (n.reason_time if n.reason_time is not None else math.inf, n.name))
    return [n.name for n in busy]


def claim(
    cfg: Config, slurm: SlurmBackend, me: NodeInfo, fault: str, partitions: Partitions
) -> str:
    """Mark ``me`` in remediation if the breaker allows; "" when claimed, else why not."""
    in_scope = scope(cfg, slurm.nodes(), partitions)
    cap = limit(cfg, in_scope)
    others = [n for n in _ordered(in_scope) if n != me.name]
    if len(others) >= cap:
        return f"circuit breaker: {', '.join(others)} in remediation (limit {cap})"
    slurm.drain(me.name, f"{REMEDIATING} {fault}")
    order = _ordered(scope(cfg, slurm.nodes(), partitions))
    if me.name in order and order.index(me.name) >= cap:
        slurm.drain(me.name, me.reason)  # another node claimed first: give way
        return f"circuit breaker: {', '.join(order[:cap])} claimed first (limit {cap})"
    return ""


def attempts_in_window(
    rows: Sequence[Mapping[str, Any]], now: float, window_s: float
) -> list[Mapping[str, Any]]:
    """The node's resets and reboots that started within the window, newest first (a reset
    refused for processes on the GPU did nothing: not an attempt)."""
    return [r for r in rows if r.get("action") in ATTEMPTS and r.get("outcome") != "refused"
            and float(r.get("started") or 0.0) >= now - window_s]  # fmt: skip


def write_incident(
    cfg: Config,
    node: str,
    doc: Mapping[str, Any],
    bug_report: Callable[[str], Mapping[str, Any]],
    now: float,
) -> str:
    """``<evidence_dir>/remediation/<node>-<UTC time>/incident.json`` (root-owned, 0750)
    with the fault, its attempts and what ``nvidia-bug-report.sh`` gave; returns the
    folder."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    folder = os.path.join(cfg.expand(cfg.paths.evidence_dir), "remediation", f"{node}-{stamp}")
    os.makedirs(folder, mode=0o750, exist_ok=True)
    report = dict(bug_report(folder))
    path = os.path.join(folder, "incident.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o640)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump({"schema": "slurmhealth.remediation-incident/1", **doc,
                   "nvidia_bug_report": report}, fh, indent=2, default=str)  # fmt: skip
    return folder


def plan_fleet(
    cfg: Config,
    nodes: Sequence[NodeInfo],
    partitions: Partitions,
    history_of: Callable[[str], tuple[list[dict[str, Any]], list[dict[str, Any]]] | None],
    now: float,
) -> dict[str, Any]:
    """What remediation would do on each node now (nothing is changed): ``history_of(node)``
    gives its (drained rows, remediation rows), None when its history cannot be read here."""
    from slurmhealth.checks.remediation import plan

    in_scope = scope(cfg, nodes, partitions)
    names = {n.name for n in in_scope}
    cap = limit(cfg, in_scope)
    busy = _ordered(in_scope)
    out = []
    for n in sorted(nodes, key=lambda n: n.name):
        row: dict[str, Any] = {"node": n.name, "state": n.state, "reason": n.reason,
                               "action": "none", "gpus": [], "fault": "", "attempts": None,
                               "why": ""}  # fmt: skip
        out.append(row)
        why = _not_ours(n, n.name in names)
        if why:
            row["why"] = why
            continue
        if n.name in busy:
            row.update(action="in_progress", why="in remediation now", fault=fault_of(n.reason))
            continue
        known = history_of(n.name)
        if known is None:
            row["why"] = "its history is not readable here: run `remediate --dry-run` on it"
            continue
        drained, steps = known
        p = plan(drained[0]["detail"].get("findings", []) if drained else [])
        tried = attempts_in_window(steps, now, cfg.remediate.window_s)
        row.update(fault=p.fault or fault_of(n.reason), attempts=len(tried))
        if p.step == "none":
            row["why"] = p.why
        elif len(tried) >= cfg.remediate.max_attempts:
            row.update(action="service_required", why=f"{len(tried)} attempts in the window")
        elif n.state.startswith(("draining", "mixed", "allocated", "completing")):
            row.update(action="wait", why="jobs still run there: never touched")
        elif len(busy) >= cap:
            row.update(action="skip", why=f"circuit breaker: {', '.join(busy)} (limit {cap})")
        else:
            step = "reboot" if tried and tried[0].get("action") == "reset" else p.step
            row.update(action=step, gpus=list(p.gpus) if step == "reset" else [])
            busy.append(n.name)
    return {"schema": "slurmhealth.remediate-plan/1", "enabled": cfg.remediate.enabled,
            "limit": cap, "max_attempts": cfg.remediate.max_attempts,
            "window_s": cfg.remediate.window_s, "nodes": out}  # fmt: skip


def _not_ours(n: NodeInfo, in_scope: bool) -> str:
    """Why remediation leaves ``n`` alone, or "" when it may act."""
    if not in_scope:
        return "outside [remediate] partitions/nodes"
    if not n.drained and not in_remediation(n):
        return "in service"
    if not n.ours:
        who = f" by {n.reason_user}" if n.reason_user else ""
        return f"drained{who} ({n.reason!r}), not by slurmhealth: left alone"
    if n.reason.startswith(SERVICE):
        return "service required: waiting for a person"
    return ""


def dry_run(cfg: Config) -> dict[str, Any]:
    """:func:`plan_fleet` over the configured Slurm backend and every history this host can
    read (its own; each node's where ``paths.db`` holds ``{node}``)."""
    from slurmhealth.errors import StoreError
    from slurmhealth.history.read import Reader, drain_rows, remediation_rows
    from slurmhealth.slurm import node_partitions, open_slurm

    timeout = cfg.slurm.command_timeout_s
    slurm = open_slurm(cfg.slurm.backend, timeout)

    def history_of(node: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        path = cfg.db_path(node)
        if ("{node}" not in cfg.paths.db and node != cfg.node_name) or not os.path.exists(path):
            return None
        try:
            with Reader(path) as db:
                drained = drain_rows(db, node=node, state="drained", limit=1)
                return drained, remediation_rows(db, node=node, limit=100)
        except StoreError:
            return None

    return plan_fleet(cfg, slurm.nodes(), lambda: node_partitions(timeout), history_of,
                      time.time())  # fmt: skip
