"""scripts/device-check on the simulator (as CI runs it): it reads only, records every NVML
call, prints the timings, and its recording replays to the same findings."""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from slurmhealth.config import load_config
from slurmhealth.hooks.check import run_check
from tests.support.skips import unavailable

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "device-check"
FAULTY = """
name = "device-check-faults"
description = "an H100 node whose NVLink counters come only as field values, with faults"
[all_gpus]
not_supported = ["nvlink_counter_api"]
[gpu.1.nvlink.3]
state = "inactive"
[gpu.6]
lost = true
[[faults]]
gpu = 5
rate = { "nvlink.14.replay" = 20.0 }
[[faults]]
gpu = 0
xid = 79
xid_message = "GPU has fallen off the bus."
"""
# what a read-only run may call: getters, init/shutdown, and the Xid event set
READ_ONLY = re.compile(
    r"nvml(Init|Shutdown|SystemGet\w+|DeviceGet\w+|DeviceRegisterEvents"
    r"|EventSet(Create|Wait|Wait_v2|Free))"
)


def device_check(
    tmp_path: Path, scenario: Path, out: Path, backend: str = "sim"
) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "config.toml"
    # the run's two snapshots are 0.5 s apart: judge rates over that (for rate checks that
    # want a minimum window of evidence; thresholds a check does not know are unused)
    config.write_text("[checks.nvlink_errors]\nmin_window_s = 0.2\nmin_count = 1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURMHEALTH_")}
    env |= {
        "SLURMHEALTH_CONFIG": str(config),
        "SLURMHEALTH_GPU_BACKEND": backend,
        "SLURMHEALTH_SIM_SCENARIO": str(scenario),
        "SLURMHEALTH_SIM_KERNEL_LOG": str(tmp_path / "kmsg"),
        "SLURMHEALTH_NODE_NAME": "gpu-node-01",
    }
    cmd = [sys.executable, str(SCRIPT), "--interval", "0.5", "--out", str(out)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)


