"""The network layer on the real cluster: n1 and n2 get a generated sysfs tree of a 4-HCA NDR
node each (``[rdma] sysfs_root`` with ``{node}``: the nodes share one config and one host),
a 2-node job runs, and n2's ``mlx5_1`` port starts taking symbol errors while it runs. The
sidecars' RDMA series and n2's ``ib_errors`` event reach Prometheus with the job's labels,
n2's epilog drains it with a ``slurmhealth: ib_errors mlx5_1/1`` reason, and the report
names the network, the HCA and the GPUs behind it (2 and 3). The ib_write_bw template runs
across two nodes and stores its results."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmhealth.kernel_log import format_kmsg_record, split_line
from slurmhealth.rdma import simtree
from tests.integration import test_sidecar
from tests.integration.conftest import Cluster
from tests.integration.test_baseline import _submit
from tests.integration.test_prolog_epilog import slurmhealth
from tests.integration.test_sidecar import Fleet, _wait

REPO = Path(__file__).resolve().parents[2]
BIN = REPO / "tests" / "fixtures" / "bin"
MLX5_DATA = REPO / "tests" / "data" / "mlx5"
MLX5_1 = "0000:3c:00.0"  # the ndr4 tree's mlx5_1 (GPUs 2 and 3 behind it)
TREE_NODES = ("n1", "n2")  # n3 has no RDMA devices: nothing of the layer runs there
SYMBOLS_PER_S = 10.0  # n2 mlx5_1/1's symbol errors once they start (600/min; limit 10/min)
RDMA_CONFIG = """
[rdma]
sysfs_root = "{root}"
devices = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
link_layer = "InfiniBand"

