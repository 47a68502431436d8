"""Remediation on the real cluster: the health check run on a node as slurmd runs it (the
cluster's HealthCheckInterval stays 0, so nothing else races the scenarios), real
`scontrol reboot ASAP nextstate=RESUME` through the cluster's RebootProgram
(scripts/cluster-reboot: restarts the node's slurmd with -b and reboots its simulated GPUs),
the simulator's fault lifetimes (`clears_on`), the nodes' histories.

Every wait is on an event (a state in sinfo, a line in the reboot log) with a generous
deadline: a reboot here is a slurmd restart plus its registration, a few seconds."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import REPO, Cluster

BIN = REPO / ".venv" / "bin" / "slurmhealth"
REBOOT_DEADLINE_S = 120.0


def _lifetime(node: str, gpu: int, clears_on: str, **fields: object) -> str:
    sets = "\n".join(f"{k} = {json.dumps(v)}" for k, v in fields.items())
    return f'[nodes.{node}.gpu.{gpu}]\n{sets}\nclears_on = "{clears_on}"\n'


RESET_N2 = _lifetime("n2", 4, "reset", remap_pending=True)


@dataclass
class Remediation:
    cluster: Cluster
    config: Path

    def write_config(self, enabled: bool = True, **remediate: object) -> None:
        base = (self.cluster.dir / "slurmhealth.toml").read_text()
        extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in remediate.items())
        self.config.write_text(
            f"{base}\n[policy]\ndrain_max_share = 0.67\n\n"
            f"[remediate]\nenabled = {json.dumps(enabled)}\nmax_attempts = 2\n{extra}"
        )

    def run(self, node: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "SLURMD_NODENAME": node, "SLURMHEALTH_CONFIG": str(self.config)}
        return subprocess.run([str(BIN), *args], capture_output=True, text=True, env=env,
                              timeout=120, check=False)  # fmt: skip

    def healthcheck(self, node: str) -> dict[str, Any]:
        """`slurmhealth healthcheck` on ``node`` as slurmd runs it (it always exits 0)."""
        proc = self.run(node, "--json", "healthcheck")
        assert proc.returncode == 0 and proc.stdout, proc.stderr
        data: dict[str, Any] = json.loads(proc.stdout)
        return data

    def rows(self, node: str, table: str) -> list[dict[str, Any]]:
        db = self.cluster.node_db(node)
        if not db.exists():
            return []
        with sqlite3.connect(db, timeout=30) as conn:
            conn.row_factory = sqlite3.Row
            return [dict(r) for r in conn.execute(f"select * from {table} order by rowid")]

    def steps(self, node: str) -> list[tuple[str, str]]:
        return [(r["action"], r["outcome"]) for r in self.rows(node, "remediations")]

    def wait_back(self, node: str, since_lines: int) -> None:
        """Until the RebootProgram restarted ``node``'s slurmd and it registered again."""
        log = self.cluster.dir / "log" / "reboot.log"
        deadline = time.monotonic() + REBOOT_DEADLINE_S
        while True:
            lines = log.read_text().splitlines()[since_lines:] if log.exists() else []
            restarted = any(f"reboot {node}: slurmd restarted" in ln for ln in lines)
            state = self.cluster.node_states().get(node, "")
            # idle (nextstate=RESUME), or drained again by the health check slurmd runs
            # at its start when the fault is back
            if restarted and state in ("idle", "drained"):
                return
            assert time.monotonic() < deadline, (state, lines, self.cluster.sinfo_reasons())
            time.sleep(0.5)

    def wait_in_service(self, node: str, timeout: float = 30.0) -> None:
        """Until sinfo shows ``node`` idle without a reason (the resume has landed)."""
        deadline = time.monotonic() + timeout
        while True:
            state, reasons = self.cluster.node_states().get(node), self.cluster.sinfo_reasons()
            if state == "idle" and node not in reasons:
                return
            assert time.monotonic() < deadline, (state, reasons)
            time.sleep(0.2)

    def reboot_log_lines(self) -> int:
        log = self.cluster.dir / "log" / "reboot.log"
        return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.fixture
