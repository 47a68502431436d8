"""The sweep's job script (slurmhealth/data/sweep.sbatch) run by bash outside Slurm: a fake
``srun`` runs each step here (rank 0), the stand-ins print recorded outputs, and the sweep's
own reader turns the job's output into results. What Slurm adds (allocation, nodes) is
tested on the cluster (tests/integration/test_sweep.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from slurmhealth.sweep.ingest import results_of
from slurmhealth.sweep.model import Planned
from tests.support.skips import unavailable

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "slurmhealth" / "data" / "sweep.sbatch"
BIN = REPO / "tests" / "fixtures" / "bin"
FAKE_SRUN = """#!/bin/sh
# srun stand-in: drop srun's options, run the program here as rank 0
while [ $# -gt 0 ]; do
    case "$1" in
        -N|-n|-w) shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
SLURM_PROCID=0 exec "$@"
"""


def _job(tmp_path: Path, nodelist: str, tests: str, **env: str) -> str:
    if shutil.which("scontrol") is None:
        unavailable("scontrol (Slurm's client) is not installed: the script expands hostlists")
    (tmp_path / "srun").write_text(FAKE_SRUN)
    (tmp_path / "srun").chmod(0o755)
    full = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}",
            "SLURM_JOB_NODELIST": nodelist, "SLURM_NNODES": "2" if "," in nodelist else "1",
            "SWEEP_TESTS": tests, "SWEEP_NCCL": str(BIN / "sweep_all_reduce_perf"),
            "SWEEP_IB": str(BIN / "ib_write_bw"), "SWEEP_IB_SERVER_WAIT": "0", **env}  # fmt: skip
    proc = subprocess.run(["bash", str(SCRIPT)], env=full, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    return proc.stdout + proc.stderr


def test_a_pair_job_runs_nccl_and_ib_per_hca(tmp_path: Path) -> None:
    out = _job(tmp_path, "n1,n3", "nccl ib", SWEEP_HCAS="mlx5_0 mlx5_1",
               SWEEP_FAKE_FAULTS="link:n1+n3=0.5")  # fmt: skip
    got = {r.test: r for r in results_of(Planned(("n1", "n3"), 1, 1, ("nccl", "ib")),
                                         "9", "COMPLETED", out, "", 0.0)}  # fmt: skip
    assert got["nccl"].value == pytest.approx(371.87 * 0.5, abs=0.02), out
    assert got["ib"].hcas == {"mlx5_0": 392.11, "mlx5_1": 392.11}, out


def test_a_single_node_job_runs_nccl_alone_and_a_failing_hca_fails_ib(tmp_path: Path) -> None:
    out = _job(tmp_path, "n2", "nccl", SWEEP_FAKE_FAULTS="intra:n2=0.5 node:n2=0.1")
    (r,) = results_of(Planned(("n2",), 0), "10", "COMPLETED", out, "", 0.0)
    assert r.metric == "all_reduce_perf.busbw@8589934592"
    assert r.value == pytest.approx(479.68 * 0.5, abs=0.02), out  # the intra fault alone
    out = _job(tmp_path, "n1,n2", "ib", IB_FAKE_FAIL="1")
    (ib,) = results_of(Planned(("n1", "n2"), 1, 1, ("ib",)), "11", "FAILED", out, "", 0.0)
    assert ib.value is None and "Couldn't connect" in ib.error, out
