"""The prolog and epilog on a real Slurm cluster: drains, reasons, requeues, fail-open."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.conftest import Cluster
from tests.support.skips import optional_extra

NVLINK_DOWN_ON_N2 = """
name = "n2-nvlink-down"
[nodes.n2.gpu.3]
nvlink.7.state = "inactive"
"""
NVLINK_DOWN_EVERYWHERE = """
name = "all-nvlink-down"
[gpu.3]
nvlink.7.state = "inactive"
"""
XID_ON_N3_DURING_JOB = """
name = "n3-xid79"
[[nodes.n3.faults]]
gpu = 0
at = 4
xid = 79
xid_message = "GPU has fallen off the bus."
"""


def rows(db: Path, sql: str, *params: object) -> list[sqlite3.Row]:
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        return list(conn.execute(sql, params))


def slurmhealth(
    cluster: Cluster, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`slurmhealth ARGS` with the cluster's config, as an operator on the host runs it."""
    return subprocess.run(
        [sys.executable, "-m", "slurmhealth", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "SLURMHEALTH_CONFIG": str(cluster.dir / "slurmhealth.toml"),
            **(env or {}),
        },
    )


def test_healthy_multinode_job_records_a_prolog_run_on_every_node(healthy: Cluster) -> None:
    job = healthy.sbatch("-N3", "--gres=gpu:8", "--wrap", "srun hostname")
    assert job.state == "COMPLETED", job.record
    assert job.nodes == ["n1", "n2", "n3"]
    for node in job.nodes:
        runs = rows(
            healthy.node_db(node),
            "select * from check_runs where job_id = ? and phase = 'prolog'",
            job.job_id,
        )
        assert len(runs) == 1 and runs[0]["status"] == "ok", node
        assert json.loads(runs[0]["gpus"]) == list(range(8))
        (rec,) = rows(healthy.node_db(node), "select * from jobs where job_id = ?", job.job_id)
        assert rec["user"] == "shuser" and rec["partition"] == "gpu"
        assert rec["state"] == "completed" and rec["end_ts"] >= rec["start_ts"]
    assert healthy.sinfo_reasons() == {}


def test_nvlink_down_on_n2_drains_it_and_jobs_complete_elsewhere(healthy: Cluster) -> None:
    healthy.set_scenario(NVLINK_DOWN_ON_N2)
    t0 = time.time()
    jobs = [
        healthy.sbatch("-N1", "--gres=gpu:8", "--wrap", "sleep 1", wait=False) for _ in range(3)
    ]
    done = [healthy.wait_job(j.job_id, timeout=90) for j in jobs]
    assert [j.state for j in done] == ["COMPLETED"] * 3, [j.record for j in done]
    n2_runs = [
        (r["job_id"], r["status"], r["error"])
        for r in rows(healthy.node_db("n2"), "select * from check_runs where ts >= ?", t0)
    ]
    assert all(j.nodes and j.nodes[0] in ("n1", "n3") for j in done), (
        [j.nodes for j in done],
        n2_runs,
        healthy.log_text()[-3000:],
    )
    reasons = healthy.sinfo_reasons()
    assert set(reasons) == {"n2"}
    assert reasons["n2"].startswith("slurmhealth: nvlink_inactive gpu3 NVLink 7")
    (drain,) = rows(
        healthy.node_db("n2"), "select * from drains where state = 'drained' and ts >= ?", t0
    )
    assert drain["reason"] == reasons["n2"] and drain["job_id"] in {j.job_id for j in jobs}
    findings = rows(
        healthy.node_db("n2"), "select * from findings where run_id = ?", drain["run_id"]
    )
    assert [(f["check_name"], f["gpu"]) for f in findings] == [("nvlink_inactive", 3)]


def test_xid_during_a_job_drains_from_the_epilog(healthy: Cluster) -> None:
    healthy.set_scenario(XID_ON_N3_DURING_JOB)  # Xid 79 on n3 four seconds from now
    t0 = time.time()
    job = healthy.sbatch("-N1", "-w", "n3", "--gres=gpu:8", "--wrap", "sleep 7", timeout=60)
    assert job.state == "COMPLETED"
    prolog = rows(
        healthy.node_db("n3"),
        "select status from check_runs where job_id = ? and phase = 'prolog'",
        job.job_id,
    )
    assert [r["status"] for r in prolog] == ["ok"]  # healthy when the job started
    deadline = time.monotonic() + 20
    while "n3" not in healthy.sinfo_reasons() and time.monotonic() < deadline:
        time.sleep(0.2)
    reason = healthy.sinfo_reasons().get("n3", "")
    assert reason.startswith("slurmhealth: xid") and "Xid 79" in reason, reason
    assert "Epilog error" not in reason
    (drain,) = rows(
        healthy.node_db("n3"), "select * from drains where state = 'drained' and ts >= ?", t0
    )
    assert drain["job_id"] == job.job_id and drain["actor"] == "slurmhealth epilog"


