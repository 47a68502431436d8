"""The per-job sidecars on the real cluster, served by one `slurmhealth exporter` per node and
scraped by a real Prometheus through one static target per node (no file_sd), and through
node_exporter's textfile collector; a config typo that makes prologs fail open is counted."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import Cluster
from tests.prometheus_util import (
    answers,
    free_port,
    get_text,
    query,
    start_node_exporter,
    start_prometheus,
)

NODES = ("n1", "n2", "n3")
INTERVAL_S = 1.0  # sidecar.interval_s and the scrape interval below
# one interval, one scrape, and the time Prometheus takes to answer
WITHIN_S = INTERVAL_S + INTERVAL_S + 1.5


def _sidecar_pids(job_id: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"sidecar" in argv and b"--job" in argv and job_id.encode() in argv:
            pids.append(int(entry))
    return pids


PUBLISHED = ("slurmhealth_job_gpu_stat", "slurmhealth_job_gpu_throttle_seconds")


def _wait(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


class Fleet:
    """One exporter per node (each with its port and textfile dir), Prometheus scraping the
    three static targets, node_exporter reading n2's textfile dir."""

    def __init__(self, cluster: Cluster, tmp: Path) -> None:
        self.cluster, self.tmp = cluster, tmp
        self.ports = {n: free_port() for n in NODES}
        self.textfile = {n: tmp / f"textfile-{n}" for n in NODES}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.stops: list[Callable[[], None]] = []
        self.prometheus = ""
        self.node_exporter = ""

    def start(self) -> None:
        for node in NODES:
            self.textfile[node].mkdir()
            env = {**os.environ, "SLURMHEALTH_NODE_NAME": node,
                   "SLURMHEALTH_CONFIG": str(self.cluster.dir / "slurmhealth.toml")}  # fmt: skip
            argv = [sys.executable, "-m", "slurmhealth", "exporter", "--port",
                    str(self.ports[node]), "--textfile-dir", str(self.textfile[node])]  # fmt: skip
            self.procs.append(subprocess.Popen(argv, env=env))
        for node in NODES:
            _wait(lambda n=node: answers(self.url(n)), 20, f"the exporter of {node}")
        targets = ", ".join(f'"127.0.0.1:{p}"' for p in self.ports.values())
        config = f"""
global:
  scrape_interval: {INTERVAL_S:g}s
  evaluation_interval: {INTERVAL_S:g}s
scrape_configs:
  - job_name: slurmhealth
    honor_labels: true
    scrape_timeout: {INTERVAL_S:g}s
    static_configs:
      - targets: [{targets}]
"""
        self.prometheus, stop = start_prometheus(self.tmp, config)
        self.stops.append(stop)
        base, stop = start_node_exporter(self.tmp, self.textfile["n2"])
        self.node_exporter = f"{base}/metrics"
        self.stops.append(stop)

    def url(self, node: str) -> str:
        return f"http://127.0.0.1:{self.ports[node]}/metrics"

    def stop(self) -> None:
        """Everything stopped; an exporter (node agent) that died during the test fails it
        (seen: SIGBUS, the history's -shm truncated under it by another process)."""
        for stop in self.stops:
            stop()
        died = {n: p.returncode for n, p in zip(NODES, self.procs, strict=False)
                if p.poll() is not None}  # fmt: skip
        for proc in self.procs:
            proc.terminate()
            proc.wait(10)
        assert not died, f"exporters died during the test (node: exit status): {died}"

    def series(self, expr: str) -> list[dict[str, Any]]:
        answer = query(self.prometheus, expr)
        assert answer["status"] == "success", answer
        return list(answer["data"]["result"])


