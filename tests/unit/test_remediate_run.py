"""One remediation step at a time (slurmhealth.hooks.remediate.tick) over fakes: a recording
Slurm backend, a GPU layer whose reset and validation answer as each test says, a clock
that ticks a second per call, and a real history in tmp_path. What an operator sees: the
step's action and why, the node's state and reason, the rows written, the log lines."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from slurmhealth.config import Config, load_config
from slurmhealth.gpu.reset import ResetResult
from slurmhealth.history import Batch, History, rows
from slurmhealth.history.node_queries import drain_in_force
from slurmhealth.history.queries import drain_rows, remediation_rows
from slurmhealth.hooks import remediate as rem
from slurmhealth.slurm import REASON_PREFIX, NodeInfo, SlurmError
from tests.support.recording_slurm import RecordingSlurm

NODE = "n1"
T0 = 1.0e9
FAULT = "row_remap gpu4 pending"
OURS = f"{REASON_PREFIX} {FAULT}"
REMEDIATING = f"{REASON_PREFIX} remediating: {FAULT}"
REBOOTING = f"{REASON_PREFIX} rebooting: {FAULT}"
RESET = {"check": "row_remap", "gpu": 4, "action": "reset", "message": "pending"}
HANDS = {"check": "nvlink_inactive", "gpu": 1, "action": "drain", "message": "link down"}


class Snapshot:
    """What the GPU layer's snapshot gave (the reset's preconditions read it)."""


class Backend:
    def __init__(self, world: World) -> None:
        self.world = world

    def snapshot(self, _job: Any) -> Snapshot:
        return self.world.snapshot

    def close(self) -> None:
        self.world.closed += 1


class Reset:
    def __init__(self, world: World) -> None:
        self.world = world

    def reset(self, indices: Sequence[int], snapshot: Any) -> ResetResult:
        self.world.resets.append((tuple(indices), snapshot))
        return self.world.result


class World:
    """The node n1 drained by slurmhealth for ``findings`` (the drain's history row, job
    4242), two idle nodes beside it, and the fakes a tick runs against."""

    def __init__(
        self,
        tmp_path: Path,
        findings: Sequence[dict[str, Any]] = (RESET,),
        me: NodeInfo | None = None,
        extra: dict[str, Any] | None = None,
        **flags: Any,
    ) -> None:
        tmp_path.mkdir(parents=True, exist_ok=True)
        (tmp_path / "config.toml").write_text("")
        self.cfg: Config = load_config(
            str(tmp_path / "config.toml"),
            env={},
            flags={"node.name": NODE, "remediate.enabled": True,
                   "paths.db": str(tmp_path / "history.db"),
                   "paths.evidence_dir": str(tmp_path / "evidence"),
                   "paths.run_dir": str(tmp_path / "run"),
                   **{f"remediate.{k}": v for k, v in flags.items()}, **(extra or {})},
        )  # fmt: skip
        self.history = History(self.cfg.db_path())
        drained = rows.drain_row(T0, NODE, "drained", OURS, "slurmhealth epilog",
                                 {"findings": list(findings)})  # fmt: skip
        assert self.history.write(Batch(inserts=[("drains", {**drained, "job_id": "4242"})]))
        me = me or NodeInfo(NODE, "drained", OURS, "root", T0)
        self.slurm = RecordingSlurm([me, NodeInfo("n2", "idle"), NodeInfo("n3", "idle")])
        self.t = T0 + 100.0
        self.jobs: list[str] | None = []
        self.snapshot = Snapshot()
        self.result = ResetResult(True, (4,), "nvidia-smi --gpu-reset -i 4", "GPU 4 reset")
        self.resets: list[tuple[tuple[int, ...], Any]] = []
        self.opened: list[float] = []
        self.closed = 0
        self.verdicts: list[tuple[bool, list[str]]] = []
        self.reboots: list[tuple[str, str]] = []
        self.reboot_fails: str = ""
        self.reports: list[str] = []
        self.parts: dict[str, Sequence[str]] = {}

    def clock(self) -> float:
        self.t += 1.0
        return self.t

    def open_gpu(self, timeout: float) -> Backend:
        self.opened.append(timeout)
        return Backend(self)

    def validate(self) -> tuple[bool, list[str]]:
        return self.verdicts.pop(0) if self.verdicts else (True, [])

    def reboot(self, node: str, reason: str) -> None:
        self.reboots.append((node, reason))
        if self.reboot_fails:
            raise SlurmError(self.reboot_fails)
        self.slurm.table[node] = NodeInfo(node, "reboot^", reason, "root", self.t)

    def bug_report(self, folder: str) -> dict[str, Any]:
        self.reports.append(folder)
        return {"status": "skipped", "why": "nvidia-bug-report.sh is not installed"}

    def adapters(self, history: History | None = None) -> rem.RemediateAdapters:
        return rem.RemediateAdapters(
            slurm=self.slurm, history=history or self.history, open_gpu=self.open_gpu,
            open_reset=lambda: Reset(self), reboot=self.reboot, validate=self.validate,
            local_jobs=lambda: self.jobs, bug_report=self.bug_report,
            partitions=lambda: self.parts, clock=self.clock,
        )  # fmt: skip

    def tick(self) -> rem.Step:
        return rem.tick(self.cfg, NODE, self.adapters())

    def steps(self) -> list[dict[str, Any]]:
        """The node's remediation rows, oldest first."""
        return remediation_rows(self.history, node=NODE)[::-1]

    def outcomes(self) -> list[tuple[str, str]]:
        return [(r["action"], r["outcome"]) for r in self.steps()]

    def add_step(self, action: str, outcome: str, started: float) -> None:
        row = rows.remediation_row(NODE, action, outcome, started=started, ended=started,
                                   fault=FAULT, job_id="4242")  # fmt: skip
        assert self.history.write(Batch(inserts=[("remediations", row)]))

    def node(self) -> NodeInfo:
        return self.slurm.table[NODE]


