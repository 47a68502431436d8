"""Remediation (hooks/remediate.py) over a recording Slurm backend and the real rest: the
simulated NVML with fault lifetimes, its reset through the GPU layer, the validation, a
history in tmp_path. Slurm's own side (scontrol reboot, the RebootProgram, nextstate=RESUME)
is tests/integration/test_remediate.py's."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

from slurmhealth.checks.remediation import plan
from slurmhealth.config import Config, load_config
from slurmhealth.errors import ScenarioError
from slurmhealth.gpu import open_backend
from slurmhealth.gpu.reset import open_reset, preconditions, record_sim_reboot
from slurmhealth.gpu.scenario import load_scenario
from slurmhealth.gpu.sim import SimulatedNvml
from slurmhealth.history import History
from slurmhealth.hooks import remediate as rem
from slurmhealth.hooks.healthcheck import run_healthcheck
from slurmhealth.hooks.prolog import Adapters
from slurmhealth.hooks.remediate_plan import plan_fleet
from slurmhealth.metrics.node import NodeFacts, node_families, read_history
from slurmhealth.slurm import NodeInfo
from tests.support.recording_slurm import RecordingSlurm
from tests.support.sim_config import hook_flags
from tests.unit.test_hooks_decisions import _rows

NODE = "n1"


class _Families:
    def __init__(self, facts: NodeFacts) -> None:
        self.facts = facts

    def collect(self) -> Iterator[Metric]:
        return node_families(self.facts)


FAULTS = {
    "reset": '[gpu.4]\nremap_pending = true\nclears_on = "reset"\n',
    "reboot": '[gpu.3]\nlost = true\nclears_on = "reboot"\n',
    "never": '[gpu.3]\nlost = true\nclears_on = "never"\n',
}


def _config(tmp_path: Path, fault: str, **flags: Any) -> Config:
    tmp_path.mkdir(parents=True, exist_ok=True)
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(f'name = "lifetime"\n{FAULTS[fault]}')
    (tmp_path / "config.toml").write_text("")
    return load_config(
        str(tmp_path / "config.toml"),
        env={},
        flags={**hook_flags(tmp_path, scenario), "remediate.enabled": True,
               "policy.drain_max_share": 0.5, **flags},
    )  # fmt: skip


class Fleet:
    """A recording Slurm backend of three idle nodes, a reboot that 'reboots' the simulated
    node (and applies nextstate=RESUME), and the local slurmd's answer of running jobs."""

    def __init__(self, cfg: Config, *nodes: NodeInfo) -> None:
        given = {n.name: n for n in nodes}
        self.slurm = RecordingSlurm(
            [given.get(f"n{i}", NodeInfo(f"n{i}", "idle")) for i in (1, 2, 3)]
        )
        self.cfg = cfg
        self.reboots: list[tuple[str, str]] = []
        self.jobs: list[str] | None = []

    def reboot(self, node: str, reason: str) -> None:
        self.reboots.append((node, reason))
        self.slurm.table[node] = NodeInfo(node, "reboot^", reason, "root", 1.0)

    def finish_reboot(self, node: str) -> None:
        record_sim_reboot(self.cfg)
        self.slurm.table[node] = NodeInfo(node, "idle")

    def check(self) -> None:
        """The health check as slurmd runs it: it drains a failing node."""
        with History(self.cfg.db_path()) as history:
            adapters = Adapters(self.slurm, lambda _t: open_backend(self.cfg), history)
            run_healthcheck(self.cfg, NODE, adapters, lambda: self.jobs)

    def tick(self) -> rem.Step:
        real = rem.adapters(self.cfg, History(self.cfg.db_path()))
        ad = rem.RemediateAdapters(
            slurm=self.slurm, history=real.history, open_gpu=real.open_gpu,
            open_reset=real.open_reset, reboot=self.reboot, validate=real.validate,
            local_jobs=lambda: self.jobs, bug_report=real.bug_report,
        )  # fmt: skip
        try:
            return rem.tick(self.cfg, NODE, ad)
        finally:
            ad.history.close()

    def steps(self) -> list[tuple[str, str]]:
        rows = _rows(Path(self.cfg.db_path()), "remediations")
        return [(r["action"], r["outcome"]) for r in rows]


def _gpu_fault_seen(cfg: Config) -> bool:
    lib = SimulatedNvml(load_scenario(cfg.gpu.sim_scenario), NODE,
                        kernel_log_path=cfg.gpu.sim_kernel_log)  # fmt: skip
    return bool(lib.field(4, "remap_pending") or lib.field(3, "lost"))