def remediation(healthy: Cluster, tmp_path: Path) -> Iterator[Remediation]:
    healthy.reset_node_data()  # each test counts its own attempts
    r = Remediation(healthy, tmp_path / "config.toml")
    r.write_config()
    yield r
    for node in ("n1", "n2", "n3"):
        (healthy.node_dir(node) / "reboot.hold").unlink(missing_ok=True)
    for node in ("n1", "n2", "n3"):  # a reboot still under way ends before the next test
        deadline = time.monotonic() + REBOOT_DEADLINE_S
        while "reboot" in healthy.node_states().get(node, "") and time.monotonic() < deadline:
            time.sleep(0.5)


def test_reset_fault_repaired_without_an_admin_and_an_admins_drain_untouched(
    remediation: Remediation,
) -> None:
    c = remediation.cluster
    c.set_scenario(RESET_N2 + _lifetime("n3", 1, "reset", remap_pending=True))
    c.scontrol("update", "nodename=n3", "state=drain", "reason=maintenance: cable swap")
    remediation.write_config(enabled=False)
    assert remediation.healthcheck("n2")["drain"]["state"] == "drained"
    assert c.sinfo_reasons()["n2"].startswith("slurmhealth: row_remap gpu4")
    plan = json.loads(remediation.run("n2", "remediate", "--dry-run", "--json").stdout)
    planned = {n["node"]: n for n in plan["nodes"]}
    assert planned["n2"]["action"] == "reset" and 4 in planned["n2"]["gpus"]
    assert planned["n3"]["action"] == "none" and "not by slurmhealth" in planned["n3"]["why"]

    remediation.write_config(enabled=True)
    step = remediation.healthcheck("n2")["remediation"]
    assert step["action"] == "resume", step
    remediation.wait_in_service("n2")
    assert remediation.steps("n2") == [("reset", "ok"), ("validate", "ok"), ("resume", "resumed")]
    assert [d["state"] for d in remediation.rows("n2", "drains")] == ["drained", "resumed"]
    assert remediation.healthcheck("n2")["status"] == "ok"  # the reset cleared the fault

    out = remediation.healthcheck("n3")  # the admin's drain: checked, never touched
    assert out["status"] == "fail" and out["remediation"]["action"] == "none"
    assert c.sinfo_reasons()["n3"] == "maintenance: cable swap"
    assert remediation.steps("n3") == []
    nodes = json.loads(remediation.run("n2", "nodes", "--json").stdout)["nodes"]
    shown = {n["node"]: n["remediation"] for n in nodes}
    assert shown["n2"]["action"] == "resume" and shown["n3"] is None


def test_a_fault_a_reset_cannot_clear_is_rebooted_and_resumed(remediation: Remediation) -> None:
    c = remediation.cluster
    c.set_scenario(_lifetime("n2", 3, "reboot", lost=True))
    logged = remediation.reboot_log_lines()
    slurmd_pid = (c.dir / "run" / "slurmd.n2.pid").read_text().strip()
    step = remediation.healthcheck("n2")["remediation"]
    assert step["action"] == "reboot", step
    remediation.wait_back("n2", logged)
    assert (c.dir / "run" / "slurmd.n2.pid").read_text().strip() != slurmd_pid
    out = remediation.healthcheck("n2")
    assert out["status"] == "ok" and out["remediation"]["action"] == "resume", out
    assert remediation.steps("n2") == [("reset", "failed"), ("reboot", "validated")]
    reset = remediation.rows("n2", "remediations")[0]
    assert "Unable to reset GPU" in json.loads(reset["detail"])["output"]
    remediation.wait_in_service("n2")