[checks.ib_errors]
# the job lasts under a minute: judge the rate over 10 s and 5 errors (default 300 s, 5)
min_window_s = 10
min_count = 5
"""


def _tree(cluster: Cluster, node: str) -> Path:
    return cluster.dir / "nodes" / node / "sys"


class SymbolErrors:
    """Grows n2 mlx5_1/1's ``counters/symbol_error`` in its tree from ``start()`` on, as a
    marginal cable would (rewritten every 0.5 s until ``stop()``)."""

    def __init__(self, root: Path) -> None:
        spec = simtree.preset("ndr4")
        self.spec = simtree.fault(spec, "counter", "mlx5_1", counter="symbol_error",
                                  per_s=SYMBOLS_PER_S)  # fmt: skip
        self.root = root
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="symbol-errors")

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            simtree.update_counters(str(self.root), self.spec, time.monotonic() - self._t0)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)


@pytest.fixture
def rdma_config(healthy: Cluster) -> Iterator[Cluster]:
    """The cluster with ``[rdma]`` set and a healthy ndr4 tree on n1 and n2; undone after."""
    config = healthy.dir / "slurmhealth.toml"
    good = config.read_text()
    for node in TREE_NODES:
        shutil.rmtree(_tree(healthy, node), ignore_errors=True)
        simtree.write_tree(str(_tree(healthy, node)), simtree.preset("ndr4"))
    root = healthy.dir / "nodes" / "{node}" / "sys"
    config.write_text(good + RDMA_CONFIG.format(root=root))
    try:
        yield healthy
    finally:
        config.write_text(good)
        healthy.wait_idle()
        for node in TREE_NODES:
            shutil.rmtree(_tree(healthy, node), ignore_errors=True)


fleet = test_sidecar.fleet  # its exporters and Prometheus, started once [rdma] is set


@pytest.fixture
def rdma_fleet(rdma_config: Cluster, fleet: Fleet) -> Fleet:
    return fleet


def test_symbol_errors_on_n2_reach_prometheus_drain_n2_and_the_report_names_the_hca(
    rdma_fleet: Fleet,
) -> None:
    fleet, cluster = rdma_fleet, rdma_fleet.cluster
    _wait(lambda: len(fleet.series('up{job="slurmhealth"} == 1')) == 3, 15, "3 targets up")
    job = cluster.sbatch("-N2", "-w", "n1,n2", "--gres=gpu:8", "-o", "/dev/null",
                         "--wrap", "sleep 45", wait=False)  # fmt: skip
    cluster.wait_job(job.job_id, states=frozenset({"RUNNING"}), timeout=60)
    up = f'slurmhealth_rdma_port_up{{job_id="{job.job_id}"}}'
    _wait(lambda: len(fleet.series(up)) == 8, 30, "4 RDMA ports per node in Prometheus")
    ports = [r["metric"] for r in fleet.series(up)]
    assert sorted((m["node"], m["hca"], m["port"]) for m in ports) == [
        (n, f"mlx5_{i}", "1") for n in TREE_NODES for i in range(4)
    ]
    assert {m["user"] for m in ports} == {"shuser"} and {m["state"] for m in ports} == {
        "ACTIVE/LinkUp"
    }
    received = f'slurmhealth_rdma_port_received_bytes_total{{job_id="{job.job_id}",node="n2"}}'
    assert len(fleet.series(received)) == 4

    errors = SymbolErrors(_tree(cluster, "n2"))
    errors.start()
    try:
        symbols = (
            f'slurmhealth_rdma_port_errors_total{{job_id="{job.job_id}",node="n2",'
            'hca="mlx5_1",port="1",counter="all"} > 0'
        )  # the default: the port's counters summed (per_counter_rdma splits them)
        _wait(lambda: fleet.series(symbols), 20, "n2 mlx5_1's symbol errors in Prometheus")
        event = f'slurmhealth_events_total{{job_id="{job.job_id}",kind="ib_errors"}}'
        (ev,) = _wait(lambda: fleet.series(event), 40, "the sidecar's ib_errors event")
        assert ev["metric"]["node"] == "n2" and ev["metric"]["user"] == "shuser"
        assert "gpu" not in ev["metric"]  # a port's event (gpu=""): Prometheus drops the label
        done = cluster.wait_job(job.job_id, timeout=90)
        assert done.state == "COMPLETED", done.record
        reason = _wait(lambda: cluster.sinfo_reasons().get("n2"), 30, "n2's drain reason")
    finally:
        errors.stop()
    assert reason.startswith("slurmhealth: ib_errors mlx5_1/1"), reason
    assert "symbol_error" in reason
    assert "n1" not in cluster.sinfo_reasons()  # its tree stayed healthy

    proc = slurmhealth(cluster, "report", job.job_id, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    (net,) = [d for d in report["diagnoses"] if d["rule"] == "network_degraded"]
    assert net["node"] == "n2", net
    assert "InfiniBand/RoCE port mlx5_1/1" in net["root_cause"], net["root_cause"]
    assert "GPUs 2,3" in net["root_cause"], net["root_cause"]
    assert net["fault_class"] == "system" and "--exclude=n2" in net["user_action"], net
    verdict = report["verdict"]
    # the verdict leads with the job's worst problem: this one unless another rule fired too
    # (CI once saw "n2 fell off the bus" first here, after the login-node test's GPU fault
    # on n2; not reproduced since: the whole report is printed when it happens)
    rules = [d["rule"] for d in report["diagnoses"]]
    if rules[0] == "network_degraded":
        assert verdict.startswith("network degraded on n2: mlx5_1/1 ib_errors"), verdict
        assert "(GPUs 2,3 behind it)" in verdict, verdict
        assert report["answer"]["fault_class"] == "system", report["answer"]
    else:
        print(json.dumps(report, indent=1)[:20000])
        assert "n2" in verdict, verdict


def test_ib_write_bw_template_stores_each_hcas_bandwidth(
    healthy: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sbatch-templates/ib-write-bw.sbatch on two nodes, submitted as test_baseline.py submits
    the other templates, the stand-in ib_write_bw printing a recorded output."""
    monkeypatch.setenv("IB_WRITE_BW", str(BIN / "ib_write_bw"))
    monkeypatch.setenv("IB_DEVICES", "mlx5_0 mlx5_1")
    monkeypatch.setenv("IB_SERVER_WAIT", "1")
    job_id = _submit(healthy, "ib-write-bw.sbatch", tmp_path, "-N", "2")
    done = healthy.wait_job(job_id, timeout=90)
    out = "\n".join(p.read_text() for p in tmp_path.glob(f"*-{job_id}.out"))
    assert done.state == "COMPLETED", f"{done.record}\n{out}"
    shown = slurmhealth(healthy, "baseline", "show", "--json")
    assert shown.returncode == 0, shown.stderr
    rows = [r for r in json.loads(shown.stdout)["baselines"]
            if r["metric"] == "ib_write_bw.bw_avg"]  # fmt: skip
    labels = {r["label"] for r in rows}
    assert {"ib-write-bw-mlx5_0", "ib-write-bw-mlx5_1"} <= labels, rows
    assert all(abs(r["value"] - 392.11) < 0.01 and r["unit"] == "Gb/s" for r in rows), rows


