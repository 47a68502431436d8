"""The benchmark templates on the real cluster: they run (with stand-ins for the tools that
need a GPU) and their results land in the nodes' baselines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import Cluster

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / "tests" / "fixtures" / "bin"


def _submit(cluster: Cluster, template: str, tmp: Path, *args: str) -> str:
    env = {
        **os.environ,
        "TEMPLATES": str(REPO / "sbatch-templates"),
        "SLURMHEALTH_BIN": str(REPO / ".venv" / "bin" / "slurmhealth"),
        "SLURMHEALTH_CONFIG": str(cluster.dir / "slurmhealth.toml"),
        "RESULTS_DIR": str(tmp / "results"),
        "GPU_MODEL": "NVIDIA H100 80GB HBM3",
        "NCCL_TESTS": str(BIN),
        "GPU_BURN_DIR": str(BIN),
        "GPU_BURN": "./gpu_burn",
        "FIO": str(BIN / "fio"),
        "FIO_DIR": str(tmp / "fio"),
        "DCGMI": str(BIN / "dcgmi"),
        "SRUN_MPI": "--mpi=none",
    }
    proc = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-o",
            str(tmp / "%x-%j.out"),
            *args,
            str(REPO / "sbatch-templates" / template),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout.strip().split(";")[0]


def test_templates_run_and_store_their_results(healthy: Cluster, tmp_path: Path) -> None:
    jobs = {
        "nccl-tests.sbatch": _submit(healthy, "nccl-tests.sbatch", tmp_path, "-w", "n1"),
        "nccl-tests-multinode.sbatch": _submit(
            healthy, "nccl-tests-multinode.sbatch", tmp_path, "-N", "2"
        ),
        "gpu-burn.sbatch": _submit(healthy, "gpu-burn.sbatch", tmp_path, "-w", "n2"),
        "fio.sbatch": _submit(healthy, "fio.sbatch", tmp_path, "-w", "n3"),
        "dcgm-diag.sbatch": _submit(healthy, "dcgm-diag.sbatch", tmp_path, "-w", "n3"),
    }
    for template, job_id in jobs.items():
        done = healthy.wait_job(job_id, timeout=90)
        out = "\n".join(p.read_text() for p in tmp_path.glob(f"*-{job_id}.out"))
        assert done.state == "COMPLETED", f"{template}: {done.record}\n{out}"
    shown = subprocess.run(
        [sys.executable, "-m", "slurmhealth", "baseline", "show", "--json"],
        env={**os.environ, "SLURMHEALTH_CONFIG": str(healthy.dir / "slurmhealth.toml")},
        capture_output=True,
        text=True,
        check=True,
    )
    data = json.loads(shown.stdout)
    rows = data["baselines"]
    labels = {(r["node"], r["label"], r["kind"]) for r in rows}
    assert ("n1", "nccl-1node", "nccl") in labels
    assert any(label == "nccl-multinode" for _, label, _ in labels)
    assert ("n2", "burn-in", "gpuburn") in labels
    assert {("n3", "fio-seqread", "fio"), ("n3", "fio-randread", "fio")} <= labels
    assert ("n3", "dcgm-level2", "dcgm") in labels
    busbw = [r["value"] for r in rows if r["metric"] == "all_reduce_perf.busbw_avg"
             and r["node"] == "n1"]  # fmt: skip
    assert busbw and busbw[-1] > 100
    gflops = [r for r in rows if r["kind"] == "gpuburn" and r["node"] == "n2"]
    assert sorted({r["gpu"] for r in gflops}) == list(range(8))