@pytest.fixture
def fleet(healthy: Cluster, tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(healthy, tmp_path)
    try:
        f.start()
        yield f
    finally:
        f.stop()


def test_job_series_come_and_go_through_one_static_target_per_node(fleet: Fleet) -> None:
    cluster = fleet.cluster
    _wait(lambda: len(fleet.series('up{job="slurmhealth"} == 1')) == 3, 15, "3 targets up")
    job = cluster.sbatch("-N1", "-w", "n2", "--gres=gpu:8", "--wrap", "sleep 12", wait=False)
    cluster.wait_job(job.job_id, states=frozenset({"RUNNING"}), timeout=30)
    state_file = cluster.dir / "nodes" / "n2" / "run" / "export" / f"job-{job.job_id}.json"
    _wait(state_file.exists, 10, "the sidecar's first state file")
    t0 = time.monotonic()
    promql = f'slurmhealth_gpu_utilization_ratio{{job_id="{job.job_id}"}}'
    _wait(lambda: len(fleet.series(promql)) == 8, 10, "8 GPU series in Prometheus")
    assert time.monotonic() - t0 <= WITHIN_S
    metrics = [r["metric"] for r in fleet.series(promql)]
    assert sorted(int(m["gpu"]) for m in metrics) == list(range(8))
    assert {m["user"] for m in metrics} == {"shuser"} and {m["node"] for m in metrics} == {"n2"}
    assert all(m["priority"].isdigit() and m["uuid"].startswith("GPU-") for m in metrics)
    assert not any("partition" in m or "account" in m for m in metrics)  # on job_info only
    (info,) = fleet.series(f'slurmhealth_job_info{{job_id="{job.job_id}"}}')
    assert info["metric"]["gpus"] == "0,1,2,3,4,5,6,7" and info["metric"]["partition"] == "gpu"
    # the same series through node_exporter's textfile collector
    needle = f'job_id="{job.job_id}"'
    _wait(lambda: needle in get_text(fleet.node_exporter), WITHIN_S, "the textfile series")
    assert _sidecar_pids(job.job_id)
    done = cluster.wait_job(job.job_id, timeout=60)
    assert done.state == "COMPLETED"
    t1 = time.monotonic()
    _wait(lambda: not fleet.series(promql), 10, "the job's series to vanish")
    assert time.monotonic() - t1 <= WITHIN_S + 2.0  # the epilog's run, then one scrape

    def live(text: str) -> list[str]:  # the job's lines but its published stats
        return [line for line in text.splitlines()
                if needle in line and not line.startswith(PUBLISHED)]  # fmt: skip

    # the exporter's next textfile write after the after-work removed the job's state (a
    # loaded CI machine took longer than 5.5 s once); a lingering series stays far longer
    try:
        _wait(lambda: not live(get_text(fleet.node_exporter)), 20.0,
              "the textfile series to vanish")  # fmt: skip
    except AssertionError as exc:
        left = sorted(os.listdir(cluster.dir / "nodes" / "n2" / "run" / "export"))
        raise AssertionError(
            f"{exc}: {live(get_text(fleet.node_exporter))[:2]}; sidecars "
            f"{_sidecar_pids(job.job_id)}; state files {left}"
        ) from None
    assert not state_file.exists()
    # what stays: the job's per-GPU stats its epilog published (final_series), for a report
    published = f'slurmhealth_job_gpu_stat{{job_id="{job.job_id}",stat="samples"}}'
    stats = _wait(lambda: fleet.series(published), 10, "the published stats in Prometheus")
    assert sorted(int(r["metric"]["gpu"]) for r in stats) == list(range(8))
    assert all(int(r["value"][1]) >= 5 for r in stats)  # a sample a second of the job
    _wait(lambda: not _sidecar_pids(job.job_id), 10, "the sidecar process to go")
    with sqlite3.connect(cluster.node_db("n2")) as conn:
        (n,) = conn.execute(
            "select count(*) from samples where job_id = ?", (job.job_id,)
        ).fetchone()
    assert n >= 8 * 5  # a sample per GPU per second of the job, flushed at the end


def test_eight_single_gpu_jobs_behind_one_target(fleet: Fleet) -> None:
    cluster = fleet.cluster
    jobs = [
        cluster.sbatch("-N1", "-w", "n1", "--gres=gpu:1", "--wrap", "sleep 12", wait=False)
        for _ in range(8)
    ]
    for j in jobs:
        cluster.wait_job(j.job_id, states=frozenset({"RUNNING"}), timeout=60)
    ids = "|".join(j.job_id for j in jobs)
    promql = f'slurmhealth_gpu_up{{job_id=~"{ids}"}}'
    _wait(lambda: len(fleet.series(promql)) == 8, 20, "one GPU series per job")
    series = fleet.series(promql)
    assert {s["metric"]["job_id"] for s in series} == {j.job_id for j in jobs}
    assert sorted(s["metric"]["gpu"] for s in series) == [str(i) for i in range(8)]
    assert {s["metric"]["instance"] for s in series} == {f"127.0.0.1:{fleet.ports['n1']}"}
    # the eight jobs' sidecars (one of an earlier test's jobs may still be on its way out)
    running = 'slurmhealth_sidecars{node="n1",state="running"}'
    _wait(lambda: [r["value"][1] for r in fleet.series(running)] == ["8"], 30, "8 sidecars")
    for j in jobs:
        cluster.wait_job(j.job_id, timeout=60)
    _wait(lambda: not fleet.series(f'slurmhealth_gpu_up{{job_id=~"{ids}"}}'), 10, "all gone")
    for j in jobs:
        _wait(lambda j=j: not _sidecar_pids(j.job_id), 10, "sidecars to exit")
    run = cluster.dir / "nodes" / "n1" / "run"
    assert not list(run.glob("sidecar-*")) and not list((run / "export").glob("job-*"))


def test_training_template_reports_task_metrics(fleet: Fleet) -> None:
    cluster = fleet.cluster
    repo = Path(__file__).resolve().parents[2]
    run_dir = cluster.dir / "nodes" / "{node}" / "run"
    job = cluster.sbatch(
        "-N1", "-w", "n3", "-o", "/dev/null",
        f"--export=ALL,STEPS=120,STEP_SECONDS=0.1,SLURMHEALTH_PYTHONPATH={repo},"
        f"SLURMHEALTH_RUN_DIR={run_dir},NCCL_LOG_DIR=/tmp/nccl-logs-shuser,"
        f"TRAIN_SCRIPT={repo / 'sbatch-templates' / 'train_loop.py'}",
        str(repo / "sbatch-templates" / "train.sbatch"),
        wait=False,
    )  # fmt: skip
    cluster.wait_job(job.job_id, states=frozenset({"RUNNING"}), timeout=30)

    def task_metrics() -> dict[str, float]:
        values = {}
        for line in get_text(fleet.url("n3")).splitlines():
            ours = line.startswith("slurmhealth_job_") and f'job_id="{job.job_id}"' in line
            if ours and not line.startswith("slurmhealth_job_info"):
                values[line.split("{")[0]] = float(line.rsplit(" ", 1)[1])
        return values if values.get("slurmhealth_job_steps_total", 0) >= 20 else {}

    values = _wait(task_metrics, 30, "step metrics from the training loop")
    assert 0.08 <= values["slurmhealth_job_step_seconds"] <= 0.3
    assert 0.05 <= values["slurmhealth_job_comm_ratio"] <= 0.15
    assert 0 < values["slurmhealth_job_mfu_ratio"] < 1
    assert values["slurmhealth_job_samples_per_second"] > 50
    done = cluster.wait_job(job.job_id, timeout=60)
    assert done.state == "COMPLETED", done.record


def test_a_job_that_ends_at_once_leaves_no_sidecar_on_any_node(healthy: Cluster) -> None:
    """`sbatch --wrap true` on three nodes: each epilog comes while its sidecar is still
    starting, and must stop it (the sidecar never sees the job to miss it)."""
    job = healthy.sbatch("-N3", "--gres=gpu:8", "-o", "/dev/null", "--wrap", "true")
    assert job.state == "COMPLETED" and job.nodes == list(NODES), job.record
    _wait(lambda: not _sidecar_pids(job.job_id), 10, "every node's sidecar to go")
    for node in NODES:
        run = healthy.dir / "nodes" / node / "run"
        assert not (run / f"sidecar-{job.job_id}.pid").exists(), node
        assert not (run / "export" / f"job-{job.job_id}.json").exists(), node


def test_sidecar_exits_when_its_jobs_processes_are_gone(healthy: Cluster, tmp_path: Path) -> None:
    """No epilog comes: the sidecar sees its job's processes go (never asking slurmctld)."""
    config = tmp_path / "config.toml"
    base = (healthy.dir / "slurmhealth.toml").read_text()
    config.write_text(base.replace("job_check_interval_s = 15.0", "job_check_interval_s = 1.0"))
    job_env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "99999999"}
    job = subprocess.Popen(["sleep", "4"], env=job_env)  # "the job" on this node
    env = {"PATH": os.environ["PATH"], "SLURMHEALTH_CONFIG": str(config), "SLURMD_NODENAME": "n1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmhealth", "sidecar", "--job", "99999999", "--gpus", "0"],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(2.5)
        assert proc.poll() is None  # its job still runs
        job.wait(10)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        job.kill()
    assert "no process left" in (proc.stderr.read() if proc.stderr else "")
    run = healthy.dir / "nodes" / "n1" / "run"
    assert not (run / "sidecar-99999999.pid").exists()
    assert not (run / "export" / "job-99999999.json").exists()


