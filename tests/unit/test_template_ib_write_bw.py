"""sbatch-templates/ib-write-bw.sbatch run by bash outside Slurm: ``srun`` and ``scontrol``
stand-ins start the server and the client of each HCA, a stand-in ``ib_write_bw`` prints a
recorded perftest output (``--report_gbits`` and the default MB/sec), and the result lands
in the node pair's baseline in Gb/s through the real ``slurmhealth baseline ingest``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "sbatch-templates" / "ib-write-bw.sbatch"
BIN = REPO / "tests" / "fixtures" / "bin"

SRUN = """#!/bin/sh
# srun stand-in: drop srun's own options (-N1 -n1 -w NODE), run the command here
while [ $# -gt 0 ]; do
    case "$1" in
        -w) echo "$2 $*" >> "$SRUN_LOG"; shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
exec "$@"
"""


def run_template(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    fake = tmp_path / "fakebin"
    fake.mkdir(exist_ok=True)
    (fake / "srun").write_text(SRUN)
    (fake / "scontrol").write_text("#!/bin/sh\necho n1\necho n2\n")
    for f in fake.iterdir():
        f.chmod(0o755)
    config = tmp_path / "slurmhealth.toml"
    config.write_text(f'[paths]\ndb = "{tmp_path / "{node}.db"}"\n')
    full = {
        **os.environ,
        "PATH": f"{fake}:{os.environ['PATH']}",
        "TEMPLATES": str(REPO / "sbatch-templates"),
        "SLURMHEALTH_BIN": str(Path(sys.executable).with_name("slurmhealth")),
        "SLURMHEALTH_CONFIG": str(config),
        "RESULTS_DIR": str(tmp_path / "results"),
        "GPU_MODEL": "NVIDIA H100 80GB HBM3",
        "IB_WRITE_BW": str(BIN / "ib_write_bw"),
        "IB_SERVER_WAIT": "0",
        "SLURM_JOB_ID": "99",
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SRUN_LOG": str(tmp_path / "srun.log"),
        **env,
    }
    proc = subprocess.run(["bash", str(TEMPLATE)], env=full, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    return proc, config


def baselines(config: Path) -> list[dict[str, object]]:
    shown = subprocess.run(
        [sys.executable, "-m", "slurmhealth", "baseline", "show", "--json"],
        env={**os.environ, "SLURMHEALTH_CONFIG": str(config), "SLURMHEALTH_NODE_NAME": "n[1-2]"},
        capture_output=True,
        text=True,
        check=True,
    )
    rows: list[dict[str, object]] = json.loads(shown.stdout)["baselines"]
    return rows


@pytest.mark.parametrize("gbits", ["1", "0"])
def test_each_hca_pair_is_stored_in_gbps_from_either_output_unit(
    tmp_path: Path, gbits: str
) -> None:
    proc, config = run_template(tmp_path, REPORT_GBITS=gbits, IB_DEVICES="mlx5_0 mlx5_1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    srun = [line.split() for line in (tmp_path / "srun.log").read_text().splitlines()]
    # (node, HCA, port, role): the server on the first node, the client connecting to it
    steps = {(w[0], w[w.index("-d") + 1], w[w.index("-p") + 1], w[-1] == "n1") for w in srun}
    assert steps == {("n1", "mlx5_0", "18515", False), ("n2", "mlx5_0", "18515", True),
                     ("n1", "mlx5_1", "18516", False), ("n2", "mlx5_1", "18516", True)}  # fmt: skip
    assert all(("--report_gbits" in w) is (gbits == "1") for w in srun)
    rows = [r for r in baselines(config) if r["metric"] == "ib_write_bw.bw_avg"]
    labels = {str(r["label"]): r for r in rows}
    assert set(labels) == {"ib-write-bw-mlx5_0", "ib-write-bw-mlx5_1"}
    for r in rows:
        assert r["node"] == "n[1-2]" and r["unit"] == "Gb/s"
        assert r["value"] == pytest.approx(392.11, abs=0.01)  # 46742.18 MB/s is 392.1 Gb/s


def test_a_client_that_never_connected_fails_the_job_with_the_tools_words(tmp_path: Path) -> None:
    proc, _ = run_template(tmp_path, IB_FAKE_FAIL="1")
    assert proc.returncode != 0
    assert "Couldn't connect" in proc.stdout + proc.stderr


def test_one_node_is_refused_in_one_line(tmp_path: Path) -> None:
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "scontrol").write_text("#!/bin/sh\necho n1\n")
    (fake / "scontrol").chmod(0o755)
    proc = subprocess.run(["bash", str(TEMPLATE)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}",
                               "TEMPLATES": str(REPO / "sbatch-templates"),
                               "RESULTS_DIR": str(tmp_path / "r"), "GPU_MODEL": "x",
                               "SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n1"})  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip() == "ib-write-bw: needs two nodes (sbatch -N 2), got: n1"
