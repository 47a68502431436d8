"""``slurmhealth ctld-epilog`` (EpilogSlurmctld): a bounded wait for the node epilogs'
summaries, and it never fails in slurmctld's eyes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from slurmhealth.config import Config, load_config
from slurmhealth.hooks.ctld_epilog import wait_for_summaries


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.on_sleep: list[Path] = []  # files that appear at the first sleep

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for path in self.on_sleep:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("{}")
        self.on_sleep = []


def _cfg(tmp_path: Path) -> Config:
    path = tmp_path / "c.toml"
    path.write_text(f'[paths]\nevidence_dir = "{tmp_path}/evidence"\n')
    return load_config(str(path), env={})


def test_waits_for_every_nodes_summary_and_no_longer_than_the_bound(tmp_path: Path) -> None:
    cfg, clock = _cfg(tmp_path), FakeClock()
    late = tmp_path / "evidence" / "7" / "n2" / "summary.json"
    clock.on_sleep = [tmp_path / "evidence" / "7" / "n1" / "summary.json", late]
    assert wait_for_summaries(cfg, "7", ("n1", "n2"), 15.0, clock, clock.sleep) == ()
    assert clock.now <= 1.0  # returned as soon as both were there
    clock.now = 0.0
    missing = wait_for_summaries(cfg, "8", ("n1", "n2", "n3"), 15.0, clock, clock.sleep)
    assert missing == ("n1", "n2", "n3") and 15.0 <= clock.now <= 15.5


def test_exits_0_and_says_why_when_it_cannot_store_a_summary(tmp_path: Path) -> None:
    cfg_path = tmp_path / "c.toml"
    cfg_path.write_text(f'[paths]\nevidence_dir = "{tmp_path}/ev"\ndb = "{tmp_path}/h.db"\n')
    env = {"PATH": "/nonexistent", "SLURMHEALTH_CONFIG": str(cfg_path)}
    for extra in ({"SLURM_JOB_ID": "not-a-job"},
                  {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-"},
                  {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": ""}):  # fmt: skip
        proc = subprocess.run([sys.executable, "-m", "slurmhealth", "ctld-epilog"],
                              env={**env, **extra}, capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "no job summary stored" in proc.stderr and "Traceback" not in proc.stderr
