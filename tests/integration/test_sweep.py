"""``slurmhealth sweep`` on the real cluster: real sbatch jobs (sweep.sbatch) on n1..n3, a
stand-in all_reduce_perf (tests/fixtures/bin/sweep_all_reduce_perf: a recorded nccl-tests
output whose bandwidth depends on the job's hosts) and the verdict it gives."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Cluster

REPO = Path(__file__).resolve().parents[2]
SH = REPO / ".venv" / "bin" / "slurmhealth"
STANDIN = REPO / "tests" / "fixtures" / "bin" / "sweep_all_reduce_perf"


def _sweep(cluster: Cluster, tmp: Path, faults: str, *extra: str) -> tuple[int, dict[str, Any]]:
    argv = [str(SH), "--config", str(cluster.dir / "slurmhealth.toml"),
            "--db", str(tmp / "history.db"), "sweep", "--nodes", "n[1-3]",
            "--gpus-per-node", "1", "--time-limit", "2", "--command", str(STANDIN),
            "--job-env", "SWEEP_SRUN_MPI=--mpi=none", "--output-dir", str(tmp / "sweeps"),
            "--json", *extra]  # fmt: skip
    env = {**os.environ, "SWEEP_FAKE_FAULTS": faults}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=400)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _jobs_were_slurms(cluster: Cluster, record: dict[str, Any]) -> None:
    """Every result came from a job Slurm ran on exactly the unit's nodes, by the name the
    sweep gave it."""
    for r in record["results"]:
        job = cluster.wait_job(r["job_id"], timeout=30)
        assert job.state == "COMPLETED", (r, job.record.get("Reason"))
        assert job.nodes == r["nodes"]
        assert job.record["JobName"] == f"slurmhealth-sweep-{record['id']}"


@pytest.mark.parametrize(
    ("faults", "expected"),
    [("", []), ("link:n1+n3=0.5", [("link", ["n1", "n3"])])],
    ids=["healthy", "link-n1-n3"],
)
def test_sweep_names_the_link_or_nobody(
    healthy: Cluster, tmp_path: Path, faults: str, expected: list[tuple[str, list[str]]]
) -> None:
    rc, record = _sweep(healthy, tmp_path, faults)
    assert [(s["kind"], s["nodes"]) for s in record["suspects"]] == expected
    assert rc == (1 if expected else 0)
    assert not record["inconclusive"]
    _jobs_were_slurms(healthy, record)
    units = {tuple(u["nodes"]): u for u in record["units"]}
    assert set(units) == {("n1",), ("n2",), ("n3",), ("n1", "n2"), ("n1", "n3"), ("n2", "n3")}
    if expected:
        link = units[("n1", "n3")]
        assert link["status"] == "slow" and link["attempts"] == 3
        assert link["ratio"] == pytest.approx(0.5, abs=0.01)
        assert units[("n1", "n2")]["status"] == units[("n2", "n3")]["status"] == "ok"
        assert healthy.sinfo_reasons() == {}  # a link is never drained


def test_sweep_names_node_n2_and_drains_it(healthy: Cluster, tmp_path: Path) -> None:
    rc, record = _sweep(healthy, tmp_path, "node:n2=0.5", "--drain-suspects")
    assert rc == 1
    ((kind, nodes),) = [(s["kind"], s["nodes"]) for s in record["suspects"]]
    assert (kind, nodes) == ("node", ["n2"])
    pairs = {tuple(p["nodes"]): p for p in record["suspects"][0]["evidence"]["pairs"]}
    assert {k: p["status"] for k, p in pairs.items()} == {("n1", "n2"): "slow",
                                                          ("n2", "n3"): "slow"}  # fmt: skip
    _jobs_were_slurms(healthy, record)
    reasons = healthy.sinfo_reasons()
    assert set(reasons) == {"n2"}
    assert reasons["n2"].startswith("slurmhealth: sweep: node n2: slow with 2 of 2 partners")
    show = [str(SH), "--db", str(tmp_path / "history.db"), "sweep", "show", record["id"], "--json"]
    shown = subprocess.run(show, capture_output=True, text=True, timeout=60)
    assert json.loads(shown.stdout)["suspects"] == record["suspects"]