def test_a_fault_that_never_clears_ends_as_service_required(remediation: Remediation) -> None:
    c = remediation.cluster
    c.set_scenario(_lifetime("n2", 3, "never", lost=True))
    logged = remediation.reboot_log_lines()
    assert remediation.healthcheck("n2")["remediation"]["action"] == "reboot"
    remediation.wait_back("n2", logged)
    step = remediation.healthcheck("n2")["remediation"]
    assert step["action"] == "service_required", step
    assert c.sinfo_reasons()["n2"].startswith("slurmhealth: service required: gpu_lost gpu3")
    assert remediation.steps("n2") == [
        ("reset", "failed"), ("reboot", "fault_returned"), ("service_required", "service_required")
    ]  # fmt: skip
    (incident,) = (c.dir / "evidence" / "remediation").glob("n2-*/incident.json")
    doc = json.loads(incident.read_text())
    assert doc["attempts"] == 2 and doc["nvidia_bug_report"]["status"] == "skipped"
    assert remediation.healthcheck("n2")["remediation"]["action"] == "none"  # waits for hands
    assert c.node_states()["n2"].startswith("drain")


def test_a_node_with_a_running_job_is_not_reset_until_the_job_ends(
    remediation: Remediation,
) -> None:
    c = remediation.cluster
    release = c.home / "release-remediate"
    release.unlink(missing_ok=True)
    job = c.sbatch("-w", "n2", "--gres=gpu:1", "--wrap",
                   f"while [ ! -e {release} ]; do sleep 0.2; done", wait=False)  # fmt: skip
    c.wait_job(job.job_id, states=frozenset({"RUNNING"}))
    c.set_scenario(RESET_N2)  # GPU 4: not the job's
    out = remediation.healthcheck("n2")
    assert out["drain"]["state"] == "drained" and out["remediation"]["action"] == "wait"
    assert remediation.steps("n2") == [] and c.job(job.job_id)["JobState"] == "RUNNING"
    assert c.node_states()["n2"] in ("draining", "drng")
    release.touch()
    c.wait_job(job.job_id)
    deadline = time.monotonic() + 60
    while c.node_states()["n2"] != "drained":
        assert time.monotonic() < deadline, c.node_states()
        time.sleep(0.2)
    assert remediation.healthcheck("n2")["remediation"]["action"] == "resume"
    assert remediation.steps("n2")[0] == ("reset", "ok")
    release.unlink(missing_ok=True)


def test_two_faulty_nodes_with_k_1_remediate_one_at_a_time(remediation: Remediation) -> None:
    c = remediation.cluster
    remediation.write_config(max_concurrent=1, max_fraction=1.0)
    c.set_scenario(
        _lifetime("n1", 2, "reboot", lost=True) + _lifetime("n2", 5, "reboot", lost=True)
    )
    hold = c.node_dir("n1") / "reboot.hold"
    hold.touch()  # n1's reboot waits until the test lets it go
    logged = remediation.reboot_log_lines()
    assert remediation.healthcheck("n1")["remediation"]["action"] == "reboot"
    step = remediation.healthcheck("n2")["remediation"]
    assert step["action"] == "skip" and "n1" in step["why"], step
    assert remediation.steps("n2") == [] and c.sinfo_reasons()["n2"].startswith(
        "slurmhealth: gpu_lost gpu5"
    )
    hold.unlink()
    remediation.wait_back("n1", logged)
    assert remediation.healthcheck("n1")["remediation"]["action"] == "resume"
    logged = remediation.reboot_log_lines()
    assert remediation.healthcheck("n2")["remediation"]["action"] == "reboot"
    remediation.wait_back("n2", logged)
    assert remediation.healthcheck("n2")["remediation"]["action"] == "resume"
    n1 = remediation.rows("n1", "remediations")
    n2 = remediation.rows("n2", "remediations")
    assert n2[0]["started"] >= max(r["ended"] for r in n1 if r["ended"])  # one at a time
