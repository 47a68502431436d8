"""The real `slurmhealth sidecar` process on a simulated node whose faults arrive mid-job:
each detector fires exactly once, on the right GPU, at the right time.

No wall-clock races: the test waits on conditions (the sidecar read the steps, the events are
in the history) under generous deadlines, and judges event times against the sidecar's own
clock readings (the ``ts`` of its samples) and the scenario's clock (its epoch), so a loaded
machine only makes it slower.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tests.support.sim_config import sidecar_config, sidecar_env

T = TypeVar("T")
DEADLINE_S = 90.0  # for anything the sidecar must do: generous, only a hung sidecar hits it
# scenario seconds: after the sidecar's first samples (a sidecar that starts later, on a very
# loaded machine, sees them at its first sample: still the first sample that could)
NVLINK_AT, XID_AT = 4.0, 5.0

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
at = 4
set = { "nvlink.3.state" = "inactive" }
[[faults]]
gpu = 2
at = 5
xid = 79
xid_message = "GPU has fallen off the bus."
"""
ALL_IDLE = """
name = "all-idle"
[all_gpus]
utilization_gpu = 0
"""


def _start(tmp: Path, scenario: str, job: str, hang_after: float) -> subprocess.Popen[bytes]:
    # the test's loop writes its steps in bursts, each once the sidecar read the one before:
    # on a loaded machine the gaps between bursts are long, and no stall is meant
    config = sidecar_config(
        tmp, scenario, db="history.db", dcgm_job_mapping_dir=f'"{tmp}/dcgm-job-mapping"',
        throttle_sustain_s=2.0, straggler_window_s=3.0, hang_after_s=hang_after,
        stall_factor=1000.0,
    )  # fmt: skip
    env = sidecar_env(config)
    return subprocess.Popen(
        [sys.executable, "-m", "slurmhealth", "sidecar", "--job", job, "--gpus", "0-7"],
        env=env,
        stderr=subprocess.DEVNULL,
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=DEADLINE_S) == 0


def _wait(what: str, probe: Callable[[], T | None], tick: Callable[[], None] = lambda: None) -> T:
    """Poll ``probe`` until it returns something (calling ``tick`` in between)."""
    end = time.monotonic() + DEADLINE_S
    while (found := probe()) is None:
        assert time.monotonic() < end, f"waited {DEADLINE_S:.0f} s for {what}"
        tick()
        time.sleep(0.05)
    return found


def _query(tmp: Path, sql: str) -> list[dict[str, Any]]:
    if not (tmp / "history.db").exists():
        return []
    try:
        with contextlib.closing(sqlite3.connect(tmp / "history.db", timeout=DEADLINE_S)) as conn:
            conn.row_factory = sqlite3.Row
            return [dict(r) for r in conn.execute(sql)]
    except sqlite3.OperationalError:  # the sidecar is creating the schema
        return []


def _events(tmp: Path) -> list[dict[str, Any]]:
    return _query(tmp, "select * from events order by ts")


def _sample_times(tmp: Path) -> list[float]:
    """The sidecar's own clock readings: the ts of each of its GPU snapshots."""
    rows = _query(tmp, "select distinct ts from samples where gpu is not null order by ts")
    return [float(r["ts"]) for r in rows]


def _epoch(tmp: Path) -> float | None:
    """The scenario clock's start, once the simulator in the sidecar wrote it."""
    try:
        (value,) = json.loads((tmp / "kmsg.epoch.json").read_text()).values()
    except (OSError, ValueError):
        return None
    return float(value)


def _steps_seen(tmp: Path, job: str) -> int | None:
    """The training steps the sidecar has read, from the series it publishes for the
    node's exporter (``run/export/job-<id>.json``)."""
    try:
        doc = json.loads((tmp / "run" / "export" / f"job-{job}.json").read_text())
    except (OSError, ValueError):
        return None
    values = [value for fam in doc["families"] if fam["name"] == "slurmhealth_job_steps"
              for name, _labels, value in fam["samples"] if name.endswith("_total")]  # fmt: skip
    return int(float(values[0])) if values else None


def _seen_at(ts: float, fault: float, samples: list[float]) -> bool:
    """True when ``ts`` is the sample that saw ``fault`` first: the last one started before
    it (its reads came after) or the first one started after it."""
    before = [s for s in samples if s < fault]
    after = [s for s in samples if s >= fault]
    return ts in (before[-1:] + after[:1])


class _TrainingLoop:
    """Steps in bursts of 10 through the task channel, each burst once the sidecar read the
    one before (10 steps of 0.1 s, then 10x slower once ``slow()`` was called)."""

    def __init__(self, tmp: Path, job: str) -> None:
        self.tmp, self.job = tmp, job
        self.file = tmp / "run" / "jobs" / job / "steps-0.jsonl"
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self.step = self.bursts = 0
        self.slow_since: float | None = None

    def slow(self) -> None:
        self.slow_since = time.time()

    def tick(self) -> None:
        if self.step and _steps_seen(self.tmp, self.job) != self.step:
            return
        with self.file.open("a") as fh:
            for _ in range(10):
                self.step += 1
                line = {"ts": time.time(), "rank": 0, "step": self.step, "samples": 32,
                        "step_seconds": 0.1 if self.slow_since is None else 1.0}  # fmt: skip
                fh.write(json.dumps(line) + "\n")
        self.bursts += 1


