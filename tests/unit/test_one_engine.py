"""One health engine: the prolog's checks and the sidecar's detectors judge with the same
catalog, thresholds, ``[checks] disabled`` list and ``[checks.<name>]`` overrides."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from slurmhealth.checks import catalog
from slurmhealth.config import Config, load_config
from slurmhealth.hooks.check import CheckResult, run_check
from slurmhealth.model import NodeSnapshot, XidEvent
from slurmhealth.sidecar.detectors import FROM_CHECKS, KINDS, Detectors
from slurmhealth.sidecar.rdma import EVENT_KINDS as RDMA_EVENTS
from slurmhealth.sidecar.state import Event
from tests.unit.test_detectors import T0, gpu, snap

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def config(tmp_path: Path, toml: str = "") -> Config:
    """The effective config from a config file holding ``toml``, simulated GPUs."""
    path = tmp_path / "config.toml"
    # two prolog runs 0.3 s apart: shorten the rate evidence (default 300 s, 5 errors)
    path.write_text(toml + "[checks.nvlink_errors]\nmin_window_s = 0.2\nmin_count = 1\n")
    flags = {
        "gpu.backend": "sim",
        "gpu.sim_scenario": str(SCENARIOS / "nvlink-errors.toml"),
        "gpu.sim_kernel_log": str(tmp_path / "kmsg"),
        "paths.db": str(tmp_path / "history.db"),
        "node.name": "node1",
    }
    return load_config(str(path), env={}, flags=flags)


def prolog_twice(cfg: Config) -> list[CheckResult]:
    """Two prolog runs a moment apart: the second sees the NVLink counter grow."""
    first = run_check(cfg, phase="prolog")
    time.sleep(0.3)
    return [first, run_check(cfg, phase="prolog")]


def sidecar(cfg: Config, make: Callable[[float], NodeSnapshot], until: float = 300) -> list[Event]:
    det = Detectors(cfg, range(8))
    return [e for t in range(0, int(until), 10) for e in det.observe(make(t))]


def replays_growing(t: float) -> NodeSnapshot:
    """GPU 4's NVLink 3 gains 10 replays every 10 s (60/min) from the start."""
    g = gpu(4)
    assert g.nvlinks is not None
    links = tuple(replace(lk, replay_errors=int(t) if lk.link == 3 else 0) for lk in g.nvlinks)
    return snap(t, g4=replace(g, nvlinks=links))


def margin(at: Callable[[float], int]) -> Callable[[float], NodeSnapshot]:
    """GPU 5's thermal margin in degrees C over time."""
    return lambda t: snap(t, g5=replace(gpu(5), margin_temperature_c=at(t)))


def test_growing_nvlink_errors_reported_by_prolog_and_sidecar_alike(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    runs = prolog_twice(cfg)
    assert [f.check for f in runs[1].findings] == ["nvlink_errors"]
    assert runs[1].exit_code == 1
    events = sidecar(cfg, replays_growing)
    assert [(e.kind, e.gpu, e.evidence["link"]) for e in events] == [("nvlink_errors", 4, 3)]


def test_disabled_check_is_silent_in_prolog_and_sidecar(tmp_path: Path) -> None:
    cfg = config(tmp_path, '[checks]\ndisabled = ["nvlink_errors"]\n')
    assert cfg.checks.disabled == ["nvlink_errors"]
    for result in prolog_twice(cfg):
        assert result.findings == () and result.exit_code == 0
    assert sidecar(cfg, replays_growing) == []


def test_thermal_margin_override_moves_the_sidecar_event(tmp_path: Path) -> None:
    def falling(t: float) -> int:  # 10 C left, then 1 C less every 10 s from t=100
        return max(0, 10 - max(0, int(t) - 100) // 10)

    default = sidecar(config(tmp_path), margin(falling))
    assert [(e.kind, e.gpu, e.ts - T0) for e in default] == [("thermal", 5, 200)]  # 0 C
    cfg = config(tmp_path, "[checks.thermal_margin]\nfail_c = 3\n")
    ev = sidecar(cfg, margin(falling))
    assert [(e.kind, e.gpu, e.ts - T0) for e in ev] == [("thermal", 5, 170)]  # 3 C
    assert ev[0].evidence["margin_c"] == 3
    assert ev[0].severity is KINDS["thermal"]


def test_thermal_event_fires_once_and_again_after_recovery(tmp_path: Path) -> None:
    def swing(t: float) -> int:
        return 0 if 50 <= t < 80 or t >= 200 else 20

    events = sidecar(config(tmp_path), margin(swing))
    assert [e.ts - T0 for e in events] == [50, 200]


def test_every_sidecar_check_becomes_an_event_kind() -> None:
    in_sidecar = {s.name for s in catalog().values() if "sidecar" in s.phases}
    assert in_sidecar == set(FROM_CHECKS) | set(RDMA_EVENTS)  # the RDMA watch maps its own
    assert set(FROM_CHECKS.values()) | set(RDMA_EVENTS.values()) <= set(KINDS)


def test_disabled_xid_check_silences_the_sidecars_xid_events(tmp_path: Path) -> None:
    x = XidEvent(xid=79, pci_bus_id="0000:5d:00", message="", raw="", ts=T0)
    buses = {gpu(i).pci_bus_id or "": i for i in range(8)}
    assert [e.kind for e in Detectors(config(tmp_path), range(8)).observe_xids([x], buses)] == [
        "xid"
    ]
    off = config(tmp_path, '[checks]\ndisabled = ["xid"]\n')
    assert Detectors(off, range(8)).observe_xids([x], buses) == []