def test_a_config_typo_makes_prologs_fail_open_and_the_counter_rises(fleet: Fleet) -> None:
    cluster = fleet.cluster
    config = cluster.dir / "slurmhealth.toml"
    good = config.read_text()
    log = cluster.dir / "nodes" / "n3" / "fail-open.log"
    before = len(log.read_text().splitlines()) if log.exists() else 0
    promql = 'slurmhealth_fail_opens_total{node="n3",hook="prolog",cause="config"}'
    try:
        config.write_text(good.replace("[sidecar]", "[sidecar]\ninterval_z = 1.0"))  # the typo
        job = cluster.sbatch("-N1", "-w", "n3", "--wrap", "true", wait=False)
        done = cluster.wait_job(job.job_id, timeout=60)
        assert done.state == "COMPLETED"  # failed open: the job ran, unchecked
        assert len(log.read_text().splitlines()) > before
        rose = _wait(lambda: fleet.series(promql), 15, "the fail-open counter in Prometheus")
        assert float(rose[0]["value"][1]) >= before + 1
        _wait(lambda: fleet.series('slurmhealth_config_valid{node="n3"} == 0'), 15,
              "config_valid 0")  # fmt: skip
    finally:
        config.write_text(good)
    _wait(lambda: fleet.series('slurmhealth_config_valid{node="n3"} == 1'), 15, "config_valid 1")


