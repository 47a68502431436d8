"""The per-job sidecar on the real cluster, scraped by a real Prometheus through file_sd."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from pathlib import Path

from tests.integration.conftest import Cluster
from tests.prometheus_util import query, start_prometheus


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


def _wait(predicate, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.25)


def test_prometheus_discovers_the_sidecar_through_file_sd(healthy: Cluster, tmp_path: Path) -> None:
    sd_dir = healthy.dir / "file_sd"
    config = f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: slurmhealth
    honor_labels: true
    file_sd_configs:
      - files: ["{sd_dir}/*.json"]
        refresh_interval: 1s
"""
    base, stop = start_prometheus(tmp_path, config)
    try:
        job = healthy.sbatch("-N1", "-w", "n2", "--gres=gpu:8", "--wrap", "sleep 15", wait=False)
        healthy.wait_job(job.job_id, states=frozenset({"RUNNING"}), timeout=30)
        promql = f'slurmhealth_gpu_utilization_ratio{{job_id="{job.job_id}"}}'

        def series() -> list[dict[str, str]]:
            result = query(base, promql)["data"]["result"]
            return [r["metric"] for r in result] if len(result) == 8 else []

        metrics = _wait(series, 30, "8 GPU series in Prometheus")
        assert sorted(int(m["gpu"]) for m in metrics) == list(range(8))
        assert {m["user"] for m in metrics} == {"shuser"}
        assert {m["node"] for m in metrics} == {"n2"}
        assert all(m["priority"].isdigit() and m["partition"] == "gpu" for m in metrics)
        assert all(m["uuid"].startswith("GPU-") and m["model"] for m in metrics)
        info = query(base, f'slurmhealth_job_info{{job_id="{job.job_id}"}}')["data"]["result"]
        assert len(info) == 1 and info[0]["metric"]["gpus"] == "0,1,2,3,4,5,6,7"
        sd_file = sd_dir / f"slurmhealth-n2-{job.job_id}.json"
        assert sd_file.exists() and _sidecar_pids(job.job_id)
        done = healthy.wait_job(job.job_id, timeout=60)
        assert done.state == "COMPLETED"
        _wait(lambda: not sd_file.exists(), 10, "the file_sd target file to go")
        _wait(lambda: not _sidecar_pids(job.job_id), 10, "the sidecar process to go")

        def target_gone() -> bool:
            with urllib.request.urlopen(f"{base}/api/v1/targets") as resp:
                targets = json.load(resp)["data"]["activeTargets"]
            return not any(t["labels"].get("job_id") == job.job_id for t in targets)

        _wait(target_gone, 15, "Prometheus to drop the target")
        samples = healthy.node_db("n2")
        import sqlite3

        with sqlite3.connect(samples) as conn:
            (n,) = conn.execute(
                "select count(*) from samples where job_id = ?", (job.job_id,)
            ).fetchone()
        assert n >= 8 * 5  # a sample per GPU per second of the job, flushed at the end
    finally:
        stop()


def test_eight_single_gpu_jobs_get_eight_sidecars(healthy: Cluster) -> None:
    jobs = [
        healthy.sbatch("-N1", "-w", "n1", "--gres=gpu:1", "--wrap", "sleep 12", wait=False)
        for _ in range(8)
    ]
    for j in jobs:
        healthy.wait_job(j.job_id, states=frozenset({"RUNNING"}), timeout=60)
    run = healthy.dir / "nodes" / "n1" / "run"
    ports = {}
    for j in jobs:
        port_file = run / f"sidecar-{j.job_id}.port"
        ports[j.job_id] = int(_wait(lambda f=port_file: f.exists() and f.read_text().strip(),
                                    20, f"sidecar port of job {j.job_id}"))  # fmt: skip
    assert len(set(ports.values())) == 8
    gpus_seen = {}
    for job_id, port in ports.items():

        def scrape(port: int = port) -> list[str]:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
            return [
                line
                for line in text.splitlines()
                if line.startswith("slurmhealth_gpu_utilization_ratio{")
            ]

        lines = _wait(scrape, 15, f"a sample from job {job_id}'s sidecar")
        assert len(lines) == 1 and f'job_id="{job_id}"' in lines[0]
        gpus_seen[job_id] = lines[0].split('gpu="')[1].split('"')[0]
    assert sorted(gpus_seen.values()) == [str(i) for i in range(8)]  # each its own GPU
    for j in jobs:
        healthy.wait_job(j.job_id, timeout=60)
    for j in jobs:
        _wait(lambda j=j: not _sidecar_pids(j.job_id), 10, "sidecars to exit")
    assert not list(run.glob("sidecar-*"))


def test_training_template_reports_task_metrics(healthy: Cluster) -> None:
    repo = Path(__file__).resolve().parents[2]
    run_dir = healthy.dir / "nodes" / "{node}" / "run"
    job = healthy.sbatch(
        "-N1",
        "-w",
        "n3",
        "-o",
        "/dev/null",
        f"--export=ALL,STEPS=120,STEP_SECONDS=0.1,SLURMHEALTH_PYTHONPATH={repo},"
        f"SLURMHEALTH_RUN_DIR={run_dir},NCCL_LOG_DIR=/tmp/nccl-logs-shuser,"
        f"TRAIN_SCRIPT={repo / 'sbatch-templates' / 'train_loop.py'}",
        str(repo / "sbatch-templates" / "train.sbatch"),
        wait=False,
    )
    healthy.wait_job(job.job_id, states=frozenset({"RUNNING"}), timeout=30)
    port_file = healthy.dir / "nodes" / "n3" / "run" / f"sidecar-{job.job_id}.port"
    port = int(_wait(lambda: port_file.exists() and port_file.read_text().strip(), 20, "port"))

    def task_metrics() -> dict[str, float]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        values = {}
        for line in text.splitlines():
            if line.startswith("slurmhealth_job_") and not line.startswith("slurmhealth_job_info"):
                name = line.split("{")[0]
                values[name] = float(line.rsplit(" ", 1)[1])
        return values if values.get("slurmhealth_job_steps_total", 0) >= 20 else {}

    values = _wait(task_metrics, 30, "step metrics from the training loop")
    assert 0.08 <= values["slurmhealth_job_step_seconds"] <= 0.3
    assert 0.05 <= values["slurmhealth_job_comm_ratio"] <= 0.15
    assert 0 < values["slurmhealth_job_mfu_ratio"] < 1
    assert values["slurmhealth_job_samples_per_second"] > 50
    done = healthy.wait_job(job.job_id, timeout=60)
    assert done.state == "COMPLETED", done.record


def test_sidecar_exits_by_itself_when_its_job_is_gone(healthy: Cluster, tmp_path: Path) -> None:
    import subprocess
    import sys

    config = tmp_path / "config.toml"
    base = (healthy.dir / "slurmhealth.toml").read_text()
    config.write_text(base.replace("job_check_interval_s = 15.0", "job_check_interval_s = 1.0"))
    env = {"PATH": os.environ["PATH"], "SLURMHEALTH_CONFIG": str(config), "SLURMD_NODENAME": "n1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmhealth", "sidecar", "--job", "99999999", "--gpus", "0"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.wait(timeout=15) == 0  # squeue does not know the job: no orphan sidecar
    finally:
        proc.kill()
    assert "gone" in (proc.stderr.read() if proc.stderr else "")
    assert not (healthy.dir / "nodes" / "n1" / "run" / "sidecar-99999999.pid").exists()
