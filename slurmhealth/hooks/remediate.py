"""Remediation of one node: reset the GPU, re-validate, resume; else reboot; else "service
required" (docs/remediation.md).

:func:`tick` is one step of it, run periodically on the node while slurmhealth's drain is in
force (the health check between jobs calls it when ``[remediate] enabled``; so does
``slurmhealth remediate --run`` from a timer). It acts only on a node slurmhealth drained
(an admin's drain and reason are never touched), only once no job runs there (the drain
lets running jobs finish; a running job is never touched), and only while the circuit
breaker allows (``hooks/remediate_plan.py``). Each step is a ``remediations`` row:

1. the fault is the one the node's drain recorded; the policy (``checks/remediation.py``)
   says reset or reboot, or nothing for faults that need hands;
2. after ``max_attempts`` resets and reboots within ``window_s``: reason ``slurmhealth:
   service required: ...``, an incident with a bounded ``nvidia-bug-report.sh``;
3. reset: the GPU layer's reset (preconditions first), then the validation (the checks on
   every GPU and the configured benchmarks); clean: resume;
4. a reset that fails, or a fault that returns after one: ``scontrol reboot ASAP
   nextstate=RESUME``; the tick after the reboot validates (the fault back: drained again,
   and counted).
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slurmhealth.config import Config
from slurmhealth.hooks import remediate_plan as fleet
from slurmhealth.slurm import REASON_PREFIX, NodeInfo, SlurmBackend, SlurmError

if TYPE_CHECKING:
    from slurmhealth.gpu import GpuBackend
    from slurmhealth.gpu.reset import GpuReset
    from slurmhealth.history import History
    from slurmhealth.history.records import Row

log = logging.getLogger("slurmhealth.remediate")
ACTOR = "slurmhealth remediate"


@dataclass(frozen=True)
class Step:
    """What one tick did: ``action`` none | wait | skip | reset | reboot | resume |
    service_required | error, and why."""

    node: str
    action: str
    why: str
    fault: str = ""
    gpus: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "action": self.action, "why": self.why,
                "fault": self.fault, "gpus": list(self.gpus)}  # fmt: skip


@dataclass
class RemediateAdapters:
    """The outside world of a tick; the entry points pass the real ones, tests fakes."""

    slurm: SlurmBackend
    history: History
    open_gpu: Callable[[float], GpuBackend]
    open_reset: Callable[[], GpuReset]
    reboot: Callable[[str, str], None]  # (node, reason): scontrol reboot ASAP ...
    validate: Callable[[], tuple[bool, list[str]]]  # (clean, why not)
    local_jobs: Callable[[], Sequence[str] | None]
    bug_report: Callable[[str], Mapping[str, Any]]
    partitions: fleet.Partitions = dict
    clock: Callable[[], float] = time.time


@dataclass
class _Fault:
    node: str
    text: str
    findings: list[dict[str, Any]]
    job_id: str | None
    rows: list[dict[str, Any]] = field(default_factory=list)  # the node's remediation rows


def tick(cfg: Config, node: str, ad: RemediateAdapters) -> Step:
    """One remediation step for ``node`` (see the module's docstring)."""
    from slurmhealth.history.read import remediation_rows

    me = next((n for n in ad.slurm.nodes() if n.name == node), None)
    if me is None:
        return Step(node, "none", "not a node of this cluster")
    if node not in {n.name for n in fleet.scope(cfg, [me], ad.partitions)}:
        return Step(node, "none", "outside [remediate] partitions/nodes")
    rows = remediation_rows(ad.history, node=node, limit=100)
    rebooting = next((r for r in rows if r["action"] == "reboot"
                      and r["outcome"] == "rebooting"), None)  # fmt: skip
    if rebooting is not None:
        after = _after_reboot(cfg, me, rebooting, ad)
        if after is not None:
            return after
        me = next(n for n in ad.slurm.nodes() if n.name == node)
        rows = remediation_rows(ad.history, node=node, limit=100)
    why = fleet._not_ours(me, True)
    if why:
        return Step(node, "none", why)
    fault = _fault(me, ad.history, rows)
    if fault is None:
        return Step(node, "none", "no recorded fault to repair")
    return _act(cfg, me, fault, ad)


def locked_tick(cfg: Config, node: str, ad: RemediateAdapters) -> Step:
    """:func:`tick` while holding the node's remediation lock (``<run_dir>/remediate.lock``,
    root-owned): the health check and a timer's ``remediate --run`` never act at once."""
    folder = cfg.expand(cfg.paths.run_dir, node)
    os.makedirs(folder, mode=0o755, exist_ok=True)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(os.path.join(folder, "remediate.lock"), flags, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return Step(node, "skip", "another remediation step runs on this node")
        return tick(cfg, node, ad)
    finally:
        os.close(fd)


def _fault(me: NodeInfo, history: History, rows: list[dict[str, Any]]) -> _Fault | None:
    """The fault behind the node's drain in force: its newest ``drained`` row."""
    from slurmhealth.history.read import drain_rows

    drained = drain_rows(history, node=me.name, state="drained", limit=1)
    if not drained:
        return None
    d = drained[0]
    detail = d.get("detail")
    listed = detail.get("findings", []) if isinstance(detail, dict) else []
    findings = [f for f in listed if isinstance(f, dict)]
    return _Fault(me.name, fleet.fault_of(me.reason), findings, d.get("job_id"), rows)


def _act(cfg: Config, me: NodeInfo, fault: _Fault, ad: RemediateAdapters) -> Step:
    from slurmhealth.checks.remediation import plan

    p = plan(fault.findings)
    if p.step == "none":
        return Step(me.name, "none", p.why, fault.text)
    tried = fleet.attempts_in_window(fault.rows, ad.clock(), cfg.remediate.window_s)
    if len(tried) >= cfg.remediate.max_attempts:
        return _service_required(cfg, me, fault, tried, ad)
    jobs = ad.local_jobs()
    if jobs != [] or not me.state.startswith("drained"):
        which = "slurmd did not say which jobs run" if jobs is None else (
            f"job(s) {', '.join(jobs)} still run" if jobs else f"node is {me.state}"
        )  # fmt: skip
        return Step(me.name, "wait", f"{which}: waiting for them to end", fault.text)
    refused = fleet.claim(cfg, ad.slurm, me, fault.text, ad.partitions)
    if refused:
        return Step(me.name, "skip", refused, fault.text)
    try:
        return _repair(cfg, me, fault, p.step, p.gpus, tried, ad)
    except Exception:  # never leave the claim behind: it would hold the breaker for good
        ad.slurm.drain(me.name, me.reason)
        raise


def _repair(
    cfg: Config,
    me: NodeInfo,
    fault: _Fault,
    step: str,
    gpus: Sequence[int],
    tried: Sequence[Mapping[str, Any]],
    ad: RemediateAdapters,
) -> Step:
    """Reset (when the policy says so and the last attempt was not a reset whose fault came
    back), else or then reboot, or service required when that was the last attempt."""
    if step == "reset" and not (tried and tried[0]["action"] == "reset"):
        done = _reset(cfg, me, fault, gpus, ad)
        if done is not None:
            return done
        if len(tried) + 1 >= cfg.remediate.max_attempts:
            return _service_required(cfg, me, fault, [*tried, {"action": "reset"}], ad)
    return _reboot(me, fault, ad)


def _write(ad: RemediateAdapters, row: Row) -> None:
    from slurmhealth.history import records

    if not ad.history.write(records.batch([row])):
        log.warning("%s: %s row spooled (history not writable now)", row.values.get("node"),
                    row.table)  # fmt: skip


def _row(
    fault: _Fault,
    action: str,
    outcome: str,
    started: float,
    ended: float | None,
    gpus: Sequence[int] = (),
    detail: Mapping[str, Any] | None = None,
) -> Row:
    from slurmhealth.history import records, rows

    return records.remediation(rows.remediation_row(
        fault.node, action, outcome, started=started, ended=ended, fault=fault.text, gpus=gpus,
        job_id=fault.job_id, detail=detail))  # fmt: skip


def _reset(
    cfg: Config, me: NodeInfo, fault: _Fault, gpus: Sequence[int], ad: RemediateAdapters
) -> Step | None:
    """Reset, validate, resume: a Step when done (resumed, or refused); None when the node
    needs a reboot (the reset failed or the fault came back)."""
    started = ad.clock()
    backend = ad.open_gpu(cfg.gpu.snapshot_timeout_s)
    try:
        snapshot = backend.snapshot(None)
    finally:
        backend.close()
    result = ad.open_reset().reset(gpus, snapshot)
    outcome = "ok" if result.ok else "refused" if result.refused else "failed"
    _write(ad, _row(fault, "reset", outcome, started, ad.clock(), result.gpus, result.to_dict()))
    if result.refused:
        ad.slurm.drain(me.name, me.reason)  # back to the plain drain; next tick tries again
        return Step(me.name, "wait", f"reset refused: {result.refused}", fault.text, result.gpus)
    if not result.ok:
        log.warning("%s: GPU reset failed: %s", me.name, result.output[-300:])
        return None
    return _validate_and_resume(me, fault, ad, "reset", result.gpus)


def _validate_and_resume(
    me: NodeInfo, fault: _Fault, ad: RemediateAdapters, after: str, gpus: Sequence[int] = ()
) -> Step | None:
    started = ad.clock()
    clean, reasons = ad.validate()
    verdict = {"after": after, "reasons": reasons}
    outcome = "ok" if clean else "fail"
    _write(ad, _row(fault, "validate", outcome, started, ad.clock(), gpus, verdict))
    if not clean:
        return None
    _resume(me, fault, ad, f"validated after a {after}")
    return Step(me.name, "resume", f"validated after a {after}: back in service", fault.text,
                tuple(gpus))  # fmt: skip


def _resume(me: NodeInfo, fault: _Fault, ad: RemediateAdapters, why: str) -> None:
    now = ad.clock()
    info = next((n for n in ad.slurm.nodes() if n.name == me.name), me)
    if info.drained and info.ours:
        ad.slurm.resume(me.name)
    _drain_ended(ad, now, me.name, info.reason, why, why)
    _write(ad, _row(fault, "resume", "resumed", now, now))


def _drain_ended(
    ad: RemediateAdapters, ts: float, node: str, previous: str, why: str, how: str
) -> None:
    """The history's ``resumed`` row that ends slurmhealth's drain of ``node``."""
    from slurmhealth.history import records, rows

    detail = {"previous_reason": previous, "validated": True, "why": how}
    drain = rows.drain_row(ts, node, "resumed", f"slurmhealth remediation: {why}", ACTOR,
                           detail)  # fmt: skip
    _write(ad, records.drain(drain))


def _reboot(me: NodeInfo, fault: _Fault, ad: RemediateAdapters) -> Step:
    now = ad.clock()
    reason = f"{fleet.REBOOTING} {fault.text}"
    try:
        ad.reboot(me.name, reason)
    except SlurmError as exc:
        _write(ad, _row(fault, "reboot", "failed", now, ad.clock(), detail={"error": str(exc)}))
        ad.slurm.drain(me.name, me.reason)
        return Step(me.name, "reboot", f"scontrol reboot failed: {exc}", fault.text)
    _write(ad, _row(fault, "reboot", "rebooting", now, None, detail={"reason": reason}))
    return Step(me.name, "reboot", "scontrol reboot ASAP nextstate=RESUME issued", fault.text)


def _after_reboot(
    cfg: Config, me: NodeInfo, row: dict[str, Any], ad: RemediateAdapters
) -> Step | None:
    """The tick after ``scontrol reboot``: wait while it runs; then validate. Clean: the
    reboot row ends ``validated`` (Slurm resumed the node). The fault back: it ends
    ``fault_returned`` and the node is drained again (None: the caller counts attempts)."""
    from slurmhealth.history import records

    if me.state.startswith("down") and not me.ours:  # Slurm gave up on it (ResumeTimeout)
        _write(ad, records.remediation({**row, "ended": ad.clock(), "outcome": "failed",
                                        "detail": {**(row.get("detail") or {}),
                                                   "reasons": [f"node {me.state}: {me.reason}"]}},
                                       upsert=True))  # fmt: skip
        return Step(me.name, "none", f"the reboot did not complete ({me.reason}): left as is")
    if "reboot" in me.state or me.state.startswith(("down", "unknown")):
        return Step(me.name, "wait", f"reboot in progress (node {me.state})", row["fault"])
    if ad.local_jobs() != []:  # a job took the node first: its processes are not a fault
        return Step(me.name, "wait", "back after the reboot; validating once no job runs")
    # fault_of: a row an older release wrote may still carry the "(back after reboot)" tag
    fault = _Fault(me.name, fleet.fault_of(str(row["fault"])), [], row.get("job_id"))
    clean, reasons = ad.validate()
    ended = ad.clock()
    closed = {**row, "ended": ended, "outcome": "validated" if clean else "fault_returned",
              "detail": {**(row.get("detail") or {}), "reasons": reasons}}  # fmt: skip
    _write(ad, records.remediation(closed, upsert=True))
    if clean:
        if me.drained and me.ours:
            _resume(me, fault, ad, "validated after a reboot")
        elif not me.drained:  # Slurm resumed it: the history's drain ends here too
            _drain_ended(ad, ended, me.name, me.reason, "validated after a reboot",
                         "resumed by Slurm (nextstate=RESUME)")  # fmt: skip
        return Step(me.name, "resume", "validated after the reboot: in service", fault.text)
    if not me.drained:  # Slurm resumed it (nextstate=RESUME): take it out again
        ad.slurm.drain(me.name, f"{REASON_PREFIX} {fault.text}{fleet.BACK}")
    log.warning("%s: fault back after the reboot: %s", me.name, "; ".join(reasons[:3]))
    return None


def _service_required(
    cfg: Config, me: NodeInfo, fault: _Fault, tried: Sequence[Mapping[str, Any]],
    ad: RemediateAdapters,
) -> Step:  # fmt: skip
    now = ad.clock()
    reason = f"{fleet.SERVICE} {fault.text}"
    ad.slurm.drain(me.name, reason)
    doc = {"node": me.name, "fault": fault.text, "job_id": fault.job_id,
           "findings": fault.findings, "attempts": len(tried),
           "max_attempts": cfg.remediate.max_attempts, "window_s": cfg.remediate.window_s,
           "steps": fault.rows[:50], "reason": reason}  # fmt: skip
    try:
        folder = fleet.write_incident(cfg, me.name, doc, ad.bug_report, now)
    except OSError as exc:
        folder = f"(not written: {exc})"
    _write(ad, _row(fault, "service_required", "service_required", now, ad.clock(),
                    detail={"incident": folder}))  # fmt: skip
    why = f"{len(tried)} attempt(s) in {cfg.remediate.window_s:g} s: left drained; {folder}"
    return Step(me.name, "service_required", why, fault.text)


def step_error(node: str, exc: BaseException) -> Step:
    """A tick that crashed: logged and reported, the node left as it is (fail open)."""
    return Step(node, "error", f"{type(exc).__name__}: {exc}")


def adapters(cfg: Config, history: History) -> RemediateAdapters:
    """The real outside world of a tick on this node."""
    from slurmhealth.gpu import open_backend
    from slurmhealth.gpu.reset import bug_report, open_reset
    from slurmhealth.slurm import local_job_ids, node_partitions, open_slurm, reboot_node

    timeout = cfg.slurm.command_timeout_s
    node = cfg.node_name

    def validate() -> tuple[bool, list[str]]:
        from slurmhealth.hooks.validate import run_validate

        result = run_validate(cfg, benchmarks=list(cfg.remediate.validate_benchmarks))
        return result.status == "ok", list(result.reasons)

    return RemediateAdapters(
        slurm=open_slurm(cfg.slurm.backend, timeout),
        history=history,
        open_gpu=lambda _t: open_backend(cfg),
        open_reset=lambda: open_reset(cfg),
        reboot=lambda n, reason: reboot_node(n, reason, timeout),
        validate=validate,
        local_jobs=lambda: local_job_ids(node, timeout),
        bug_report=lambda folder: bug_report(folder, cfg.remediate.bug_report_timeout_s),
        partitions=lambda: node_partitions(timeout),
    )