def _set_env_file(path: Path, key: str, value: str) -> str:
    original = path.read_text()
    lines = [ln for ln in original.splitlines() if not ln.startswith(f"{key}=")]
    path.write_text("\n".join([*lines, f"{key}={value}"]) + "\n")
    return original


@pytest.mark.parametrize("breakage", ["unreadable config", "missing entry point"])
def test_broken_slurmhealth_fails_open(healthy: Cluster, breakage: str) -> None:
    healthy.set_scenario(NVLINK_DOWN_EVERYWHERE)  # would drain, if slurmhealth worked
    config = healthy.dir / "slurmhealth.toml"
    env_file = Path("/etc/default/slurmhealth")
    saved_config, saved_env = config.read_text(), env_file.read_text()
    log_before = len(healthy.log_text())
    try:
        if breakage == "unreadable config":
            config.write_text("[gpu\nbackend = 'sim'\n")
        else:
            _set_env_file(env_file, "SLURMHEALTH_BIN", "/nonexistent/slurmhealth")
        job = healthy.sbatch("-N1", "--gres=gpu:8", "--wrap", "true")
    finally:
        config.write_text(saved_config)
        env_file.write_text(saved_env)
    assert job.state == "COMPLETED"
    assert healthy.sinfo_reasons() == {}
    log = healthy.log_text()[log_before:]
    assert f"job={job.job_id}" in log
    assert "failing open" in log
    if breakage == "unreadable config":
        assert "invalid TOML" in log


def test_all_nodes_faulty_drains_at_most_one(healthy: Cluster) -> None:
    healthy.set_scenario(NVLINK_DOWN_EVERYWHERE)
    t0 = time.time()
    jobs = [
        healthy.sbatch("-N1", "--gres=gpu:8", "--wrap", "sleep 1", wait=False) for _ in range(3)
    ]
    done = [healthy.wait_job(j.job_id, timeout=90) for j in jobs]
    assert [j.state for j in done] == ["COMPLETED"] * 3
    reasons = healthy.sinfo_reasons()
    assert len(reasons) == 1, reasons
    (drained,) = reasons
    suppressed = []
    for node in {"n1", "n2", "n3"} - {drained}:
        sql = "select state from drains where ts >= ?"
        states = [r["state"] for r in rows(healthy.node_db(node), sql, t0)]
        assert "drained" not in states
        suppressed += states
    assert "suppressed" in suppressed
    log = healthy.log_text()
    assert "circuit breaker" in log