def _train_python() -> str:
    """A Python with PyTorch the cluster's user can run (scripts/train-venv builds it once)."""
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [str(repo / "scripts" / "train-venv")], capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return str(Path(out.stdout.strip().splitlines()[-1]) / "bin" / "python")


def test_ddp_job_reports_its_measured_comm_share_and_names_the_slow_rank(fleet: Fleet) -> None:
    """2 nodes x 2 ranks of PyTorch DDP (gloo on CPU) under srun, timed by slurmhealth.train's
    all-reduce hook: step time, communication share and throughput reach Prometheus with
    the job's labels; rank 3 (on n2) does 0.2 s more work per step, so n2's sidecar names it
    the straggler and the report says so."""
    cluster = fleet.cluster
    python = _train_python()
    repo = Path(__file__).resolve().parents[2]
    run_dir = cluster.dir / "nodes" / "{node}" / "run"
    job = cluster.sbatch(
        "-N2", "-w", "n1,n2", "--ntasks-per-node=2", "-o", "/dev/null",
        f"--export=ALL,STEPS=60,PYTHON={python},MASTER_ADDR=127.0.0.1,"
        f"SLURMHEALTH_PYTHONPATH={repo},SLURMHEALTH_RUN_DIR={run_dir},"
        f"NCCL_LOG_DIR=/tmp/nccl-logs-shuser,TRAIN_SCRIPT={repo}/sbatch-templates/train_ddp.py,"
        "TRAIN_ARGS=--slow-rank 3 --slow-seconds 0.2",
        str(repo / "sbatch-templates" / "train-ddp.sbatch"),
        wait=False,
    )  # fmt: skip
    cluster.wait_job(job.job_id, states=frozenset({"RUNNING"}), timeout=60)

    def task_series() -> dict[str, dict[str, Any]]:
        got = {}
        for name in ("step_seconds", "comm_ratio", "samples_per_second"):
            rows = fleet.series(f'slurmhealth_job_{name}{{job_id="{job.job_id}"}}')
            if len(rows) < 2:  # one per node
                return {}
            got[name] = {r["metric"]["node"]: (r["metric"], float(r["value"][1])) for r in rows}
        return got

    series = _wait(task_series, 120, "the DDP job's task series from both nodes")
    for node in ("n1", "n2"):
        labels, comm = series["comm_ratio"][node]
        assert labels["user"] == "shuser" and labels["job_id"] == job.job_id
        assert 0 < comm < 1  # measured by the hook, never declared by the script
        assert series["step_seconds"][node][1] > 0.2  # rank 3's 0.2 s makes every step longer
        assert series["samples_per_second"][node][1] > 0
    done = cluster.wait_job(job.job_id, timeout=180)
    assert done.state == "COMPLETED", done.record

    with sqlite3.connect(cluster.node_db("n2")) as conn:
        ranks = [
            row[0]
            for row in conn.execute(
                "select json_extract(evidence, '$.rank') from events "
                "where job_id = ? and kind = 'rank_straggler'",
                (job.job_id,),
            )
        ]
    assert ranks == [3], ranks
    env = {**os.environ, "SLURMHEALTH_CONFIG": str(cluster.dir / "slurmhealth.toml")}
    report = subprocess.run(
        [sys.executable, "-m", "slurmhealth", "report", job.job_id, "--json"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    data = json.loads(report.stdout)
    named = [
        (d["node"], d["root_cause"]) for d in data["diagnoses"] if d["rule"] == "straggler_rank"
    ]
    assert [node for node, _ in named] == ["n2"], (named, data["verdict"])
    assert named[0][1].startswith("Rank 3 on n2"), named
