"""Every shipped scenario: the intended check fires with its severity, and nothing else."""

from __future__ import annotations

import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from slurmhealth.config import load_config
from slurmhealth.hooks.check import CheckResult, run_check
from slurmhealth.model import Severity

SCENARIOS_DIR = Path(__file__).resolve().parents[2] / "scenarios"
SCENARIOS = sorted(SCENARIOS_DIR.glob("*.toml"))


def _expect(path: Path) -> dict[str, Any]:
    with path.open("rb") as fh:
        return dict(tomllib.load(fh).get("expect", {}))


def _run(path: Path, tmp_path: Path, expect: dict[str, Any]) -> CheckResult:
    """One check of the scenario on a node checked before (healthy, before the fault): the
    kernel-log position is stored, so the scenario's kernel lines are new."""
    if not (tmp_path / "kmsg").exists():
        (tmp_path / "kmsg").touch()
        _check(SCENARIOS_DIR / "healthy.toml", tmp_path, {})
    return _check(path, tmp_path, expect)


def _check(path: Path, tmp_path: Path, expect: dict[str, Any]) -> CheckResult:
    cfg_file = tmp_path / "config.toml"
    tables = expect.get("checks", {}).items()
    cfg_file.write_text(
        "".join(
            f"[checks.{name}]\n" + "".join(f"{k} = {v}\n" for k, v in th.items())
            for name, th in tables
        )
    )
    flags = {
        "gpu.backend": "sim",
        "gpu.sim_scenario": str(path),
        "gpu.sim_kernel_log": str(tmp_path / "kmsg"),
        "paths.db": str(tmp_path / "history.db"),
        "node.name": "node1",
        **expect.get("config", {}),
    }
    cfg = load_config(str(cfg_file), env={}, flags=flags)
    return run_check(cfg, phase=expect.get("phase", "check"))


def test_scenarios_are_shipped() -> None:
    names = {p.stem for p in SCENARIOS}
    assert {"healthy", "nvlink-down", "gpu-lost", "gpu-hang", "ecc-uncorrectable"} <= names
    assert len(SCENARIOS) >= 20


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario_fires_its_check_only(path: Path, tmp_path: Path) -> None:
    expect = _expect(path)
    result = _run(path, tmp_path, expect)
    for _ in range(expect.get("runs", 1) - 1):
        time.sleep(0.3)
        result = _run(path, tmp_path, expect)
    assert result.exit_code == expect["exit"], result.findings
    intended = expect.get("check")
    if intended is None:  # the healthy node
        assert result.findings == ()
        with path.open("rb") as fh:
            assert len(result.snapshot.gpus) == tomllib.load(fh).get("gpus", 8)
        return
    related = {intended, *expect.get("also", [])}
    mine = [f for f in result.findings if f.check == intended]
    assert mine, f"{intended} did not fire: {result.findings}"
    assert max(f.severity for f in mine) == Severity.parse(expect["severity"])
    if "gpu" in expect:
        assert {f.gpu for f in mine} == {expect["gpu"]}
        gpu = result.snapshot.gpu(expect["gpu"])
        assert gpu is not None
        assert {f.uuid for f in mine} == {gpu.uuid}
    unrelated = [f for f in result.findings if f.check not in related]
    assert unrelated == [], f"unrelated checks fired: {unrelated}"


def test_hang_returns_within_deadline(tmp_path: Path) -> None:
    path = next(p for p in SCENARIOS if p.stem == "gpu-hang")
    t0 = time.monotonic()
    result = _run(path, tmp_path, {"config": {"gpu.snapshot_timeout_s": 0.5}})
    elapsed = time.monotonic() - t0
    assert elapsed < 2.0
    (f,) = [f for f in result.findings if f.check == "gpu_unresponsive"]
    assert f.gpu == 6 and f.severity is Severity.CRITICAL
    assert "unresponsive" in f.message and "nvmlDevice" in f.message
    # the other seven GPUs were read in full
    assert all(g.uuid for g in result.snapshot.gpus if g.index != 6)