def test_the_policy_is_the_tables_first_step() -> None:
    def one(check: str, action: str, gpu: int | None = 4, **evidence: Any) -> str:
        finding = {"check": check, "gpu": gpu, "action": action, "message": "m",
                   "evidence": evidence}  # fmt: skip
        return plan([finding]).step

    assert one("row_remap", "reset") == "reset"
    assert one("gpu_lost", "reset") == "reset"
    assert one("xid", "reset", xid=79) == "reboot"  # the catalog's RESTART_BM
    assert one("gpu_lost", "reset", gpu=None) == "reboot"  # nothing to reset on its own
    assert one("nvlink_inactive", "drain") == "none"  # needs hands
    mixed = plan([{"check": "row_remap", "gpu": 4, "action": "reset"},
                  {"check": "nvlink_inactive", "gpu": 1, "action": "drain"}])  # fmt: skip
    assert mixed.step == "none" and "nvlink_inactive gpu1" in mixed.why


def test_fault_lifetimes_in_the_simulator(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "reset")
    assert _gpu_fault_seen(cfg)
    backend = open_backend(cfg)
    snapshot = backend.snapshot(None)
    backend.close()
    gpus, refused, notes = preconditions(snapshot, [4])
    assert refused == "" and gpus == tuple(range(8)) and "NVSwitch" in notes[0]  # HGX H100
    result = open_reset(cfg).reset([4], snapshot)
    assert result.ok and "successfully reset" in result.output
    assert not _gpu_fault_seen(cfg)  # a new process sees the reset GPU
    for lifetime in ("reboot", "never"):
        cfg = _config(tmp_path / lifetime, lifetime)
        assert not open_reset(cfg).reset([3], snapshot).ok and _gpu_fault_seen(cfg)
        record_sim_reboot(cfg)
        assert _gpu_fault_seen(cfg) is (lifetime == "never")