def _append_kmsg(cluster: Cluster, node: str, lines: list[str]) -> None:
    """Log ``lines`` in ``node``'s kernel log (the simulator's kmsg-format file, which the
    hooks read from their stored position), as the mlx5 driver would now."""
    path = cluster.node_dir(node) / "kmsg"
    seqs = [int(r.split(",")[1]) for r in path.read_text().splitlines() if r.count(",") >= 3]
    usec = int(float(Path("/proc/uptime").read_text().split()[0]) * 1e6)
    seq = max(seqs, default=0)
    with path.open("a") as f:
        for i, text in enumerate(lines, 1):
            f.write(format_kmsg_record(seq + i, usec + i, text) + "\n")


def _drained_by_a_job_on(cluster: Cluster, node: str) -> str:
    """Submit a job to ``node``; its prolog reads the new kernel-log lines and drains the
    node: the reason ``sinfo -R`` shows (the held job is cancelled)."""
    job = cluster.sbatch("-w", node, "--gres=gpu:1", "-o", "/dev/null", "--wrap", "true",
                         wait=False)  # fmt: skip
    try:
        return str(_wait(lambda: cluster.sinfo_reasons().get(node), 60, f"{node} drained"))
    finally:
        subprocess.run(["scancel", job.job_id], check=False)
        cluster.wait_idle()


def test_mlx5_command_timeout_and_numbered_fatal_error_drain_n2_with_the_reason(
    rdma_config: Cluster,
) -> None:
    """Real mlx5 lines of public reports (tests/data/mlx5), on n2's mlx5_1 (0000:3c:00.0 in
    the ndr4 tree): a firmware command that never completed drains n2 naming the command;
    after a resume, a numbered fatal error drains it naming the sensor."""
    cluster, node = rdma_config, "n2"
    kmsg = cluster.node_dir(node) / "kmsg"
    kmsg.touch()
    first = cluster.sbatch("-w", node, "--gres=gpu:1", "-o", "/dev/null", "--wrap", "true")
    assert first.state == "COMPLETED", first.record  # the kernel-log position is now set
    assert node not in cluster.sinfo_reasons()

    hang = (MLX5_DATA / "netdev_2025_cx7_access_reg.log").read_text().splitlines()
    _append_kmsg(cluster, node, [split_line(t).text.replace("0000:56:00.0", MLX5_1)
                                 for t in hang])  # fmt: skip
    reason = _drained_by_a_job_on(cluster, node)
    assert reason.startswith(
        "slurmhealth: ib_kernel_log mlx5_1 command interface timeout: ACCESS_REG(0x805)"
    ), reason

    cluster.resume_all()
    _append_kmsg(cluster, node, [f"mlx5_core {MLX5_1}: poll_health:800:(pid 0): "
                                 "Fatal error 1 detected"])  # fmt: skip
    reason = _drained_by_a_job_on(cluster, node)
    assert reason.startswith(
        "slurmhealth: ib_kernel_log mlx5_1 firmware fatal error 1 (PCI communication lost)"
    ), reason
    assert "n1" not in cluster.sinfo_reasons()
