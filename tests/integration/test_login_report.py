"""`slurmhealth report JOBID` on a login node: after a 3-node job where GPU 5 on n2 fell off
the bus, every node history and the evidence directory are gone; the job's owner, with a
config that names no node paths but a Prometheus that scraped the job, gets the same
verdict, fault class, drain and per-GPU statistics from slurmdbd (sacct, the AdminComment
summary ctld-epilog stored, sacctmgr's node events) and Prometheus. Another user is refused.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from slurmhealth.summary.admin_comment import decode
from tests.integration.conftest import Cluster
from tests.integration.test_report import GPU5_OFF_THE_BUS_ON_N2, _as_user, _needs_user_python
from tests.integration.test_sidecar import Fleet
from tests.integration.test_sidecar import fleet as scraped  # noqa: F401 (a fixture)

NODES = ("n1", "n2", "n3")
STATS = ("util_mean", "power_mean_w", "mem_peak_bytes", "temp_max_c")


def _admin_comment(job_id: str, timeout: float = 60) -> str:
    """The job's AdminComment once ctld-epilog stored it."""
    deadline = time.monotonic() + timeout
    while True:
        out = subprocess.run(["sacct", "-j", job_id, "-X", "-o", "AdminComment", "-P", "-n"],
                             capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
        if out.stdout.strip() or time.monotonic() > deadline:
            return out.stdout.strip()
        time.sleep(0.5)


def _report(job_id: str, cluster: Cluster, config: Path | None = None) -> dict[str, Any]:
    proc = _as_user("shuser", "report", job_id, "--json", cluster=cluster, config=config)
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def _drained(report: dict[str, Any]) -> set[tuple[str, str]]:
    """(node, reason) of the timeline's drains ("drained by ACTOR: REASON")."""
    return {(e["node"], e["text"].split(": ", 1)[1]) for e in report["timeline"]
            if e["kind"] == "drain" and e["text"].startswith("drained")}  # fmt: skip


def _move_away(cluster: Cluster, job_id: str, to: Path) -> None:
    """Every node history and the job's evidence out of the config's reach."""
    for node in NODES:
        for db in cluster.node_dir(node).glob("history.db*"):
            shutil.move(str(db), to / f"{node}-{db.name}")
    shutil.move(str(cluster.dir / "evidence" / job_id), to / "evidence")


def test_login_node_report_from_accounting_and_prometheus(
    scraped: Fleet,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
) -> None:
    fleet = scraped
    _needs_user_python()
    cluster = fleet.cluster
    cluster.set_scenario(GPU5_OFF_THE_BUS_ON_N2)
    job = cluster.sbatch("-N3", "--gres=gpu:8", "-o", "/dev/null", "--wrap",
                         "srun sleep 8; exit 3", timeout=90)  # fmt: skip
    assert job.state == "FAILED"
    stored = _admin_comment(job.job_id)
    summary = decode(stored)
    assert summary is not None and stored.startswith("sh1:") and len(stored) < 4096, stored
    full = _report(job.job_id, cluster)
    assert "Xid 79" in full["verdict"] and "n2" in full["verdict"], full["verdict"]
    assert summary["v"] == full["verdict"] and summary["f"] == full["answer"]["fault_class"]

    # each node's epilog published the job's per-GPU stats; the report reads those
    published = f'slurmhealth_job_gpu_stat{{job_id="{job.job_id}",stat="samples"}}'
    deadline = time.monotonic() + 60
    while len(fleet.series(published)) < 24 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert {m["metric"]["node"] for m in fleet.series(published)} == set(NODES)

    kept = tmp_path / "moved"
    kept.mkdir()
    _move_away(cluster, job.job_id, kept)
    login = cluster.dir / "login.toml"  # where shuser can read it (pytest's tmp is private)
    login.write_text(
        '[paths]\ndb = "/nonexistent/slurmhealth/{node}.db"\n'
        'evidence_dir = "/nonexistent/slurmhealth/evidence"\n'
        f'[report]\nprometheus_url = "{fleet.prometheus}"\n'
    )
    login.chmod(0o644)
    try:
        fallback = _report(job.job_id, cluster, login)
        refused = _as_user("nobody", "report", job.job_id, "--json", cluster=cluster, config=login)
    finally:
        login.unlink()
    used = {s["source"] for s in fallback["sources"]}
    assert {"accounting", "summary", "node events", "prometheus"} <= used, fallback["sources"]
    assert fallback["verdict"] == full["verdict"]
    assert fallback["answer"]["fault_class"] == full["answer"]["fault_class"] == "hardware"
    assert {n for n, _ in _drained(fallback)} == {n for n, _ in _drained(full)} == {"n2"}
    assert _drained(fallback) == _drained(full)
    mine = {(g["node"], g["gpu"]): g for g in fallback["gpus"]}
    theirs = {(g["node"], g["gpu"]): g for g in full["gpus"]}
    assert set(mine) == set(theirs) and len(mine) == 24
    for key, g in theirs.items():  # the published stats are the histories' own: equal
        assert all(mine[key].get(s) == g.get(s) for s in STATS), (key, mine[key], g)

    assert refused.returncode == 4, refused.stderr
    assert refused.stderr.strip().count("\n") == 0 and "belongs to shuser" in refused.stderr
