"""MIG GRES on the real cluster: n3 offers seven typed MIG GPUs (gres.conf
`Name=gpu Type=1g.10gb File=...`, `SLURMHEALTH_CLUSTER_MIG=1 scripts/cluster up`), its
simulated H100 is in MIG mode with seven 1g.10gb instances, and a job on one slice gets
prolog checks of that slice's parent GPU and series labelled for that slice only. The
default layout is put back at the end (other tests need it)."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial

import pytest

from tests.integration.conftest import CLUSTER_SCRIPT, Cluster, _run
from tests.integration.test_sidecar import _wait
from tests.prometheus_util import answers, free_port, get_text

SCENARIO = """
name = "mig-n3"
description = "n1, n2: healthy 8x H100; n3: one H100 in MIG mode, seven 1g.10gb instances"
[nodes.n3]
preset = "h100-sxm-mig"
gpus = 1
"""
# the instances of the H100 in NVML order: GRES index N is GPU instance 7 + N
FIRST_GI = 7


def _cluster(command: str, mig: bool) -> None:
    env = {**os.environ, "SLURMHEALTH_CLUSTER_MIG": "1" if mig else "0"}
    proc = subprocess.run([str(CLUSTER_SCRIPT), command], env=env, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _switch(mig: bool) -> None:
    """`scripts/cluster up` in the layout asked for; where Slurm does not take a node's new
    GRES from `scontrol reconfigure`, the daemons are restarted (down, up)."""
    want = "1g.10gb:7" if mig else "h100:8"
    _cluster("up", mig)
    deadline = time.monotonic() + 15
    while want not in _gres("n3") and time.monotonic() < deadline:
        time.sleep(0.5)
    if want not in _gres("n3"):
        _cluster("down", mig)
        _cluster("up", mig)
    _wait(lambda: want in _gres("n3"), 60, f"n3 to offer gpu:{want}")


def _gres(node: str) -> str:
    out = _run(["scontrol", "show", "node", "-o", node]).stdout
    m = re.search(r"\bGres=(\S+)", out)
    return m.group(1) if m else ""


@pytest.fixture
def mig_cluster(healthy: Cluster) -> Iterator[Cluster]:
    try:
        _switch(mig=True)
        healthy.resume_all(timeout=60)
        healthy.set_scenario(SCENARIO)
        yield healthy
    finally:
        healthy.wait_idle()
        _switch(mig=False)  # the default layout back for every other test
        healthy.set_scenario("healthy")
        healthy.resume_all(timeout=60)


def _exporter(cluster: Cluster, node: str, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "SLURMHEALTH_NODE_NAME": node,
           "SLURMHEALTH_CONFIG": str(cluster.dir / "slurmhealth.toml")}  # fmt: skip
    argv = [sys.executable, "-m", "slurmhealth", "exporter", "--port", str(port)]
    return subprocess.Popen(argv, env=env)


def _series(text: str, name: str, job_id: str) -> list[dict[str, str]]:
    out = []
    for line in text.splitlines():
        if line.startswith(name + "{") and f'job_id="{job_id}"' in line:
            out.append(dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0])))
    return out


def _scrape(url: str, name: str, job_id: str) -> list[dict[str, str]]:
    return _series(get_text(url), name, job_id)


def test_a_job_on_one_mig_slice_is_checked_and_labelled_for_that_slice(
    mig_cluster: Cluster,
) -> None:
    cluster = mig_cluster
    port = free_port()
    exporter = _exporter(cluster, "n3", port)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        _wait(lambda: answers(url), 20, "n3's exporter")
        first = cluster.sbatch("-w", "n3", "--gres=gpu:1g.10gb:1", "--wrap", "sleep 15",
                               wait=False)  # fmt: skip
        cluster.wait_job(first.job_id, states=frozenset({"RUNNING"}), timeout=30)
        second = cluster.sbatch("-w", "n3", "--gres=gpu:1g.10gb:1", "--wrap", "sleep 15",
                                wait=False)  # fmt: skip
        cluster.wait_job(second.job_id, states=frozenset({"RUNNING"}), timeout=30)
        seen: dict[str, dict[str, str]] = {}
        name = "slurmhealth_mig_memory_total_bytes"
        for job in (first, second):
            rows = _wait(partial(_scrape, url, name, job.job_id), 15,
                         f"job {job.job_id}'s MIG series")  # fmt: skip
            (row,) = rows  # one slice: one series, none for the node's other six slices
            assert row["gpu"] == "0" and row["mig_uuid"].startswith("MIG-")
            assert row["user"] == cluster.user and row["node"] == "n3"
            seen[job.job_id] = row
        gis = {int(r["gpu_instance"]) for r in seen.values()}
        assert len(gis) == 2 and gis <= set(range(FIRST_GI, FIRST_GI + 7))  # two slices
        assert len({r["mig_uuid"] for r in seen.values()}) == 2
        # each prolog judged the slice's parent GPU and found it healthy
        with sqlite3.connect(cluster.node_db("n3")) as conn:
            conn.row_factory = sqlite3.Row
            runs = conn.execute(
                "select job_id, gpus, status from check_runs where phase = 'prolog'"
                " and job_id in (?, ?)", (first.job_id, second.job_id),
            ).fetchall()  # fmt: skip
        assert {r["job_id"] for r in runs} == {first.job_id, second.job_id}
        assert {r["status"] for r in runs} == {"ok"}
        assert {json.dumps(json.loads(r["gpus"])) for r in runs} == {"[0]"}
        for job in (first, second):
            assert cluster.wait_job(job.job_id, timeout=60).state == "COMPLETED"
    finally:
        exporter.terminate()
        exporter.wait(10)