def _after_a_reboot(tmp_path: Path, **flags: Any) -> World:
    """A node whose reset failed and whose reboot was issued (the reboot row open)."""
    world = World(tmp_path, **{"max_attempts": 3, **flags})
    world.result = ResetResult(False, (4,), "nvidia-smi --gpu-reset -i 4", "GPU 4 is busy")
    assert world.tick().action == "reboot"
    assert world.outcomes() == [("reset", "failed"), ("reboot", "rebooting")]
    return world


# -- what a tick leaves alone ---------------------------------------------------------------


def test_a_node_slurm_does_not_know_is_left_alone(tmp_path: Path) -> None:
    world = World(tmp_path)
    step = rem.tick(world.cfg, "n9", world.adapters())
    assert step == rem.Step("n9", "none", "not a node of this cluster")
    assert world.slurm.drains == [] and world.steps() == []


def test_a_node_outside_the_configured_nodes_or_partitions_is_left_alone(
    tmp_path: Path,
) -> None:
    world = World(tmp_path / "a", nodes="n[2-3]")
    assert world.tick() == rem.Step(NODE, "none", "outside [remediate] partitions/nodes")
    world = World(tmp_path / "b", partitions=["gpu"])
    world.parts = {"n1": ["debug"], "n2": ["gpu"]}
    assert world.tick() == rem.Step(NODE, "none", "outside [remediate] partitions/nodes")
    assert world.slurm.drains == [] and world.resets == [] and world.steps() == []
    world.parts = {"n1": ["gpu"]}
    assert world.tick().action == "resume"


def test_a_node_in_service_is_left_alone(tmp_path: Path) -> None:
    world = World(tmp_path, me=NodeInfo(NODE, "idle"))
    assert world.tick() == rem.Step(NODE, "none", "in service")
    assert world.resets == [] and world.steps() == []


def test_a_node_waiting_for_service_is_left_alone(tmp_path: Path) -> None:
    me = NodeInfo(NODE, "drained", f"{REASON_PREFIX} service required: {FAULT}", "root", T0)
    world = World(tmp_path, me=me)
    assert world.tick() == rem.Step(NODE, "none", "service required: waiting for a person")
    assert world.slurm.drains == [] and world.steps() == []