def _kinds(tmp: Path) -> dict[str, list[dict[str, Any]]]:
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for e in _events(tmp):
        by_kind.setdefault(str(e["kind"]), []).append(e)
    return by_kind


def test_faults_mid_job_each_give_one_event(tmp_path: Path) -> None:
    proc = _start(tmp_path, BUSY_WITH_FAULTS, "501", hang_after=600)
    expected = {"nvlink_down", "xid", "throttle", "straggler", "throughput_drop"}
    try:
        epoch = _wait("the scenario clock", lambda: _epoch(tmp_path))
        loop = _TrainingLoop(tmp_path, "501")
        # six bursts read at full speed: the job's throughput median (5 values needed)
        _wait("6 bursts read", lambda: True if loop.bursts > 6 else None, loop.tick)
        loop.slow()
        _wait("every event", lambda: True if expected <= set(_kinds(tmp_path)) else None, loop.tick)
        # a few more samples, in which a second event of any kind would show
        last = max(float(e["ts"]) for e in _events(tmp_path))
        _wait("3 samples more", lambda: True if _samples_after(tmp_path, last) >= 3 else None,
              loop.tick)  # fmt: skip
    finally:
        _stop(proc)
    samples = _sample_times(tmp_path)
    by_kind = _kinds(tmp_path)
    assert set(by_kind) == expected, by_kind
    twice = {k: [(e["ts"], e["gpu"], e["message"], e["evidence"]) for e in v]
             for k, v in by_kind.items() if len(v) > 1}  # fmt: skip
    assert not twice, (twice, epoch, samples)
    (nvlink,) = by_kind["nvlink_down"]
    assert nvlink["gpu"] == 1 and json.loads(str(nvlink["evidence"]))["link"] == 3
    assert _seen_at(float(nvlink["ts"]), epoch + NVLINK_AT, samples), (nvlink, samples)
    (xid,) = by_kind["xid"]
    assert xid["gpu"] == 2 and xid["severity"] == "critical" and "79" in str(xid["message"])
    # the Xid's own time: the kernel log's (the fault's) or the event API's delivery, which
    # comes before the sample after the one that could first see it
    xid_ts, fault = float(xid["ts"]), epoch + XID_AT
    assert fault - 0.05 <= xid_ts <= [s for s in samples if s >= fault][1], (xid, samples)
    (throttle,) = by_kind["throttle"]  # GPU 3 throttles from the start: sustained 2 s
    assert throttle["gpu"] == 3 and float(throttle["ts"]) == samples[0] + 2.0
    (straggler,) = by_kind["straggler"]  # GPU 4 at 40%: once a window of 3 samples is full
    assert straggler["gpu"] == 4 and straggler["severity"] == "warn"
    assert float(straggler["ts"]) in samples[2:]
    (drop,) = by_kind["throughput_drop"]
    assert loop.slow_since is not None
    assert drop["gpu"] is None and float(drop["ts"]) >= loop.slow_since


def _samples_after(tmp: Path, ts: float) -> int:
    return len([s for s in _sample_times(tmp) if s > ts])


def test_all_gpus_idle_is_a_hang(tmp_path: Path) -> None:
    proc = _start(tmp_path, ALL_IDLE, "502", hang_after=3)
    mapping = tmp_path / "dcgm-job-mapping"
    export = tmp_path / "run" / "export"
    try:
        # dcgm-exporter's HPC job mapping: one file per GPU index holding the job id
        names = [str(i) for i in range(8)]
        _wait("the job mapping", lambda: True if _mapped(mapping) == names else None)
        assert {p.read_text().strip() for p in mapping.iterdir()} == {"502"}
        # the job's series, published for the node's exporter (root-only directory)
        state_file = export / "job-502.json"
        _wait("the published series", lambda: True if state_file.exists() else None)
        assert [p.name for p in export.iterdir()] == ["job-502.json"]
        assert export.stat().st_mode & 0o027 == 0
        state = json.loads(state_file.read_text())
        assert state["pid"] == proc.pid
        names = {f["name"] for f in state["families"] if f["samples"]}
        assert {"slurmhealth_gpu_utilization_ratio", "slurmhealth_job_info"} <= names
        _wait("the hang", lambda: _events(tmp_path) or None)
    finally:
        _stop(proc)
    assert list(mapping.iterdir()) == []  # removed when the sidecar stops
    assert list(export.iterdir()) == []
    events = _events(tmp_path)
    assert [(e["kind"], e["gpu"], e["severity"]) for e in events] == [("hang", None, "critical")]
    assert float(events[0]["ts"]) == _sample_times(tmp_path)[0] + 3.0  # idle 3 s


def _mapped(mapping: Path) -> list[str]:
    """The mapping's complete files (written atomically: no temporary names)."""
    if not mapping.is_dir():
        return []
    return sorted(p.name for p in mapping.iterdir() if p.name.isdigit())