def recorded(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def test_device_check_records_times_and_replays_to_the_same_findings(tmp_path: Path) -> None:
    live_scenario = tmp_path / "faults.toml"
    live_scenario.write_text(FAULTY)
    (tmp_path / "fixtures").mkdir()
    live = device_check(tmp_path, live_scenario, tmp_path / "fixtures" / "live.json")
    assert live.returncode == 1, live.stderr  # failing checks, like `slurmhealth check`
    rec = recorded(tmp_path / "fixtures" / "live.json")
    found = {(f["check"], f["severity"], f["gpu"]) for f in rec["findings"]}
    assert {
        ("nvlink_inactive", "fail", 1),
        ("nvlink_errors", "fail", 5),  # link 14: through link-scoped field values only
        ("gpu_lost", "critical", 6),
        ("xid", "critical", 0),  # delivered by the NVML event API
    } <= found, found

    calls = rec["calls"]
    assert {c["fn"] for c in calls} >= {"nvmlDeviceGetFieldValues", "nvmlEventSetWait_v2"}
    assert all(READ_ONLY.fullmatch(c["fn"]) for c in calls), {c["fn"] for c in calls}
    assert len(rec["clock"]) >= 2 and rec["node"] == "gpu-node-01"
    # the timings table: one row per NVML function, 2 snapshots x 7 readable GPUs
    row = re.search(r"^\s+nvmlDeviceGetTemperature\s+(\d+)\s+([\d.]+)\s+([\d.]+)$", live.stdout,
                    re.M)  # fmt: skip
    assert row is not None, live.stdout
    assert int(row.group(1)) == 14 and float(row.group(2)) <= float(row.group(3))

    replay_scenario = tmp_path / "replay.toml"
    replay_scenario.write_text(
        'name = "replay"\ndescription = "x"\nreplay = "fixtures/live.json"\n'
    )
    again = device_check(tmp_path, replay_scenario, tmp_path / "again.json")
    assert again.returncode == 1, again.stderr
    assert recorded(tmp_path / "again.json")["findings"] == rec["findings"]  # messages too
    assert again.stdout.split("\n", 1)[0] == live.stdout.split("\n", 1)[0]


def test_device_check_bad_scenario_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[gpu.1]\ntemprature = 1\n")
    result = device_check(tmp_path, bad, tmp_path / "out.json")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "temprature" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out.json").exists()


def test_device_check_refuses_an_unwritable_recording_before_it_runs(tmp_path: Path) -> None:
    scenario = tmp_path / "s.toml"
    scenario.write_text("")
    result = device_check(tmp_path, scenario, tmp_path / "missing" / "out.json")
    assert result.returncode == 2
    assert "missing" in result.stderr and result.stderr.count("\n") == 1
    assert result.stdout == ""  # refused before any NVML call


def _nvml_loads() -> bool:
    """The driver's NVML library loads: the condition under which the test below is moot."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_device_check_on_the_real_pynvml_without_a_driver_says_so(tmp_path: Path) -> None:
    """This machine has no NVIDIA driver: the real backend's failure is one line with the
    adapter's hint (on a GPU node the same script reads the GPUs)."""
    if _nvml_loads():
        unavailable("an NVIDIA driver is present: this test is for a machine without one")
    result = device_check(tmp_path, tmp_path / "unused.toml", tmp_path / "out.json", "nvml")
    assert result.returncode == 2, result.stderr  # a crash (exit 1) fails, never skips
    assert result.stderr.count("\n") == 1 and "NVML did not start" in result.stderr
    assert "driver" in result.stderr
    assert not (tmp_path / "out.json").exists()


def test_a_replay_scenario_drives_slurmhealth_check(tmp_path: Path) -> None:
    live_scenario = tmp_path / "faults.toml"
    live_scenario.write_text(FAULTY)
    assert device_check(tmp_path, live_scenario, tmp_path / "live.json").returncode == 1
    replay_scenario = tmp_path / "replay.toml"
    replay_scenario.write_text('name = "r"\ndescription = "x"\nreplay = "live.json"\n')
    flags = {
        "gpu.backend": "sim",
        "gpu.sim_scenario": str(replay_scenario),
        "gpu.sim_kernel_log": str(tmp_path / "replay.kmsg"),
        "paths.db": str(tmp_path / "history.db"),
        "node.name": "gpu-node-01",
    }
    (tmp_path / "empty.toml").write_text("")
    result = run_check(load_config(str(tmp_path / "empty.toml"), env={}, flags=flags))
    got = {(f.check, f.gpu) for f in result.findings}
    assert {("nvlink_inactive", 1), ("gpu_lost", 6)} <= got, got
    assert result.snapshot.ts == recorded(tmp_path / "live.json")["clock"][0]


SCENARIOS = REPO / "scenarios"


@pytest.mark.parametrize(
    ("scenario", "mig", "clique"),
    [("mig-h100", True, 0), ("gb200-nvl72", False, 32766), ("healthy", False, 0)],
)
def test_device_check_records_mig_and_fabric_answers(
    tmp_path: Path, scenario: str, mig: bool, clique: int
) -> None:
    """What a lent GPU node's run records: the MIG and fabric-info V calls with their
    answers, and each GPU's judged MIG/fabric state; a replay gives the same state."""
    out = tmp_path / "rec.json"
    done = device_check(tmp_path, SCENARIOS / f"{scenario}.toml", out)
    assert done.returncode == 0, done.stdout + done.stderr
    rec = recorded(out)
    fns = {c["fn"] for c in rec["calls"]}
    assert {"nvmlDeviceGetMigMode", "nvmlDeviceGetGpuFabricInfoV"} <= fns
    assert all(READ_ONLY.fullmatch(c["fn"]) for c in rec["calls"])
    rows = rec["mig_fabric"]
    assert {r["mig_mode"] for r in rows} == {mig}
    assert {r["fabric"]["clique_id"] for r in rows} == {clique}
    if mig:
        assert "nvmlDeviceGetMigDeviceHandleByIndex" in fns
        assert {len(r["mig"]) for r in rows} == {7}
        assert "MIG on, 7 MIG devices" in done.stdout
    (tmp_path / "fixtures").mkdir()
    shutil.copy(out, tmp_path / "fixtures" / "rec.json")
    replay = tmp_path / "replay.toml"
    replay.write_text('name = "r"\ndescription = "x"\nreplay = "fixtures/rec.json"\n')
    again = device_check(tmp_path, replay, tmp_path / "again.json")
    assert again.returncode == 0, again.stderr
    assert recorded(tmp_path / "again.json")["mig_fabric"] == rows


def test_device_check_notsupported_mig_and_fabric_read_as_unknown(tmp_path: Path) -> None:
    scenario = tmp_path / "old.toml"
    scenario.write_text('[all_gpus]\nnot_supported = ["mig", "fabric"]\n')
    done = device_check(tmp_path, scenario, tmp_path / "rec.json")
    assert done.returncode == 0, done.stdout + done.stderr  # unknown is never a failure
    rows = recorded(tmp_path / "rec.json")["mig_fabric"]
    assert {(r["mig_mode"], r["fabric"]["state"], r["fabric"]["clique_id"]) for r in rows} == {
        (None, None, None)
    }
    assert "MIG unknown; fabric unknown, clique unknown" in done.stdout
