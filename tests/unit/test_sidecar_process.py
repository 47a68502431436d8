"""The real `slurmhealth sidecar` process on a simulated node whose faults arrive mid-job:
each detector fires exactly once, on the right GPU, at the right time."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

BUSY_WITH_FAULTS = """
name = "busy-with-faults"
[all_gpus]
utilization_gpu = 95
power_usage_w = 650.0
clock_event_reasons = []
[gpu.4]
utilization_gpu = 40
power_usage_w = 300.0
[gpu.3]
clock_event_reasons = ["hw_slowdown"]
[[faults]]
gpu = 1
at = 2
set = { "nvlink.3.state" = "inactive" }
[[faults]]
gpu = 2
at = 3
xid = 79
xid_message = "GPU has fallen off the bus."
"""
ALL_IDLE = """
name = "all-idle"
[all_gpus]
utilization_gpu = 0
"""


def _start(tmp: Path, scenario: str, job: str, hang_after: float) -> subprocess.Popen[bytes]:
    (tmp / "scenario.toml").write_text(scenario)
    (tmp / "config.toml").write_text(
        f"""
[gpu]
backend = "sim"
sim_scenario = "{tmp}/scenario.toml"
sim_kernel_log = "{tmp}/kmsg"
[paths]
db = "{tmp}/history.db"
run_dir = "{tmp}/run"
[sidecar]
interval_s = 1.0
job_check_interval_s = 100000
dcgm_job_mapping_dir = "{tmp}/dcgm-job-mapping"
throttle_sustain_s = 2.0
straggler_window_s = 3.0
hang_after_s = {hang_after}
# the test's loop writes its steps in bursts once a second: at the default factor (5 x a
# 0.1 s step) a sample taken late in that second would see a stall
stall_factor = 20.0
"""
    )
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SLURMHEALTH"))},
        "SLURMHEALTH_CONFIG": str(tmp / "config.toml"),
        "SLURMD_NODENAME": "node1",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "slurmhealth", "sidecar", "--job", job, "--gpus", "0-7"],
        env=env,
        stderr=subprocess.DEVNULL,
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


def _events(tmp: Path) -> list[dict[str, object]]:
    with sqlite3.connect(tmp / "history.db") as conn:
        conn.row_factory = sqlite3.Row
        return [dict(r) for r in conn.execute("select * from events order by ts")]


def _epoch(tmp: Path) -> float:
    (value,) = json.loads((tmp / "kmsg.epoch.json").read_text()).values()
    return float(value)


def test_faults_mid_job_each_give_one_event(tmp_path: Path) -> None:
    proc = _start(tmp_path, BUSY_WITH_FAULTS, "501", hang_after=600)
    job_dir = tmp_path / "run" / "jobs" / "501"
    job_dir.mkdir(parents=True)
    steps = job_dir / "steps-0.jsonl"
    try:
        step = 0
        for second in range(9):  # the training loop: 10 steps a second, 10x slower from t=6
            slow = second >= 6
            with steps.open("a") as fh:
                for _ in range(10):
                    step += 1
                    line = {"ts": time.time(), "rank": 0, "step": step, "samples": 32,
                            "step_seconds": 1.0 if slow else 0.1}  # fmt: skip
                    fh.write(json.dumps(line) + "\n")
            time.sleep(1.0)
    finally:
        _stop(proc)
    epoch = _epoch(tmp_path)
    events = _events(tmp_path)
    by_kind: dict[str, list[dict[str, object]]] = {}
    for e in events:
        by_kind.setdefault(str(e["kind"]), []).append(e)
    assert set(by_kind) == {"nvlink_down", "xid", "throttle", "straggler", "throughput_drop"}
    assert all(len(v) == 1 for v in by_kind.values()), by_kind
    (nvlink,) = by_kind["nvlink_down"]
    assert nvlink["gpu"] == 1 and json.loads(str(nvlink["evidence"]))["link"] == 3
    assert 2 <= float(nvlink["ts"]) - epoch <= 4.5  # down at t=2, seen at the next sample
    (xid,) = by_kind["xid"]
    assert xid["gpu"] == 2 and xid["severity"] == "critical" and "79" in str(xid["message"])
    assert 3 <= float(xid["ts"]) - epoch <= 5.5
    (throttle,) = by_kind["throttle"]
    assert throttle["gpu"] == 3 and float(throttle["ts"]) - epoch <= 4.5  # sustained 2 s
    (straggler,) = by_kind["straggler"]
    assert straggler["gpu"] == 4 and straggler["severity"] == "warn"
    (drop,) = by_kind["throughput_drop"]
    assert drop["gpu"] is None and float(drop["ts"]) - epoch >= 6


def test_all_gpus_idle_is_a_hang(tmp_path: Path) -> None:
    proc = _start(tmp_path, ALL_IDLE, "502", hang_after=3)
    mapping = tmp_path / "dcgm-job-mapping"
    export = tmp_path / "run" / "export"
    try:
        time.sleep(6)
        # dcgm-exporter's HPC job mapping: one file per GPU index holding the job id
        assert sorted(p.name for p in mapping.iterdir()) == [str(i) for i in range(8)]
        assert {p.read_text().strip() for p in mapping.iterdir()} == {"502"}
        # the job's series, published for the node's exporter (root-only directory)
        assert [p.name for p in export.iterdir()] == ["job-502.json"]
        assert export.stat().st_mode & 0o027 == 0
        state = json.loads((export / "job-502.json").read_text())
        assert state["pid"] == proc.pid and time.time() - state["ts"] < 3
        names = {f["name"] for f in state["families"] if f["samples"]}
        assert {"slurmhealth_gpu_utilization_ratio", "slurmhealth_job_info"} <= names
    finally:
        _stop(proc)
    assert list(mapping.iterdir()) == []  # removed when the sidecar stops
    assert list(export.iterdir()) == []
    events = _events(tmp_path)
    assert [(e["kind"], e["gpu"], e["severity"]) for e in events] == [("hang", None, "critical")]
    assert 3 <= float(events[0]["ts"]) - _epoch(tmp_path) <= 5.5
