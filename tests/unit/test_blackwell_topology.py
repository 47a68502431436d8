"""Blackwell and per-SKU design, through `slurmhealth check --json` on the simulator: GB200
NVL72 fabric registration and health, NVLink5 Xids by their decoded fields, a 12-link H100
NVL judged by its design, node-set overrides of the design, IMEX where a partition needs it."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from slurmhealth.checks import CheckContext, run_checks
from slurmhealth.checks.sku import design
from slurmhealth.config import load_config
from slurmhealth.gpu.imex import read_imex
from slurmhealth.gpu.nvml import NvmlBackend
from slurmhealth.gpu.presets_more import NVL72_CLIQUE_ID
from slurmhealth.gpu.scenario import load_scenario
from slurmhealth.gpu.sim import SimulatedNvml
from slurmhealth.hooks.check import run_check
from slurmhealth.model import NodeSnapshot, fabric_health
from tests.conftest import run_cli

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def check_json(scenario: str | Path, tmp_path: Path, config: str = "") -> tuple[int, Any]:
    """`slurmhealth check --json` on a node checked before (healthy, so the kernel-log
    position is stored and the scenario's Xid lines are new)."""
    path = scenario if isinstance(scenario, Path) else SCENARIOS / f"{scenario}.toml"
    cfg = tmp_path / "config.toml"
    cfg.write_text(config)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURMHEALTH_")}
    env |= {
        "SLURMHEALTH_CONFIG": str(cfg), "SLURMHEALTH_GPU_BACKEND": "sim",
        "SLURMHEALTH_SIM_SCENARIO": str(SCENARIOS / "healthy.toml"),
        "SLURMHEALTH_SIM_KERNEL_LOG": str(tmp_path / "kmsg"),
        "SLURMHEALTH_DB": str(tmp_path / "history.db"), "SLURMHEALTH_NODE_NAME": "gb-01",
    }  # fmt: skip
    if not (tmp_path / "kmsg").exists():
        (tmp_path / "kmsg").touch()
        assert run_cli("check", env=env).returncode == 0
    done = run_cli("check", "--json", env={**env, "SLURMHEALTH_SIM_SCENARIO": str(path)})
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def snap(scenario: str) -> NodeSnapshot:
    lib = SimulatedNvml(load_scenario(str(SCENARIOS / f"{scenario}.toml")), "gb-01")
    backend = NvmlBackend(lib, node="gb-01")
    try:
        return backend.snapshot()
    finally:
        backend.close()


def test_gb200_tray_is_healthy_and_registered_in_one_clique(tmp_path: Path) -> None:
    code, out = check_json("gb200-nvl72", tmp_path)
    assert code == 0 and out["findings"] == []
    assert len(out["gpus"]) == 4
    fabric = [g["fabric"] for g in out["gpus"]]
    assert {f["clique_id"] for f in fabric} == {NVL72_CLIQUE_ID}
    assert len({f["cluster_uuid"] for f in fabric}) == 1
    assert {f["health"]["degraded_bw"] for f in fabric} == {"full"}
    # four PCI domains, one GPU each, as on a GB200 compute tray
    assert len({g["pci_bus_id"].split(":")[0] for g in out["gpus"]}) == 4


def test_gb200_degraded_fabric_fails_naming_the_health(tmp_path: Path) -> None:
    code, out = check_json("gb200-fabric-degraded", tmp_path)
    assert code == 1
    (f,) = out["findings"]
    assert (f["check"], f["severity"], f["gpu"], f["action"]) == (
        "fabric_state",
        "fail",
        2,
        "drain",
    )
    assert "fabric health degraded" in f["message"] and "degraded_bw" in f["message"]
    assert f["evidence"]["health"]["degraded_bw"] == "degraded"


@pytest.mark.parametrize(
    ("mask_items", "severity"),
    [
        (["route_unhealthy:unhealthy"], "fail"),
        (["gfm_state:disconnected"], "fail"),
        (["incorrect_configuration:insufficient_nvlinks"], "fail"),
        (["partition_assigned:unassigned"], "fail"),
        (["route_recovery:in_progress"], "warn"),
        (["access_timeout_recovery:in_progress"], "warn"),
    ],
)
def test_each_degraded_health_field_is_named(
    mask_items: list[str], severity: str, tmp_path: Path
) -> None:
    healthy = [
        "degraded_bw:full", "route_recovery:none", "route_unhealthy:healthy",
        "access_timeout_recovery:none", "incorrect_configuration:none",
        "partition_assigned:assigned", "gfm_state:connected",
    ]  # fmt: skip
    names = {m.split(":")[0] for m in mask_items}
    items = [h for h in healthy if h.split(":")[0] not in names] + mask_items
    scenario = tmp_path / "fabric.toml"
    scenario.write_text(
        f'preset = "gb200"\ngpus = 4\n[gpu.1]\nfabric_health = {json.dumps(items)}\n'
    )
    code, out = check_json(scenario, tmp_path)
    (f,) = out["findings"]
    assert (f["gpu"], f["severity"], code) == (1, severity, 1 if severity == "fail" else 0)
    assert mask_items[0].split(":")[1] in f["message"]


def test_fabric_registration_incomplete_on_gb200_is_not_ready(tmp_path: Path) -> None:
    scenario = tmp_path / "fabric.toml"
    scenario.write_text('preset = "gb200"\ngpus = 4\n[gpu.3]\nfabric_state = "in_progress"\n')
    code, out = check_json(scenario, tmp_path)
    assert code == 1 and [(f["gpu"], f["check"]) for f in out["findings"]] == [(3, "fabric_state")]
    assert "in progress" in out["findings"][0]["message"]


def test_fabric_mask_round_trips_through_the_adapter() -> None:
    g = snap("gb200-fabric-degraded").gpu(2)
    assert g is not None and g.fabric_health_mask is not None
    assert fabric_health(g.fabric_health_mask)["degraded_bw"] == "degraded"
    assert g.fabric_clique_id == NVL72_CLIQUE_ID and g.fabric_cluster_uuid


@pytest.mark.parametrize(
    ("scenario", "code"), [("nvlink5-xid-fatal", 1), ("nvlink5-xid-ignore", 0)]
)
def test_nvlink5_xid_scenarios(scenario: str, code: int, tmp_path: Path) -> None:
    got, out = check_json(scenario, tmp_path)
    assert got == code
    (f,) = out["findings"]
    assert f["check"] == "xid" and f["evidence"]["basis"] == "decode"
    assert f["evidence"]["nvlink5"]["decode"] == "V1"  # the scenarios' driver is R570
    assert f["action"] == ("reset" if code else "record")


def test_h100_nvl_with_its_12_links_is_healthy_and_an_11th_missing_fails(tmp_path: Path) -> None:
    code, out = check_json("h100-nvl-12-links", tmp_path)
    assert code == 0 and out["findings"] == []
    scenario = tmp_path / "nvl-down.toml"
    scenario.write_text('preset = "h100-nvl"\n[gpu.5]\nnvlink.3.state = "inactive"\n')
    code, out = check_json(scenario, tmp_path)
    assert code == 1
    assert {(f["check"], f["gpu"], f["evidence"]["link"]) for f in out["findings"]} >= {
        ("nvlink_inactive", 5, 3)
    }
    assert {f["evidence"]["expected_links"] for f in out["findings"]} == {12}


def test_a_node_set_override_makes_a_12_link_h100_sxm_healthy(tmp_path: Path) -> None:
    scenario = tmp_path / "vm.toml"
    links = "".join(f'nvlink.{n}.state = "inactive"\n' for n in range(12, 18))
    scenario.write_text(f'preset = "h100-sxm"\ngpus = 2\n[all_gpus]\n{links}')
    code, _ = check_json(scenario, tmp_path)
    assert code == 1  # the SXM design has 18
    cfg = '[gpu.topology."gb-[01-04]"]\nnvlinks = 12\n'
    code, out = check_json(scenario, tmp_path, cfg)
    assert code == 0 and out["findings"] == []
    other = '[gpu.topology."other-[01-04]"]\nnvlinks = 12\n'  # names another node set
    assert check_json(scenario, tmp_path, other)[0] == 1


@pytest.mark.parametrize(
    ("table", "key"),
    [('nvlinks = "twelve"', "nvlinks"), ('sku = "h900"', "sku"), ("speed = 3", "speed")],
)
def test_a_bad_topology_override_is_one_line_naming_the_key(
    table: str, key: str, tmp_path: Path
) -> None:
    cfg = tmp_path / "config.toml"
    cfg.write_text(f'[gpu.topology."gb-01"]\n{table}\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURMHEALTH_")}
    env |= {"SLURMHEALTH_CONFIG": str(cfg), "SLURMHEALTH_NODE_NAME": "gb-01"}
    done = run_cli("config", "check", env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"gpu.topology.gb-01.{key}" in done.stderr and done.stderr.count("\n") <= 2


def test_design_data_covers_the_skus_and_reduced_memory_warns() -> None:
    for model, links in [("NVIDIA H100 80GB HBM3", 18), ("NVIDIA H100 NVL", 12),
                         ("NVIDIA H100 PCIe", 0), ("NVIDIA H200", 18), ("NVIDIA B200", 18),
                         ("NVIDIA GB200", 18), ("NVIDIA A100-SXM4-80GB", 12)]:  # fmt: skip
        sku = design(model)
        assert sku is not None and sku.nvlinks == links, model
    assert design("NVIDIA B200").nvlink_gen == 5  # type: ignore[union-attr]
    s = snap("gb200-nvl72")
    import dataclasses

    g = s.gpus[0]
    small = dataclasses.replace(s, gpus=(dataclasses.replace(g, memory_total_bytes=120_000 << 20),))
    (f,) = run_checks(CheckContext(snapshot=small))
    assert (f.check, f.severity.label) == ("gpu_sku", "warn") and "memory" in f.message


def _chardev(path: Path) -> None:
    os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))


def test_imex_is_checked_only_where_the_partition_needs_it(tmp_path: Path) -> None:
    channels = tmp_path / "imex-channels"
    channels.mkdir()
    proc = tmp_path / "proc"
    (proc / "4242").mkdir(parents=True)
    (proc / "4242" / "comm").write_text("nvidia-imex\n")
    assert read_imex(str(channels), str(proc)).daemon_running is True
    assert read_imex(str(channels), str(proc)).channels == ()
    if os.geteuid() == 0:
        _chardev(channels / "channel0")
        (channels / "channel1").write_text("")  # a regular file is no channel
        assert read_imex(str(channels), str(proc)).channels == ("channel0",)
    (proc / "4242" / "comm").write_text("bash\n")
    assert read_imex(str(channels), str(proc)).daemon_running is False

    flags = {
        "gpu.backend": "sim", "gpu.sim_scenario": str(SCENARIOS / "gb200-nvl72.toml"),
        "gpu.sim_kernel_log": str(tmp_path / "kmsg"), "paths.db": str(tmp_path / "h.db"),
        "node.name": "gb-01", "gpu.imex_channel_dir": str(tmp_path / "absent"),
    }  # fmt: skip
    (tmp_path / "none.toml").write_text("")
    off = load_config(str(tmp_path / "none.toml"), env={}, flags=flags)
    assert run_check(off).exit_code == 0  # no partition needs IMEX: not read
    on = load_config(
        str(tmp_path / "none.toml"), env={}, flags={**flags, "gpu.imex_partitions": ["*"]}
    )
    result = run_check(on)
    (f,) = [f for f in result.findings if f.check == "imex"]
    assert result.exit_code == 1 and "no IMEX channel" in f.message


def test_the_sidecar_judges_links_by_the_node_sets_design_too(tmp_path: Path) -> None:
    """The sidecar's detectors run nvlink_inactive every interval: with the node set's
    [gpu.topology] override a 12-link VM stays quiet; without it the job sees link events."""
    from slurmhealth.sidecar.detectors import Detectors

    scenario = tmp_path / "vm.toml"
    links = "".join(f'nvlink.{n}.state = "inactive"\n' for n in range(12, 18))
    scenario.write_text(f'preset = "h100-sxm"\ngpus = 2\n[all_gpus]\n{links}')
    lib = SimulatedNvml(load_scenario(str(scenario)), "gb-01")
    backend = NvmlBackend(lib, node="gb-01")
    try:
        snapshot = backend.snapshot()
    finally:
        backend.close()
    (tmp_path / "c.toml").write_text("")
    for table, quiet in (({"gb-[01-04]": {"nvlinks": 12}}, True), ({}, False)):
        cfg = load_config(
            str(tmp_path / "c.toml"), env={},
            flags={"node.name": "gb-01", "gpu.topology": table},
        )  # fmt: skip
        events = Detectors(cfg, (0, 1)).observe(snapshot)
        assert (not [e for e in events if "nvlink" in e.kind]) is quiet, events
