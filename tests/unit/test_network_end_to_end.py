"""The network layer end to end on one simulated node (what tests/integration/test_network.py
does on the real cluster): the prolog reads a healthy 4-HCA tree, a real ``slurmhealth
sidecar`` process publishes the ports' series and raises ``ib_errors`` once mlx5_1/1 takes
symbol errors, the epilog drains with a ``slurmhealth: ib_errors mlx5_1/1`` reason over a
recording Slurm backend, and the report names the network, the HCA and GPUs 2 and 3.

No wall-clock race: the test waits on conditions under generous deadlines; the rate window
is set to 0 s (5 errors are enough evidence)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from slurmhealth.config import load_config
from slurmhealth.history import History
from slurmhealth.hooks.job import job_from_env
from slurmhealth.hooks.prolog import Adapters, HookResult, run_hook
from slurmhealth.rdma import simtree
from slurmhealth.report.gather import build_report
from slurmhealth.slurm import REASON_PREFIX
from tests.support.recording_slurm import JOB, RecordingSlurm
from tests.support.sim_config import hook_flags, sidecar_config, sidecar_env
from tests.unit.test_hooks_decisions import _cluster, _gpu, job_env

T = TypeVar("T")
SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
DEADLINE_S = 60.0
RDMA = """
[rdma]
sysfs_root = "{root}"
devices = ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
[checks.ib_errors]
min_window_s = 0
min_count = 5
"""


def faulty() -> simtree.NodeSpec:
    spec = simtree.preset("ndr4")
    return simtree.fault(spec, "counter", "mlx5_1", counter="symbol_error", per_s=10)


def hook(tmp: Path, phase: str, **env: str) -> tuple[HookResult, RecordingSlurm]:
    cfg_file = tmp / "config.toml"
    cfg_file.write_text(RDMA.format(root=tmp / "{node}" / "sys"))
    cfg = load_config(str(cfg_file), env={}, flags=hook_flags(tmp, SCENARIOS / "healthy.toml"))
    slurm = RecordingSlurm(_cluster())
    environ = job_env(**env)
    history = History(tmp / "history.db", spool_path=tmp / "spool.jsonl")
    adapters = Adapters(slurm, lambda _timeout: _gpu(cfg, tmp), history)
    try:
        return run_hook(cfg, job_from_env(environ, "n1"), environ, phase, adapters), slurm
    finally:
        history.close()


def test_prolog_then_epilog_drain_on_the_port_and_the_report_names_it(tmp_path: Path) -> None:
    root = tmp_path / "n1" / "sys"
    simtree.write_tree(str(root), faulty(), 0.0)  # symbol_error 0 when the job starts
    result, slurm = hook(tmp_path, "prolog")
    assert (result.exit_code, slurm.drains) == (0, [])
    simtree.update_counters(str(root), faulty(), 30.0)  # 300 symbol errors during the job
    result, slurm = hook(tmp_path, "epilog", SLURM_JOB_EXIT_CODE2="0:0")
    ((node, reason),) = slurm.drains
    assert node == "n1" and reason.startswith(f"{REASON_PREFIX} ib_errors mlx5_1/1 "), reason
    assert "symbol_error +300" in reason and "(GPUs 2,3 behind it)" in reason
    cfg = load_config(str(tmp_path / "config.toml"), env={},
                      flags=hook_flags(tmp_path, SCENARIOS / "healthy.toml"))  # fmt: skip
    report = build_report(cfg, JOB)
    assert report.verdict.startswith(
        "network degraded on n1: mlx5_1/1 ib_errors (symbol_error) (GPUs 2,3 behind it)"
    ), report.verdict
    assert report.answer is not None and report.answer.fault_class == "system"


def test_the_sidecar_process_publishes_the_ports_and_raises_ib_errors(tmp_path: Path) -> None:
    root = tmp_path / "node1" / "sys"
    simtree.write_tree(str(root), faulty(), 0.0)
    extra = RDMA.format(root=tmp_path / "{node}" / "sys")
    config = sidecar_config(tmp_path, (SCENARIOS / "healthy.toml").read_text(),
                            db="history.db", extra=extra)  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmhealth", "sidecar", "--job", "4242", "--gpus", "0-7"],
        # a two-node job: its traffic crosses the fabric ([metrics] rdma_series = multi_node)
        env=sidecar_env(config, SLURM_JOB_NODELIST="node[1-2]"), stderr=subprocess.DEVNULL,
    )  # fmt: skip
    state = tmp_path / "run" / "export" / "job-4242.json"
    try:
        fams = wait(lambda: families(state, "slurmhealth_rdma_port_up"), "the RDMA series")
        assert len(fams["slurmhealth_rdma_port_up"]) == 4
        labels = fams["slurmhealth_rdma_port_up"][0][1]
        assert labels["job_id"] == "4242" and labels["node"] == "node1" and labels["port"] == "1"
        t = 0.0

        def grown() -> dict[str, list[list[object]]] | None:
            nonlocal t
            t += 0.5
            simtree.update_counters(str(root), faulty(), t)
            fams = families(state, "slurmhealth_events_total")
            kinds = [s[1]["kind"] for s in (fams or {}).get("slurmhealth_events_total", [])]
            return fams if "ib_errors" in kinds else None

        wait(grown, "the ib_errors event in the series")
        errors = families(state, "slurmhealth_rdma_port_errors_total") or {}
        summed = [s for s in errors["slurmhealth_rdma_port_errors_total"]
                  if s[1]["hca"] == "mlx5_1" and s[1]["counter"] == "all"]  # fmt: skip
        assert summed and float(summed[0][2]) > 0  # the default: one sum per port
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE_S) == 0


def families(path: Path, name: str) -> dict[str, list[list[object]]] | None:
    """The state file's samples by family name, once ``name`` has samples."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    out = {f["name"] + ("_total" if f["type"] == "counter" else ""): f["samples"]
           for f in doc["families"]}  # fmt: skip
    return out if out.get(name) else None


def wait(probe: Callable[[], T | None], what: str) -> T:
    end = time.monotonic() + DEADLINE_S
    while (found := probe()) is None:
        assert time.monotonic() < end, f"waited {DEADLINE_S:.0f} s for {what}"
        time.sleep(0.1)
    return found