def test_a_bad_lifetime_is_a_scenario_error(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[[faults]]\nset = { lost = true }\nclears_on = "power"\n')
    with pytest.raises(ScenarioError, match="clears_on"):
        load_scenario(str(path))


def test_reset_fault_is_reset_validated_and_resumed(tmp_path: Path) -> None:
    fleet = Fleet(_config(tmp_path, "reset"))
    fleet.check()
    assert fleet.slurm.table[NODE].drained
    step = fleet.tick()
    assert (step.action, step.gpus) == ("resume", tuple(range(8)))
    assert fleet.steps() == [("reset", "ok"), ("validate", "ok"), ("resume", "resumed")]
    assert fleet.slurm.resumes == [NODE] and not fleet.slurm.table[NODE].drained
    assert fleet.reboots == [] and not _gpu_fault_seen(fleet.cfg)
    drains = [d["state"] for d in _rows(Path(fleet.cfg.db_path()), "drains")]
    assert drains == ["drained", "resumed"]


def test_failed_reset_reboots_then_validates(tmp_path: Path) -> None:
    fleet = Fleet(_config(tmp_path, "reboot"))
    fleet.check()
    assert fleet.tick().action == "reboot"
    ((node, reason),) = fleet.reboots
    assert node == NODE and reason.startswith("slurmhealth: rebooting: gpu_lost gpu3")
    assert fleet.tick().action == "wait"  # while Slurm reboots it
    fleet.finish_reboot(NODE)
    step = fleet.tick()
    assert step.action == "resume" and not fleet.slurm.table[NODE].drained
    assert fleet.steps() == [("reset", "failed"), ("reboot", "validated")]


def test_a_fault_that_never_clears_ends_as_service_required(tmp_path: Path) -> None:
    fleet = Fleet(_config(tmp_path, "never"))
    fleet.check()
    assert fleet.tick().action == "reboot"
    fleet.finish_reboot(NODE)
    fleet.check()  # the node is back in service and fails again: drained
    step = fleet.tick()
    assert step.action == "service_required"
    reason = fleet.slurm.table[NODE].reason
    assert reason.startswith("slurmhealth: service required: gpu_lost gpu3")
    assert fleet.steps() == [("reset", "failed"), ("reboot", "fault_returned"),
                             ("service_required", "service_required")]  # fmt: skip
    (incident,) = tmp_path.glob("evidence/remediation/n1-*/incident.json")
    doc = json.loads(incident.read_text())
    assert doc["attempts"] == 2 and doc["fault"].startswith("gpu_lost gpu3")
    assert doc["nvidia_bug_report"]["status"] in ("skipped", "ok", "failed")
    assert fleet.tick().action == "none"  # and stays so until a person acts
    facts = NodeFacts(NODE)
    read_history(facts, fleet.cfg.db_path())
    registry = CollectorRegistry()
    registry.register(_Families(facts))  # type: ignore[arg-type]
    value = registry.get_sample_value
    assert value("slurmhealth_node_service_required", {"node": NODE}) == 1.0
    assert value("slurmhealth_remediation_in_progress", {"node": NODE}) == 0.0
    labels = {"node": NODE, "action": "reboot", "outcome": "fault_returned"}
    assert value("slurmhealth_remediations_total", labels) == 1.0


def test_a_node_with_a_running_job_is_not_touched_until_it_ends(tmp_path: Path) -> None:
    fleet = Fleet(_config(tmp_path, "reset"))
    fleet.jobs = ["77"]
    fleet.check()
    fleet.slurm.table[NODE] = NodeInfo(NODE, "draining", fleet.slurm.table[NODE].reason)
    step = fleet.tick()
    assert step.action == "wait" and "77" in step.why
    assert fleet.steps() == [] and _gpu_fault_seen(fleet.cfg)
    fleet.jobs = []
    fleet.slurm.table[NODE] = NodeInfo(NODE, "drained", fleet.slurm.table[NODE].reason)
    assert fleet.tick().action == "resume"


def test_an_admins_drain_is_left_alone(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "reset")
    fleet = Fleet(cfg, NodeInfo(NODE, "drained", "maintenance: cable swap", "alice", 5.0))
    fleet.check()
    step = fleet.tick()
    assert step.action == "none" and "alice" in step.why
    assert fleet.slurm.table[NODE].reason == "maintenance: cable swap"
    assert fleet.slurm.resumes == [] and fleet.steps() == [] and _gpu_fault_seen(cfg)


def test_the_breaker_holds_a_second_node(tmp_path: Path) -> None:
    busy = NodeInfo("n2", "reboot^", "slurmhealth: rebooting: gpu_lost gpu1", "root", 1.0)
    fleet = Fleet(_config(tmp_path, "reset", **{"remediate.max_fraction": 1.0}), busy)
    fleet.check()
    step = fleet.tick()
    assert step.action == "skip" and "n2" in step.why
    assert fleet.steps() == [] and _gpu_fault_seen(fleet.cfg)
    fleet.slurm.table["n2"] = NodeInfo("n2", "idle")
    assert fleet.tick().action == "resume"


def test_dry_run_lists_the_planned_action_of_each_node(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "reset")
    finding = {"check": "row_remap", "gpu": 4, "action": "reset", "message": "pending"}
    drained = [{"detail": {"findings": [finding]}}]
    nodes = [NodeInfo("n1", "drained", "slurmhealth: row_remap gpu4 pending", "root", 1.0),
             NodeInfo("n2", "drained", "slurmhealth: row_remap gpu4 pending", "root", 2.0),
             NodeInfo("n3", "drained", "maintenance", "alice", 3.0)]  # fmt: skip
    steps: dict[str, Sequence[dict[str, Any]]] = {
        "n1": [],
        "n2": [{"action": "reset", "started": 9e9}],
    }

    def history_of(node: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        return (drained, list(steps[node])) if node in steps else None

    doc = plan_fleet(cfg, nodes, dict, history_of, now=1e10)
    got = {r["node"]: (r["action"], r["gpus"]) for r in doc["nodes"]}
    assert got == {"n1": ("reset", [4]), "n2": ("skip", []), "n3": ("none", [])}
    assert doc["limit"] == 1 and doc["enabled"] is True


def test_the_report_of_the_job_that_met_the_fault_names_the_repair(tmp_path: Path) -> None:
    """The epilog of job 4242 drained the node; its report lists what remediation did."""
    from slurmhealth.diagnose.facts import Facts
    from slurmhealth.history import Batch, rows
    from slurmhealth.history.read import Reader
    from slurmhealth.model_records import Job
    from slurmhealth.report.answer import admin_done
    from slurmhealth.summary.collect import node_facts

    cfg = _config(tmp_path, "reset")
    finding = {"check": "row_remap", "gpu": 4, "action": "reset", "message": "remap pending"}
    reason = "slurmhealth: row_remap gpu4 remap pending"
    row = rows.drain_row(1.0e9, NODE, "drained", reason, "slurmhealth epilog",
                         {"findings": [finding]})  # fmt: skip
    with History(cfg.db_path()) as history:
        assert history.write(Batch(inserts=[("drains", {**row, "job_id": "4242"})]))
    fleet = Fleet(cfg, NodeInfo(NODE, "drained", reason, "root", 1.0e9))
    assert fleet.tick().action == "resume"
    with Reader(cfg.db_path()) as db:
        facts = node_facts(db, "4242", NODE)
    assert [(r["action"], r["outcome"]) for r in facts.remediations] == [
        ("reset", "ok"), ("validate", "ok"), ("resume", "resumed")]  # fmt: skip
    done, _ = admin_done(Facts(Job("4242"), (facts,)))
    assert any(line.startswith("n1: remediation reset: ok at ") for line in done), done


def test_remediate_command_help_usage_and_a_disabled_run(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    env = {"PATH": os.environ.get("PATH", ""), "SLURMHEALTH_CONFIG": str(tmp_path / "c.toml")}
    (tmp_path / "c.toml").write_text("")
    shown = run_cli("remediate", "--help", env=env)
    assert shown.returncode == 0 and "slurmhealth remediate --dry-run --json" in shown.stdout
    both = run_cli("remediate", "--dry-run", "--run", env=env)
    assert both.returncode == 2 and len(both.stderr.strip().splitlines()) == 1, both.stderr
    off = run_cli("remediate", "--run", env=env)  # [remediate] enabled = false by default
    assert off.returncode == 1 and "disabled" in off.stderr and "Traceback" not in off.stderr


def test_a_crash_mid_repair_gives_the_claim_back(tmp_path: Path) -> None:
    """A tick that fails after claiming the node must not hold the breaker for good."""
    fleet = Fleet(_config(tmp_path, "reset"))
    fleet.check()
    drained = fleet.slurm.table[NODE].reason
    real = rem.adapters(fleet.cfg, History(fleet.cfg.db_path()))

    def broken(_timeout: float) -> Any:
        raise OSError("NVML went away")

    ad = rem.RemediateAdapters(
        slurm=fleet.slurm, history=real.history, open_gpu=broken, open_reset=real.open_reset,
        reboot=fleet.reboot, validate=real.validate, local_jobs=lambda: [],
        bug_report=real.bug_report,
    )  # fmt: skip
    with pytest.raises(OSError):
        rem.tick(fleet.cfg, NODE, ad)
    ad.history.close()
    assert fleet.slurm.table[NODE].reason == drained  # not "slurmhealth: remediating: ..."


def test_a_reboot_slurm_gave_up_on_is_closed_as_failed(tmp_path: Path) -> None:
    fleet = Fleet(_config(tmp_path, "reboot"))
    fleet.check()
    assert fleet.tick().action == "reboot"
    fleet.slurm.table[NODE] = NodeInfo(NODE, "down", "reboot timed out", "root", 2.0)
    step = fleet.tick()
    assert step.action == "none" and "reboot timed out" in step.why
    assert fleet.steps() == [("reset", "failed"), ("reboot", "failed")]


def test_a_nodes_gpu_table_with_a_lifetime_faults_only_that_node(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('[nodes.n2.gpu.4]\nremap_pending = true\nclears_on = "reboot"\n')
    scenario = load_scenario(str(path))
    (fault,) = scenario.for_node("n2").faults
    assert (fault.gpus, fault.clears_on, dict(fault.set)) == (
        (4,),
        "reboot",
        {"remap_pending": True},
    )
    assert scenario.for_node("n1").faults == ()
    assert scenario.for_node("n2").gpus[4]["remap_pending"] is False  # the lasting state


def test_one_remediation_step_at_a_time_on_a_node(tmp_path: Path) -> None:
    """The health check and a timer's `remediate --run` never act on one node at once."""
    import fcntl

    fleet = Fleet(_config(tmp_path, "reset"))
    fleet.check()
    lock = Path(fleet.cfg.expand(fleet.cfg.paths.run_dir)) / "remediate.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        real = rem.adapters(fleet.cfg, History(fleet.cfg.db_path()))
        step = rem.locked_tick(fleet.cfg, NODE, real)
        real.history.close()
    assert step.action == "skip" and "another" in step.why
    assert fleet.steps() == [] and _gpu_fault_seen(fleet.cfg)
