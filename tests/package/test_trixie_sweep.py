"""``slurmhealth sweep`` on Slurm 24.11 (Debian 13's slurm-wlm in the namespace cluster of
test_trixie_slurm.py: n1, n2, the .deb installed): real sbatch jobs of the packaged
sweep.sbatch, squeue, the output files, the stand-in all_reduce_perf through real srun.
Two nodes: the one pair is judged only against a pinned reference. Root only, slow."""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import pytest

from tests.package.debian_root import REPO
from tests.package.slurm_node import SlurmNode
from tests.package.test_trixie_slurm import node, show_job

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="debootstrap, chroot and namespaces need root"),
]
__all__ = ["node"]  # the module's own cluster (a module-scoped fixture)
SWEEP = ("slurmhealth sweep --nodes 'n[1-2]' --gpus-per-node 1 --time-limit 2 "
         "--command /src/fixtures/bin/sweep_all_reduce_perf "
         "--job-env SWEEP_SRUN_MPI=--mpi=none --json")  # fmt: skip


def _sweep(n: SlurmNode, faults: str) -> dict[str, Any]:
    done = n.run(f"{SWEEP} || true", timeout=400, SWEEP_FAKE_FAULTS=faults)
    assert done.stdout.strip(), done.stderr + n.logs()
    return dict(json.loads(done.stdout))


@pytest.fixture(scope="module")
def healthy_node(node: SlurmNode) -> SlurmNode:
    (node.root / "etc/slurmhealth/scenario.toml").write_text('name = "healthy"\n')
    for sub in ("bin", "baseline"):
        shutil.copytree(REPO / "tests/fixtures" / sub, node.root / "src/fixtures" / sub,
                        dirs_exist_ok=True)  # fmt: skip
    return node


def test_sweep_runs_real_jobs_and_leaves_a_lone_pair_unjudged(healthy_node: SlurmNode) -> None:
    record = _sweep(healthy_node, "link:n1+n2=0.5")
    assert record["suspects"] == [] and record["jobs"] == 3
    units = {tuple(u["nodes"]): u for u in record["units"]}
    assert units[("n1", "n2")]["status"] == "unjudged"
    assert units[("n1", "n2")]["value"] == pytest.approx(185.94, abs=0.01)
    for r in record["results"]:
        job = show_job(healthy_node, r["job_id"])
        assert job["JobName"] == f"slurmhealth-sweep-{record['id']}"
        assert job["JobState"] in ("COMPLETED", "COMPLETING"), job


def test_sweep_with_a_pinned_reference_names_the_pair(healthy_node: SlurmNode) -> None:
    config = healthy_node.root / "etc/slurmhealth/config.toml"
    config.write_text(config.read_text() + '\n[baseline.pinned]\n"nccl.pair" = 371.87\n')
    record = _sweep(healthy_node, "link:n1+n2=0.5")
    ((kind, nodes, summary),) = [(s["kind"], s["nodes"], s["summary"]) for s in record["suspects"]]
    assert (kind, nodes) == ("link", ["n1", "n2"]) and "may be the node" in summary
    assert [r["attempt"] for r in record["results"] if len(r["nodes"]) == 2] == [1, 2, 3]
    healthy = _sweep(healthy_node, "")
    assert healthy["suspects"] == [] and not healthy["inconclusive"]
