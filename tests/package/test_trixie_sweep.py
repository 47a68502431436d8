"""``slurmhealth sweep`` on Slurm 24.11: Debian 13's slurm-wlm in a namespace cluster like
test_trixie_slurm.py's, with a third node (n1, n2, n3 on one host, as the local cluster),
the .deb installed: real sbatch jobs of the packaged sweep.sbatch, squeue, the output files,
the stand-in all_reduce_perf (tests/fixtures/bin/sweep_all_reduce_perf: a recorded
nccl-tests output whose busbw depends on the job's hosts) through real srun. The acceptance
cases: a node fault on n2 names n2 (and drains it with --drain-suspects), a link fault
between n1 and n3 names that link, healthy names nobody. Root only, slow (about a minute
with a cached Debian root)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.package import test_trixie_slurm as trixie
from tests.package.debian_root import REPO, debian_root, remove_root
from tests.package.slurm_node import START_DAEMONS, SlurmNode
from tests.support.skips import root_only

pytestmark = [
    pytest.mark.slow,
    root_only("debootstrap, chroot and namespaces need root"),
]
NODES = ("n1", "n2", "n3")
SWEEP = ("slurmhealth sweep --nodes 'n[1-3]' --gpus-per-node 1 --time-limit 2 "
         "--command /src/fixtures/bin/sweep_all_reduce_perf "
         "--job-env SWEEP_SRUN_MPI=--mpi=none --json")  # fmt: skip


def _three_nodes(root: Any) -> None:
    conf = root / "etc/slurm/slurm.conf"
    text = conf.read_text().replace("Nodes=n[1-2]", "Nodes=n[1-3]")
    n2 = next(line for line in text.splitlines() if line.startswith("NodeName=n2 "))
    n3 = n2.replace("NodeName=n2", "NodeName=n3").replace("Port=17002", "Port=17003")
    conf.write_text(text.replace(n2, f"{n2}\n{n3}"))
    (root / "etc/slurm/gres.conf").write_text(
        "NodeName=n[1-3] Name=gpu Type=h100 File=/dev/nvidia[0-7]\n"
    )
    (root / "etc/slurmhealth/scenario.toml").write_text('name = "healthy"\n')
    for sub in ("var/lib/slurmhealth/n3", "run/slurmhealth/n3", "var/lib/slurm/slurmd/n3"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for sub in ("bin", "baseline"):
        shutil.copytree(REPO / "tests/fixtures" / sub, root / "src/fixtures" / sub,
                        dirs_exist_ok=True)  # fmt: skip


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmNode]:
    for tool in ("unshare", "nsenter", "ip", "zstd"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed (util-linux, iproute2, zstd)")
    root = tmp_path_factory.mktemp("trixie-sweep") / "root"
    debian_root("trixie", root, include=trixie.INCLUDE, packages=trixie.PACKAGES)
    trixie.install_slurmhealth(root)
    trixie.configure(root)
    _three_nodes(root)
    node = SlurmNode(root)
    try:
        done = node.run(START_DAEMONS + "slurmd -N n3\n")
        assert done.returncode == 0, done.stdout + done.stderr + node.logs()
        deadline = time.monotonic() + 90
        while node.states() != {n: "idle" for n in NODES}:
            assert time.monotonic() < deadline, f"nodes {node.states()}\n{node.logs()}"
            time.sleep(0.5)
        yield node
    finally:
        node.stop()
        remove_root(root)


def _sweep(node: SlurmNode, faults: str, *extra: str) -> tuple[int, dict[str, Any]]:
    done = node.run(f"rc=0; {SWEEP} {' '.join(extra)} || rc=$?; echo rc=$rc", timeout=400,
                    SWEEP_FAKE_FAULTS=faults)  # fmt: skip
    body, _, rc = done.stdout.rpartition("rc=")
    assert body.strip(), done.stderr + node.logs()
    return int(rc), dict(json.loads(body))


def _reasons(node: SlurmNode) -> dict[str, str]:
    out = node.run("sinfo -R -h -N -o '%N|%E'").stdout
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def _real_jobs(node: SlurmNode, record: dict[str, Any]) -> None:
    for r in record["results"]:
        job = trixie.show_job(node, r["job_id"])
        assert job["JobName"] == f"slurmhealth-sweep-{record['id']}"
        assert job["JobState"] in ("COMPLETED", "COMPLETING"), job


def test_healthy_names_nobody(cluster3: SlurmNode) -> None:
    rc, record = _sweep(cluster3, "")
    assert rc == 0 and record["suspects"] == [] and not record["inconclusive"]
    assert record["jobs"] == 6  # each node alone, the 3 pairs
    _real_jobs(cluster3, record)


def test_a_link_fault_between_n1_and_n3_names_the_link_not_a_node(cluster3: SlurmNode) -> None:
    rc, record = _sweep(cluster3, "link:n1+n3=0.5")
    assert rc == 1
    assert [(s["kind"], s["nodes"]) for s in record["suspects"]] == [("link", ["n1", "n3"])]
    units = {tuple(u["nodes"]): u["status"] for u in record["units"]}
    assert units == {("n1",): "ok", ("n2",): "ok", ("n3",): "ok", ("n1", "n2"): "ok",
                     ("n1", "n3"): "slow", ("n2", "n3"): "ok"}  # fmt: skip
    _real_jobs(cluster3, record)
    assert _reasons(cluster3) == {}


def test_a_node_fault_on_n2_names_and_drains_n2(cluster3: SlurmNode) -> None:
    rc, record = _sweep(cluster3, "node:n2=0.5", "--drain-suspects")
    assert rc == 1
    assert [(s["kind"], s["nodes"]) for s in record["suspects"]] == [("node", ["n2"])]
    assert record["drains"][0]["state"] == "drained"
    reasons = _reasons(cluster3)
    assert list(reasons) == ["n2"]
    assert reasons["n2"].startswith("slurmhealth: sweep: node n2: slow with 2 of 2 partners")
    cluster3.run("scontrol update nodename=n2 state=resume")
    shown = cluster3.run(f"slurmhealth sweep show {record['id']} --json")
    assert json.loads(shown.stdout)["suspects"] == record["suspects"]