def test_admin_drain_is_never_overwritten_or_resumed(healthy: Cluster) -> None:
    healthy.scontrol("update", "nodename=n1", "state=drain", "reason=bad fan, ticket 1234")
    healthy.set_scenario(NVLINK_DOWN_EVERYWHERE)
    # a prolog finding a fault on the admin-drained node (a job allocated before the drain)
    prolog = slurmhealth(
        healthy,
        "prolog",
        env={"SLURM_JOB_ID": "999999", "SLURMD_NODENAME": "n1", "SLURM_JOB_GPUS": "3"},
    )
    assert prolog.returncode == 1  # the job must not run here
    assert "bad fan" in prolog.stderr
    assert healthy.sinfo_reasons()["n1"] == "bad fan, ticket 1234"
    (held,) = rows(healthy.node_db("n1"), "select * from drains where job_id = '999999'")
    assert held["state"] == "held"
    refused = slurmhealth(healthy, "resume", "n1", "--reason", "looks fine")
    assert refused.returncode == 1 and "--force" in refused.stdout
    assert healthy.sinfo_reasons()["n1"] == "bad fan, ticket 1234"
    forced = slurmhealth(healthy, "resume", "n1", "--reason", "fan replaced", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "n1" not in healthy.sinfo_reasons()
    states = [
        (r["state"], r["reason"])
        for r in rows(healthy.node_db("n1"), "select * from drains where job_id is null")
    ]
    assert ("resume_refused", "looks fine") in states and ("resumed", "fan replaced") in states


def test_resume_of_our_own_drain(healthy: Cluster) -> None:
    healthy.set_scenario(NVLINK_DOWN_ON_N2)
    job = healthy.sbatch("-N1", "-w", "n2", "--gres=gpu:8", "--wrap", "true", wait=False)
    deadline = time.monotonic() + 30
    while "n2" not in healthy.sinfo_reasons() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert healthy.sinfo_reasons()["n2"].startswith("slurmhealth:")
    subprocess.run(["scancel", job.job_id], check=False)
    healthy.set_scenario("healthy")
    refused = slurmhealth(healthy, "resume", "n2", "--reason", "link reseated")
    assert refused.returncode == 1 and "slurmhealth validate --node n2" in refused.stdout
    assert healthy.sinfo_reasons()["n2"].startswith("slurmhealth:")  # still drained
    checked = slurmhealth(
        healthy, "validate", "--node", "n2", "--benchmarks", "", env={"SLURMD_NODENAME": "n2"}
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    ok = slurmhealth(healthy, "resume", "n2", "--reason", "link reseated")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "n2" not in healthy.sinfo_reasons()
    listing = slurmhealth(healthy, "drains", "--node", "n2", "--json")
    states = [d["state"] for d in json.loads(listing.stdout)["drains"]]
    assert states[:3] == ["resumed", "resume_refused", "drained"]
    runs = rows(
        healthy.node_db("n2"), "select phase, status from check_runs where phase = 'validate'"
    )
    assert [(r["phase"], r["status"]) for r in runs][-1:] == [("validate", "ok")]


def test_optout_skips_checks_and_is_recorded(healthy: Cluster) -> None:
    healthy.set_scenario(NVLINK_DOWN_EVERYWHERE)
    job = healthy.sbatch(
        "-N1", "--gres=gpu:8", "--comment=slurmhealth=off", "--wrap", "true", timeout=60
    )
    assert job.state == "COMPLETED"
    assert healthy.sinfo_reasons() == {}
    node = job.nodes[0]
    runs = rows(healthy.node_db(node), "select * from check_runs where job_id = ?", job.job_id)
    assert {r["status"] for r in runs} == {"skipped"}
    assert all("slurmhealth=off" in r["error"] for r in runs)
    assert rows(healthy.node_db(node), "select * from findings where job_id = ?", job.job_id) == []


def test_pyslurm_backend_matches_the_cli_backend(healthy: Cluster) -> None:
    from slurmhealth.slurm import SlurmCli
    from slurmhealth.slurm import pyslurm_backend as slurm_pyslurm

    why = slurm_pyslurm.unavailable()
    if why is not None:
        optional_extra("pyslurm", why)
    cli = SlurmCli()
    cli.drain("n3", "slurmhealth: pyslurm comparison")
    try:
        via_cli = {n.name: (n.state, n.drained, n.reason) for n in cli.nodes()}
        via_pyslurm = {
            n.name: (n.state, n.drained, n.reason) for n in slurm_pyslurm.PySlurmBackend().nodes()
        }
    finally:
        healthy.resume_all()
    assert via_pyslurm == via_cli
    assert via_cli["n3"][1:] == (True, "slurmhealth: pyslurm comparison")


def test_cli_backend_reads_the_cluster(healthy: Cluster) -> None:
    from slurmhealth.slurm import SlurmCli

    cli = SlurmCli()
    nodes = {n.name: n for n in cli.nodes()}
    assert sorted(nodes) == ["n1", "n2", "n3"] and all(not n.drained for n in nodes.values())
    cli.drain("n3", "slurmhealth: test reason\nwith a newline")
    n3 = next(n for n in cli.nodes() if n.name == "n3")
    assert n3.drained and n3.ours and n3.reason == "slurmhealth: test reason with a newline"
    assert n3.reason_time is not None and abs(n3.reason_time - time.time()) < 120
    cli.resume("n3")
    time.sleep(0.5)
    assert not next(n for n in cli.nodes() if n.name == "n3").drained
    job = healthy.sbatch("-N1", "--gres=gpu:1", "--comment=tag x", "--wrap", "sleep 5", wait=False)
    healthy.wait_job(job.job_id, states=frozenset({"RUNNING"}), timeout=30)
    info = cli.job(job.job_id)
    assert info is not None and info.user == "shuser" and info.comment == "tag x"
    assert info.partition == "gpu" and info.priority is not None
    assert cli.job("987654321") is None  # unknown or long gone
