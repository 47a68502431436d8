"""Whether and how to take a node out of service after failing findings.

Rules (NHC users learned them the hard way):
- the reason is ours and precise: ``slurmhealth: <check> gpu<i> <detail>``;
- a reason someone else set is never overwritten;
- policy ``warn`` records but never drains;
- circuit breaker: once the share of nodes drained by slurmhealth reaches
  ``policy.drain_max_share`` (at least one node), further drains are suppressed and
  recorded, so a bug or a bad config cannot drain the cluster. Prologs that race past the
  check re-read the node list after draining and the later drains undo themselves (those
  Slurm's whole-second reason times cannot order undo too: never more than the limit).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from slurmhealth.config import Config
from slurmhealth.model import Finding
from slurmhealth.slurm import REASON_PREFIX, NodeInfo, SlurmBackend, SlurmError, clean_reason

log = logging.getLogger("slurmhealth.drain")


@dataclass(frozen=True)
class DrainOutcome:
    """``state``: drained | already | held | suppressed | policy_warn | failed."""

    state: str
    reason: str
    detail: str = ""

    @property
    def keeps_job_off(self) -> bool:
        """The job must not run here (the prolog exits 1 so Slurm requeues it)."""
        return self.state in ("drained", "already", "held", "failed")


def drain_candidates(findings: Sequence[Finding]) -> list[Finding]:
    """The findings that take a node out: failing, with a drain or reset action."""
    return [f for f in findings if f.failing and f.action.takes_node_out]


def drain_reason(findings: Sequence[Finding]) -> str:
    """``slurmhealth: nvlink_inactive gpu3 NVLink 7 inactive (+1 more)``; Xids behind
    another finding are named too (``[Xid 79]``): they are what an operator greps for."""
    worst = sorted(findings, key=Finding.sort_key)[0]
    where = f" gpu{worst.gpu}" if worst.gpu is not None else ""
    more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
    xids = sorted({int(f.evidence["xid"]) for f in findings if "xid" in f.evidence})
    tag = f" [Xid {','.join(map(str, xids))}]" if xids and worst.check != "xid" else ""
    return clean_reason(f"{REASON_PREFIX} {worst.check}{where} {worst.message}{tag}{more}")


def _limit(cfg: Config, nodes: Sequence[NodeInfo]) -> int:
    return max(1, math.floor(len(nodes) * cfg.policy.drain_max_share + 1e-9))


def _ours_in_order(nodes: Sequence[NodeInfo]) -> list[str]:
    drained = [n for n in nodes if n.drained and n.ours]
    drained.sort(key=lambda n: (n.reason_time if n.reason_time is not None else math.inf, n.name))
    return [n.name for n in drained]


def _ahead(after: Sequence[NodeInfo], node: str, before: set[str]) -> list[str]:
    """The other nodes drained by us that may have been drained before ``node``: those
    already drained when it looked (``before``), and those drained since unless Slurm's
    reason time (whole seconds) shows them strictly later. A tie counts as ahead: two
    prologs in the same second that each see the other both undo, rather than both stay
    (by name, the one that looked before the other drained kept too)."""
    mine = next((n.reason_time for n in after if n.name == node), None)
    return [n.name for n in after
            if n.drained and n.ours and n.name != node
            and (n.name in before or mine is None or n.reason_time is None
                 or n.reason_time <= mine)]  # fmt: skip


def drain_node(
    cfg: Config,
    slurm: SlurmBackend,
    node: str,
    findings: Sequence[Finding],
    reason: str | None = None,
) -> DrainOutcome:
    """Drain ``node`` for ``findings`` (failing, with a drain/reset action) if allowed;
    ``reason`` (ours, ``slurmhealth: ...``) instead of the findings' (the sweep's)."""
    reason = clean_reason(reason) if reason else drain_reason(findings)
    if cfg.policy.mode == "warn":
        return DrainOutcome("policy_warn", reason, "policy.mode = warn: recorded, not drained")
    try:
        nodes = slurm.nodes()
    except SlurmError as exc:
        return DrainOutcome("failed", reason, f"cannot read node states: {exc}")
    me = next((n for n in nodes if n.name == node), None)
    if me is not None and me.drained:
        if me.ours:
            return DrainOutcome("already", me.reason, "already drained by slurmhealth")
        who = f" by {me.reason_user}" if me.reason_user else ""
        return DrainOutcome("held", reason, f"already drained{who}: {me.reason!r}; left as is")
    limit = _limit(cfg, nodes)
    ours = _ours_in_order(nodes)
    if len(ours) >= limit:
        return DrainOutcome(
            "suppressed",
            reason,
            f"circuit breaker: {len(ours)} of {len(nodes)} nodes already drained by "
            f"slurmhealth (limit {limit}: {', '.join(ours)})",
        )
    try:
        slurm.drain(node, reason)
    except SlurmError as exc:
        return DrainOutcome("failed", reason, f"scontrol drain failed: {exc}")
    # another node's prolog may have drained at the same moment: the earliest win
    try:
        after = slurm.nodes()
    except SlurmError:
        return DrainOutcome("drained", reason)
    limit = _limit(cfg, after)
    ahead = _ahead(after, node, set(ours)) if node in _ours_in_order(after) else []
    if len(ahead) >= limit:
        try:
            slurm.resume(node)
        except SlurmError as exc:
            log.error("%s: could not undo a drain over the circuit-breaker limit: %s", node, exc)
            return DrainOutcome("drained", reason, "over the limit but could not undo")
        return DrainOutcome(
            "suppressed",
            reason,
            f"circuit breaker: {', '.join(ahead)} drained first (limit {limit}); undone",
        )
    return DrainOutcome("drained", reason)