def test_a_drain_without_a_recorded_fault_is_left_alone(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.history.connection().execute("delete from drains")
    assert world.tick() == rem.Step(NODE, "none", "no recorded fault to repair")
    assert world.slurm.drains == [] and world.steps() == []


def test_the_fault_is_read_from_the_drains_recorded_findings_only(tmp_path: Path) -> None:
    world = World(tmp_path, findings=[RESET, "not a finding"])  # type: ignore[list-item]
    assert world.tick().action == "resume"
    assert world.resets == [((4,), world.snapshot)]


def test_a_fault_that_needs_hands_is_left_drained(tmp_path: Path) -> None:
    world = World(tmp_path, findings=[HANDS])
    step = world.tick()
    assert step == rem.Step(NODE, "none", "needs hands: nvlink_inactive gpu1 link down", FAULT)
    assert world.node().reason == OURS and world.slurm.drains == [] and world.steps() == []


@pytest.mark.parametrize(
    ("jobs", "state", "why"),
    [
        (None, "drained", "slurmd did not say which jobs run: waiting for them to end"),
        (["7", "8"], "draining", "job(s) 7, 8 still run: waiting for them to end"),
        (["7"], "drained", "job(s) 7 still run: waiting for them to end"),
        ([], "draining", "node is draining: waiting for them to end"),
        ([], "mixed+drain", "node is mixed+drain: waiting for them to end"),
    ],
)
def test_a_node_where_jobs_may_run_is_not_touched(
    tmp_path: Path, jobs: list[str] | None, state: str, why: str
) -> None:
    world = World(tmp_path, me=NodeInfo(NODE, state, OURS, "root", T0))
    world.jobs = jobs
    assert world.tick() == rem.Step(NODE, "wait", why, FAULT)
    assert world.slurm.drains == [] and world.resets == [] and world.steps() == []


def test_the_breaker_names_the_node_in_remediation(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.slurm.table["n2"] = NodeInfo("n2", "drained", f"{REASON_PREFIX} remediating: x", "root")
    step = world.tick()
    assert step == rem.Step(NODE, "skip", "circuit breaker: n2 in remediation (limit 1)", FAULT)
    assert world.node().reason == OURS and world.resets == [] and world.steps() == []


# -- a reset ---------------------------------------------------------------------------------


def test_a_clean_reset_resumes_the_node_and_records_each_step(tmp_path: Path) -> None:
    world = World(tmp_path)
    step = world.tick()
    assert step == rem.Step(NODE, "resume", "validated after a reset: back in service", FAULT,
                            (4,))  # fmt: skip
    assert world.opened == [world.cfg.gpu.snapshot_timeout_s] and world.closed == 1
    assert world.resets == [((4,), world.snapshot)]
    assert world.slurm.drains == [(NODE, REMEDIATING)] and world.slurm.resumes == [NODE]
    assert not world.node().drained
    reset, validate, resume = world.steps()
    assert (reset["action"], reset["outcome"], reset["gpus"]) == ("reset", "ok", [4])
    assert reset["detail"] == world.result.to_dict()
    assert (validate["action"], validate["outcome"], validate["gpus"]) == ("validate", "ok", [4])
    assert validate["detail"] == {"after": "reset", "reasons": []}
    assert (resume["action"], resume["outcome"]) == ("resume", "resumed")
    assert reset["started"] < reset["ended"] < validate["started"] < validate["ended"]
    assert validate["ended"] < resume["started"] == resume["ended"] <= world.t
    for row in (reset, validate, resume):
        assert (row["node"], row["fault"], row["job_id"]) == (NODE, FAULT, "4242")
    newest = drain_rows(world.history, node=NODE, limit=1)[0]
    assert newest["state"] == "resumed" and newest["ts"] == resume["started"]
    assert newest["reason"] == "slurmhealth remediation: validated after a reset"
    assert newest["actor"] == "slurmhealth remediate"
    assert newest["detail"] == {"previous_reason": REMEDIATING, "validated": True,
                                "why": "validated after a reset"}  # fmt: skip


def test_a_reset_refused_gives_the_node_back_its_drain(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.result = ResetResult(False, (4,), refused="processes still use GPU 4 (pids 9)")
    step = world.tick()
    assert step == rem.Step(NODE, "wait", "reset refused: processes still use GPU 4 (pids 9)",
                            FAULT, (4,))  # fmt: skip
    assert world.node().reason == OURS and world.slurm.drains[-1] == (NODE, OURS)
    assert world.outcomes() == [("reset", "refused")] and world.reboots == []
    assert world.slurm.resumes == []


def test_a_failed_reset_reboots_the_node(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    world = World(tmp_path, max_attempts=3)
    world.result = ResetResult(False, (4,), "nvidia-smi --gpu-reset -i 4", "x" * 400 + "busy")
    with caplog.at_level(logging.WARNING, "slurmhealth.remediate"):
        step = world.tick()
    assert step == rem.Step(NODE, "reboot", "scontrol reboot ASAP nextstate=RESUME issued", FAULT)
    assert world.reboots == [(NODE, REBOOTING)]
    assert f"n1: GPU reset failed: {('x' * 400 + 'busy')[-300:]}" in caplog.messages
    reset, reboot = world.steps()
    assert (reset["action"], reset["outcome"]) == ("reset", "failed")
    assert (reboot["action"], reboot["outcome"], reboot["gpus"]) == ("reboot", "rebooting", [])
    assert reboot["ended"] is None and reset["ended"] < reboot["started"] <= world.t
    assert reboot["detail"] == {"reason": REBOOTING}
    assert (reboot["fault"], reboot["job_id"]) == (FAULT, "4242")
    assert world.slurm.resumes == []


def test_a_fault_back_after_the_reset_reboots_the_node(tmp_path: Path) -> None:
    world = World(tmp_path, max_attempts=3)
    world.verdicts = [(False, ["row_remap gpu4 pending"])]
    assert world.tick().action == "reboot"
    assert world.outcomes() == [("reset", "ok"), ("validate", "fail"), ("reboot", "rebooting")]
    validate = world.steps()[1]
    assert validate["detail"] == {"after": "reset", "reasons": ["row_remap gpu4 pending"]}
    assert world.slurm.resumes == [] and world.reboots == [(NODE, REBOOTING)]


def test_after_a_reset_whose_fault_came_back_the_next_try_is_a_reboot(tmp_path: Path) -> None:
    world = World(tmp_path, max_attempts=3)
    world.add_step("reset", "ok", T0 + 50)
    assert world.tick().action == "reboot"
    assert world.resets == [] and world.reboots == [(NODE, REBOOTING)]
    assert world.outcomes() == [("reset", "ok"), ("reboot", "rebooting")]


def test_after_a_reboot_the_next_try_is_a_reset_again(tmp_path: Path) -> None:
    world = World(tmp_path, max_attempts=3)
    world.add_step("reboot", "fault_returned", T0 + 50)
    assert world.tick().action == "resume"
    assert world.resets == [((4,), world.snapshot)] and world.reboots == []


def test_a_failed_reset_that_was_the_last_attempt_is_service_required(tmp_path: Path) -> None:
    world = World(tmp_path)  # max_attempts 2: one reboot before, this reset the second
    world.add_step("reboot", "fault_returned", T0 + 50)
    world.result = ResetResult(False, (4,), "nvidia-smi --gpu-reset -i 4", "GPU 4 is busy")
    step = world.tick()
    assert step.action == "service_required" and step.why.startswith("2 attempt(s) in 86400 s")
    assert world.reboots == [] and world.resets == [((4,), world.snapshot)]
    assert world.node().reason == f"{REASON_PREFIX} service required: {FAULT}"
    assert world.outcomes()[-1] == ("service_required", "service_required")


def test_a_failed_first_reset_with_one_attempt_allowed_is_service_required(
    tmp_path: Path,
) -> None:
    world = World(tmp_path, max_attempts=1)
    world.result = ResetResult(False, (4,), "nvidia-smi --gpu-reset -i 4", "GPU 4 is busy")
    step = world.tick()
    assert step.action == "service_required" and step.why.startswith("1 attempt(s) in ")
    assert world.reboots == []


def test_a_crash_in_the_repair_gives_the_node_back_its_drain(tmp_path: Path) -> None:
    world = World(tmp_path)

    def broken(_timeout: float) -> Backend:
        raise OSError("NVML went away")

    ad = world.adapters()
    ad.open_gpu = broken
    with pytest.raises(OSError, match="NVML went away"):
        rem.tick(world.cfg, NODE, ad)
    assert world.slurm.drains == [(NODE, REMEDIATING), (NODE, OURS)]
    assert world.node().reason == OURS


# -- a reboot --------------------------------------------------------------------------------


def test_a_reboot_slurm_refuses_is_recorded_and_the_drain_given_back(tmp_path: Path) -> None:
    world = World(tmp_path, max_attempts=3)
    world.result = ResetResult(False, (4,), "nvidia-smi --gpu-reset -i 4", "GPU 4 is busy")
    world.reboot_fails = "scontrol: Invalid node name specified"
    step = world.tick()
    assert step == rem.Step(NODE, "reboot",
                            "scontrol reboot failed: scontrol: Invalid node name specified",
                            FAULT)  # fmt: skip
    assert world.node().reason == OURS and world.slurm.drains[-1] == (NODE, OURS)
    reboot = world.steps()[-1]
    assert (reboot["action"], reboot["outcome"]) == ("reboot", "failed")
    assert reboot["detail"] == {"error": "scontrol: Invalid node name specified"}
    assert world.steps()[0]["ended"] < reboot["started"] < reboot["ended"] <= world.t


@pytest.mark.parametrize("state", ["reboot^", "down*", "unknown", "down"])
def test_while_slurm_reboots_the_node_a_tick_waits(tmp_path: Path, state: str) -> None:
    world = _after_a_reboot(tmp_path)
    world.slurm.table[NODE] = NodeInfo(NODE, state, REBOOTING, "root", T0)
    assert world.tick() == rem.Step(NODE, "wait", f"reboot in progress (node {state})", FAULT)
    assert world.outcomes() == [("reset", "failed"), ("reboot", "rebooting")]


def test_a_reboot_slurm_gave_up_on_is_closed_as_failed(tmp_path: Path) -> None:
    world = _after_a_reboot(tmp_path)
    world.slurm.table[NODE] = NodeInfo(NODE, "down*", "Not responding", "slurm", T0)
    step = world.tick()
    assert step == rem.Step(NODE, "none",
                            "the reboot did not complete (Not responding): left as is")  # fmt: skip
    assert world.outcomes() == [("reset", "failed"), ("reboot", "failed")]
    reboot = world.steps()[-1]
    assert reboot["started"] < reboot["ended"] == world.t
    assert reboot["detail"] == {"reason": REBOOTING, "reasons": ["node down*: Not responding"]}
    assert world.slurm.drains == [(NODE, REMEDIATING)] and world.slurm.resumes == []


def test_back_after_the_reboot_a_running_job_is_waited_for(tmp_path: Path) -> None:
    world = _after_a_reboot(tmp_path)
    world.slurm.table[NODE] = NodeInfo(NODE, "mixed")
    for jobs in (["12"], None):
        world.jobs = jobs
        step = world.tick()
        assert step == rem.Step(NODE, "wait", "back after the reboot; validating once no job runs")
    assert world.outcomes()[-1] == ("reboot", "rebooting")


def test_a_node_slurm_resumed_after_the_reboot_is_validated(tmp_path: Path) -> None:
    world = _after_a_reboot(tmp_path)
    world.slurm.table[NODE] = NodeInfo(NODE, "idle")  # nextstate=RESUME
    step = world.tick()
    assert step == rem.Step(NODE, "resume", "validated after the reboot: in service", FAULT)
    assert world.outcomes() == [("reset", "failed"), ("reboot", "validated")]
    reboot = world.steps()[-1]
    assert reboot["started"] < reboot["ended"] == world.t
    assert reboot["detail"] == {"reason": REBOOTING, "reasons": []}
    assert world.slurm.resumes == [] and world.node().state == "idle"


def test_a_node_slurm_resumed_after_a_clean_reboot_ends_its_drain_in_the_history(
    tmp_path: Path,
) -> None:
    world = _after_a_reboot(tmp_path)
    world.slurm.table[NODE] = NodeInfo(NODE, "idle")  # nextstate=RESUME
    world.tick()
    newest = drain_rows(world.history, node=NODE, limit=1)[0]
    assert (newest["state"], newest["actor"]) == ("resumed", rem.ACTOR)
    assert newest["reason"] == "slurmhealth remediation: validated after a reboot"
    assert newest["detail"] == {"previous_reason": "", "validated": True,
                                "why": "resumed by Slurm (nextstate=RESUME)"}  # fmt: skip
    assert drain_in_force(world.history, NODE) is None  # what the exporter says


def test_a_fault_back_after_each_of_several_reboots_keeps_one_reason(tmp_path: Path) -> None:
    world = _after_a_reboot(tmp_path, max_attempts=9)
    for _ in range(3):  # back in service, the fault again: drained, reset (fails), rebooted
        world.slurm.table[NODE] = NodeInfo(NODE, "idle")  # nextstate=RESUME
        world.verdicts = [(False, ["row_remap gpu4 pending"])]
        assert world.tick().action == "reboot"
    assert world.reboots == [(NODE, REBOOTING)] * 4
    back = [r for _, r in world.slurm.drains if "reboot" in r]
    assert back == [f"{OURS} (back after reboot)"] * 3
    assert {row["fault"] for row in world.steps()} == {FAULT}


def test_a_node_still_drained_after_a_clean_reboot_is_resumed(tmp_path: Path) -> None:
    world = _after_a_reboot(tmp_path)
    world.slurm.table[NODE] = NodeInfo(NODE, "drained", REBOOTING, "root", T0)
    step = world.tick()
    assert step == rem.Step(NODE, "resume", "validated after the reboot: in service", FAULT)
    assert world.slurm.resumes == [NODE] and not world.node().drained
    assert world.outcomes() == [("reset", "failed"), ("reboot", "validated"),
                                ("resume", "resumed")]  # fmt: skip
    resume = world.steps()[-1]
    assert (resume["fault"], resume["job_id"]) == (FAULT, "4242")
    assert world.steps()[1]["ended"] < resume["started"] == resume["ended"]
    newest = drain_rows(world.history, node=NODE, limit=1)[0]
    assert newest["reason"] == "slurmhealth remediation: validated after a reboot"
    assert newest["detail"]["previous_reason"] == REBOOTING


def test_a_node_drained_by_an_admin_after_the_reboot_is_not_resumed(tmp_path: Path) -> None:
    world = _after_a_reboot(tmp_path)
    world.slurm.table[NODE] = NodeInfo(NODE, "drained", "bios update", "alice", T0)
    assert world.tick().action == "resume"  # the reboot's row is closed as validated ...
    assert world.slurm.resumes == [] and world.node().reason == "bios update"  # ... not resumed
    assert world.outcomes() == [("reset", "failed"), ("reboot", "validated")]


def test_a_fault_back_after_the_reboot_drains_again_and_counts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    world = _after_a_reboot(tmp_path, max_attempts=2)
    world.slurm.table[NODE] = NodeInfo(NODE, "idle")
    world.verdicts = [(False, ["a", "b", "c", "d"])]
    with caplog.at_level(logging.WARNING, "slurmhealth.remediate"):
        step = world.tick()
    assert "n1: fault back after the reboot: a; b; c" in caplog.messages
    back = f"{FAULT} (back after reboot)"
    assert (NODE, f"{REASON_PREFIX} {back}") in world.slurm.drains
    assert step.action == "service_required" and step.fault == FAULT  # one name for it
    assert world.node().reason == f"{REASON_PREFIX} service required: {FAULT}"
    assert world.outcomes() == [("reset", "failed"), ("reboot", "fault_returned"),
                                ("service_required", "service_required")]  # fmt: skip
    reboot = world.steps()[1]
    assert reboot["detail"] == {"reason": REBOOTING, "reasons": ["a", "b", "c", "d"]}
    assert reboot["started"] < reboot["ended"] < world.steps()[2]["started"]


def test_a_fault_back_on_a_node_still_drained_tries_again(tmp_path: Path) -> None:
    world = _after_a_reboot(tmp_path)  # max_attempts 3: a reset and a reboot so far
    world.slurm.table[NODE] = NodeInfo(NODE, "drained", REBOOTING, "root", T0)
    world.verdicts = [(False, ["row_remap gpu4 pending"])]
    world.result = ResetResult(True, (4,), "nvidia-smi --gpu-reset -i 4", "GPU 4 reset")
    step = world.tick()
    assert world.slurm.drains.count((NODE, f"{REASON_PREFIX} {FAULT} (back after reboot)")) == 0
    assert step.action == "resume"  # after a reboot, a reset again; clean this time
    assert world.outcomes() == [
        ("reset", "failed"), ("reboot", "fault_returned"), ("reset", "ok"), ("validate", "ok"),
        ("resume", "resumed")]  # fmt: skip


# -- service required ------------------------------------------------------------------------


def test_too_many_attempts_leave_the_node_for_a_person_with_an_incident(tmp_path: Path) -> None:
    world = World(tmp_path, window_s=3600.0)
    world.add_step("reset", "failed", T0 + 10)
    world.add_step("reboot", "fault_returned", T0 + 20)
    world.add_step("reset", "refused", T0 + 30)  # did nothing: not an attempt
    world.add_step("reboot", "failed", T0 - 7200)  # out of the window
    step = world.tick()
    reason = f"{REASON_PREFIX} service required: {FAULT}"
    assert world.node().reason == reason and world.slurm.drains == [(NODE, reason)]
    assert world.resets == [] and world.reboots == [] and world.slurm.resumes == []
    (folder,) = world.reports
    row = world.steps()[-1]
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(row["started"]))
    assert folder == str(tmp_path / "evidence" / "remediation" / f"n1-{stamp}")
    assert step == rem.Step(NODE, "service_required",
                            f"2 attempt(s) in 3600 s: left drained; {folder}", FAULT)  # fmt: skip
    doc = json.loads((Path(folder) / "incident.json").read_text())
    assert doc["node"] == NODE and doc["fault"] == FAULT and doc["job_id"] == "4242"
    assert doc["findings"] == [RESET] and doc["reason"] == reason
    assert (doc["attempts"], doc["max_attempts"], doc["window_s"]) == (2, 2, 3600.0)
    assert [(s["action"], s["outcome"]) for s in doc["steps"]] == [
        ("reset", "refused"), ("reboot", "fault_returned"), ("reset", "failed"),
        ("reboot", "failed")]  # fmt: skip
    assert doc["nvidia_bug_report"]["status"] == "skipped"
    assert (row["action"], row["outcome"]) == ("service_required", "service_required")
    assert row["detail"] == {"incident": folder} and row["job_id"] == "4242"
    assert row["started"] < row["ended"] == world.t
    assert world.tick().action == "none"  # and stays so


def test_an_incident_that_cannot_be_written_is_named_in_the_step(tmp_path: Path) -> None:
    (tmp_path / "evidence").write_text("a file, not a folder")
    world = World(tmp_path, max_attempts=1)
    world.add_step("reboot", "fault_returned", T0 + 20)
    step = world.tick()
    assert step.action == "service_required"
    assert step.why.startswith("1 attempt(s) in 86400 s: left drained; (not written: ")
    assert world.node().reason == f"{REASON_PREFIX} service required: {FAULT}"
    row = world.steps()[-1]
    assert row["detail"]["incident"].startswith("(not written: [Errno")


# -- the rest ----------------------------------------------------------------------------------


class Unwritable(History):
    """A history whose database cannot be written now: every batch goes to the spool."""

    def write(self, batch: Batch) -> bool:
        self._spool_batch(batch, "OperationalError: database is locked")
        return False


def test_a_step_written_while_the_history_is_locked_is_spooled_and_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    world = World(tmp_path)
    history = Unwritable(world.cfg.db_path())
    with caplog.at_level(logging.WARNING, "slurmhealth.remediate"):
        step = rem.tick(world.cfg, NODE, world.adapters(history))
    assert step.action == "resume"
    spooled = "n1: remediations row spooled (history not writable now)"
    assert caplog.messages.count(spooled) == 3
    assert "n1: drains row spooled (history not writable now)" in caplog.messages
    lines = Path(history.spool_path).read_text().splitlines()
    assert len(lines) == 4


def test_a_step_as_the_health_check_reports_it() -> None:
    step = rem.Step(NODE, "reset", "why", FAULT, (4, 5))
    assert step.to_dict() == {"node": NODE, "action": "reset", "why": "why", "fault": FAULT,
                              "gpus": [4, 5]}  # fmt: skip
    crashed = rem.step_error(NODE, OSError("NVML went away"))
    assert crashed == rem.Step(NODE, "error", "OSError: NVML went away")


def test_the_step_runs_under_the_nodes_lock_and_frees_it(tmp_path: Path) -> None:
    world = World(tmp_path)
    lock = tmp_path / "run" / "remediate.lock"
    seen: list[int] = []

    def jobs() -> list[str]:  # while the step runs: the lock is held, not inherited
        for fd in os.listdir("/proc/self/fd"):
            if os.path.realpath(f"/proc/self/fd/{fd}") == str(lock):
                seen.append(fcntl.fcntl(int(fd), fcntl.F_GETFD) & fcntl.FD_CLOEXEC)
        with open(lock) as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return []

    ad = world.adapters()
    ad.local_jobs = jobs
    old = os.umask(0)
    try:
        assert rem.locked_tick(world.cfg, NODE, ad).action == "resume"
    finally:
        os.umask(old)
    assert seen == [fcntl.FD_CLOEXEC]
    assert stat.S_IMODE(os.stat(lock).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(lock.parent).st_mode) == 0o755
    with open(lock) as after:
        fcntl.flock(after, fcntl.LOCK_EX | fcntl.LOCK_NB)  # freed once the step ended


def test_a_lock_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    world = World(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / "run" / "remediate.lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        rem.locked_tick(world.cfg, NODE, world.adapters())
    assert world.steps() == [] and world.resets == []


def test_the_real_adapters_call_slurm_and_the_gpu_layer_for_this_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import slurmhealth.gpu as gpu
    import slurmhealth.gpu.reset as reset
    import slurmhealth.hooks.validate as validate
    import slurmhealth.slurm as slurm
    from slurmhealth.hooks.validate import ValidateResult

    extra = {"slurm.command_timeout_s": 7.0, "slurm.backend": "cli"}
    world = World(tmp_path, validate_benchmarks=["nccl"], bug_report_timeout_s=42.0, extra=extra)
    cfg = world.cfg
    calls: list[tuple[Any, ...]] = []

    def called(name: str, answer: Any = None) -> Any:
        def fake(*args: Any) -> Any:
            calls.append((name, *args))
            return answer

        return fake

    monkeypatch.setattr(slurm, "open_slurm", called("open_slurm", world.slurm))
    monkeypatch.setattr(slurm, "reboot_node", called("reboot"))
    monkeypatch.setattr(slurm, "local_job_ids", called("listpids", ["7"]))
    monkeypatch.setattr(slurm, "node_partitions", called("sinfo", {"n1": ("gpu",)}))
    monkeypatch.setattr(gpu, "open_backend", called("open_backend", "backend"))
    monkeypatch.setattr(reset, "open_reset", called("open_reset", "reset"))
    monkeypatch.setattr(reset, "bug_report", called("bug_report", {"status": "ok"}))

    def run_validate(c: Config, benchmarks: list[str]) -> ValidateResult:
        calls.append(("validate", c, benchmarks))
        return ValidateResult(NODE, "r1", "fail", (), reasons=("gpu4 remap pending",))

    monkeypatch.setattr(validate, "run_validate", run_validate)
    ad = rem.adapters(cfg, world.history)
    assert ad.slurm is world.slurm and ad.history is world.history
    assert ad.open_gpu(1.0) == "backend" and ad.open_reset() == "reset"
    ad.reboot(NODE, REBOOTING)
    assert ad.local_jobs() == ["7"]
    assert ad.partitions() == {"n1": ("gpu",)}
    assert ad.bug_report("/ev") == {"status": "ok"}
    assert ad.validate() == (False, ["gpu4 remap pending"])
    assert calls == [
        ("open_slurm", "cli", 7.0),
        ("open_backend", cfg),
        ("open_reset", cfg),
        ("reboot", NODE, REBOOTING, 7.0),
        ("listpids", NODE, 7.0),
        ("sinfo", 7.0),
        ("bug_report", "/ev", 42.0),
        ("validate", cfg, ["nccl"]),
    ]


# -- what a tick reads ---------------------------------------------------------------------


def test_another_nodes_rows_in_a_shared_history_are_not_this_nodes(tmp_path: Path) -> None:
    world = World(tmp_path, max_attempts=3)
    other = rows.drain_row(T0 + 50, "n2", "drained", f"{REASON_PREFIX} nvlink", "epilog",
                           {"findings": [HANDS]})  # fmt: skip
    rebooting = rows.remediation_row("n2", "reboot", "rebooting", started=T0 + 60, ended=None,
                                     fault="nvlink")  # fmt: skip
    resets = [rows.remediation_row("n2", "reset", "failed", started=T0 + 70 + i, ended=None)
              for i in range(3)]  # fmt: skip
    inserts = [("drains", other), ("remediations", rebooting)]
    assert world.history.write(Batch(inserts=[*inserts, *(("remediations", r) for r in resets)]))
    assert world.tick() == rem.Step(NODE, "resume", "validated after a reset: back in service",
                                    FAULT, (4,))  # fmt: skip
    assert [r["outcome"] for r in remediation_rows(world.history, node="n2")][-1] == "rebooting"


def test_the_fault_is_the_one_the_drain_in_force_recorded(tmp_path: Path) -> None:
    world = World(tmp_path)
    later = rows.drain_row(T0 + 50, NODE, "suppressed", OURS, "slurmhealth epilog",
                           {"findings": [HANDS]})  # fmt: skip
    assert world.history.write(Batch(inserts=[("drains", later)]))
    assert world.tick().action == "resume" and world.resets == [((4,), world.snapshot)]


@pytest.mark.parametrize("detail", [{}, ["not", "a", "mapping"], {"findings": []}])
def test_a_drain_row_without_findings_names_no_fault_to_repair(tmp_path: Path, detail: Any) -> None:
    world = World(tmp_path)
    world.history.connection().execute("delete from drains")
    row = {**rows.drain_row(T0, NODE, "drained", OURS, "slurmhealth epilog", {}), "detail": detail}
    assert world.history.write(Batch(inserts=[("drains", row)]))
    assert world.tick() == rem.Step(NODE, "none", "no recorded fault to repair", FAULT)
    assert world.slurm.drains == [] and world.steps() == []


def test_a_fault_the_policy_reboots_for_is_rebooted_without_a_reset(tmp_path: Path) -> None:
    xid = {"check": "xid", "gpu": 2, "action": "reset", "message": "xid 79",
           "evidence": {"xid": 79}}  # fmt: skip
    world = World(tmp_path, findings=[xid])
    assert world.tick().action == "reboot"
    assert world.resets == [] and world.opened == [] and world.reboots == [(NODE, REBOOTING)]
    assert world.outcomes() == [("reboot", "rebooting")]


def _validations(world: World, count: int, first: float) -> None:
    """``count`` validate rows (not attempts) from ``first`` on, a second apart."""
    steps = [rows.remediation_row(NODE, "validate", "ok", started=first + i, ended=first + i,
                                  fault=FAULT) for i in range(count)]  # fmt: skip
    assert world.history.write(Batch(inserts=[("remediations", r) for r in steps]))


def test_a_tick_reads_the_nodes_hundred_newest_steps(tmp_path: Path) -> None:
    world = World(tmp_path, max_attempts=3)
    world.add_step("reset", "ok", T0 + 1)  # the 101st newest: not read, so not the last try
    _validations(world, 100, T0 + 2)
    assert world.tick().action == "resume" and world.reboots == []


def test_after_the_reboot_a_tick_reads_the_hundred_newest_steps_again(tmp_path: Path) -> None:
    world = World(tmp_path)  # max_attempts 2
    world.add_step("reset", "failed", T0 + 1)  # the 101st newest once the reboot is read
    _validations(world, 99, T0 + 2)
    reboot = rows.remediation_row(NODE, "reboot", "rebooting", started=T0 + 200, ended=None,
                                  fault=FAULT, detail={"reason": REBOOTING})  # fmt: skip
    assert world.history.write(Batch(inserts=[("remediations", reboot)]))
    world.t = T0 + 300
    world.slurm.table[NODE] = NodeInfo(NODE, "drained", REBOOTING, "root", T0)
    world.verdicts = [(False, ["row_remap gpu4 pending"])]
    step = world.tick()  # one attempt read (the reboot): a reset, not service required
    assert step.action == "resume" and world.resets == [((4,), world.snapshot)]


def test_after_the_reboot_another_nodes_steps_still_do_not_count(tmp_path: Path) -> None:
    world = _after_a_reboot(tmp_path)  # max_attempts 3: a reset and a reboot so far
    others = [rows.remediation_row("n2", "reset", "failed", started=world.t + i, ended=None)
              for i in range(3)]  # fmt: skip
    assert world.history.write(Batch(inserts=[("remediations", r) for r in others]))
    world.t += 10
    world.slurm.table[NODE] = NodeInfo(NODE, "drained", REBOOTING, "root", T0)
    world.verdicts = [(False, ["row_remap gpu4 pending"])]
    world.result = ResetResult(True, (4,), "nvidia-smi --gpu-reset -i 4", "GPU 4 reset")
    assert world.tick().action == "resume"  # a reset again, not service required
    assert world.outcomes()[-3:] == [("reset", "ok"), ("validate", "ok"), ("resume", "resumed")]


def test_the_incident_lists_the_fifty_newest_steps(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.add_step("reset", "failed", T0 + 1)
    world.add_step("reboot", "fault_returned", T0 + 2)
    _validations(world, 60, T0 + 3)
    step = world.tick()
    assert step.action == "service_required" and step.why.startswith("2 attempt(s) in ")
    (folder,) = world.reports
    doc = json.loads((Path(folder) / "incident.json").read_text())
    assert len(doc["steps"]) == 50 and doc["steps"][0]["started"] == T0 + 62


# -- the resume --------------------------------------------------------------------------------


def test_a_node_drained_by_an_admin_during_the_reset_is_not_resumed(tmp_path: Path) -> None:
    world = World(tmp_path)

    def validate() -> tuple[bool, list[str]]:
        world.slurm.table[NODE] = NodeInfo(NODE, "drained", "bios update", "alice", T0)
        return True, []

    ad = world.adapters()
    ad.validate = validate
    assert rem.tick(world.cfg, NODE, ad).action == "resume"
    assert world.slurm.resumes == [] and world.node().reason == "bios update"
    newest = drain_rows(world.history, node=NODE, limit=1)[0]
    assert newest["state"] == "resumed" and newest["detail"]["previous_reason"] == "bios update"


def test_a_node_missing_from_slurms_answer_at_the_resume_is_resumed(tmp_path: Path) -> None:
    world = World(tmp_path)

    def validate() -> tuple[bool, list[str]]:
        del world.slurm.table[NODE]  # sinfo's answer without it, this once
        return True, []

    ad = world.adapters()
    ad.validate = validate
    assert rem.tick(world.cfg, NODE, ad).action == "resume"
    assert world.slurm.resumes == [NODE]
    newest = drain_rows(world.history, node=NODE, limit=1)[0]
    assert newest["detail"]["previous_reason"] == OURS


def test_a_step_on_another_slurmd_of_this_host_takes_that_nodes_lock(tmp_path: Path) -> None:
    run = str(tmp_path / "run" / "{node}")
    world = World(tmp_path, extra={"node.name": "n0", "paths.run_dir": run})
    lock = tmp_path / "run" / NODE / "remediate.lock"
    lock.parent.mkdir(parents=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        step = rem.locked_tick(world.cfg, NODE, world.adapters())
    assert step == rem.Step(NODE, "skip", "another remediation step runs on this node")
    assert world.steps() == [] and world.resets == []
    assert rem.locked_tick(world.cfg, NODE, world.adapters()).action == "resume"
    assert not (tmp_path / "run" / "n0").exists()
