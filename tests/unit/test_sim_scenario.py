"""Scenario files: every mistake is a ScenarioError naming the file and the key; presets and
multi-node scenarios give each node the GPUs it should have."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmhealth.checks import CheckContext, run_checks
from slurmhealth.errors import ScenarioError, UsageError
from slurmhealth.gpu.nvml import NvmlBackend
from slurmhealth.gpu.scenario import Scenario, load_scenario
from slurmhealth.gpu.sim import SimulatedNvml
from slurmhealth.model import GpuStatus

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "scenario.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def error_for(tmp_path: Path, text: str) -> ScenarioError:
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert path in str(info.value), "the message names the file"
    return info.value


def backend(scenario: Scenario, node: str, tmp_path: Path) -> NvmlBackend:
    lib = SimulatedNvml(
        scenario, node, epoch=1_700_000_000.0, kernel_log_path=str(tmp_path / f"{node}.kmsg")
    )
    return NvmlBackend(lib, node=node)


# -- malformed scenarios -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("gpu_count = 8\n", "gpu_count", "unknown key"),
        ("[gpu.1]\ntemprature = 90\n", "gpu.1.temprature", "unknown field"),
        ("[all_gpus]\ntemprature = 90\n", "all_gpus.temprature", "unknown field"),
        ('[gpu.1]\ntemperature = "hot"\n', "gpu.1.temperature", "expected int"),
        ("[gpu.1]\npersistence_mode = 1\n", "gpu.1.persistence_mode", "expected bool"),
        ("[gpu.1]\ntemperature = true\n", "gpu.1.temperature", "expected int"),
        ("[gpu.1.nvlink.3]\nstate = 1\n", "gpu.1.nvlink.3.state", "expected str"),
        ('[gpu.1.nvlink.3]\nstate = "down"\n', "gpu.1.nvlink.3.state", "active"),
        ("[gpu.1.nvlink.3]\nspeed = 25\n", "gpu.1.nvlink.3.speed", "unknown field"),
        ('[gpu.1.nvlink.18]\nstate = "active"\n', "gpu.1.nvlink.18", "nvlink_count"),
        ("[gpu.8]\nlost = true\n", "gpu.8", "0..7"),
        ("gpus = 2\n[gpu.2]\nlost = true\n", "gpu.2", "0..1"),
        ('[gpu.x]\nlost = true\n', "gpu.x", "GPU index"),
        ('[all_gpus]\nfabric_state = "done"\n', "all_gpus.fabric_state", "in_progress"),
        ('[gpu.0]\nclock_event_reasons = ["hw_slowdwn"]\n',
         "gpu.0.clock_event_reasons", "hw_slowdwn"),
        ('[all_gpus]\nnot_supported = ["nvlinks"]\n', "all_gpus.not_supported", "nvlinks"),
        ("gpus = 65\n", "gpus", "0..64"),
        ('preset = "b300"\n', "preset", "b300"),
        ("[[faults]]\nat = 5\ngpu = 1\n", "faults[0]", "'set', 'rate' or 'xid'"),
        ("[[faults]]\nat = 5\ngpu = 9\nxid = 79\n", "faults[0].gpu", "0..7"),
        ("[[faults]]\nat = -1\nxid = 79\n", "faults[0].at", ">= 0"),
        ("[[faults]]\nat = 60\nuntil = 30\nxid = 79\n", "faults[0].until", "after"),
        ("[[faults]]\nxid = 0\n", "faults[0].xid", "positive"),
        ("[[faults]]\nxid = 79\nwhen = 5\n", "faults[0].when", "unknown key"),
        ("[[faults]]\nset = { temprature = 5 }\n", "faults[0].set.temprature", "unknown field"),
        ('[[faults]]\nrate = { "nvlink.4.replay" = "fast" }\n',
         "faults[0].rate.nvlink.4.replay", "expected float"),
        ("[[faults]]\nxid = 79\n[[faults]]\nat = 1\n", "faults[1]", "'set', 'rate' or 'xid'"),
        ("[nodes.n2]\ncolour = 1\n", "nodes.n2.colour", "unknown key"),
        ("nodes = 3\n", "nodes", "[nodes.NAME]"),
        ("expect = 3\n", "expect", "table"),
    ],
)  # fmt: skip
def test_malformed_scenario_names_file_and_key(
    tmp_path: Path, text: str, key: str, words: str
) -> None:
    err = error_for(tmp_path, text)
    assert err.key == key
    assert f": {key}: " in str(err)
    assert words in str(err)


def test_scenario_error_is_a_usage_error(tmp_path: Path) -> None:
    err = error_for(tmp_path, "bogus = 1\n")
    assert isinstance(err, UsageError) and err.exit_code == 2
    assert err.source == str(tmp_path / "scenario.toml")


def test_invalid_toml(tmp_path: Path) -> None:
    err = error_for(tmp_path, "[gpu.1\ntemperature = 90\n")
    assert "invalid TOML" in str(err)
    assert "line 1" in str(err)


def test_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.toml")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    assert path in str(info.value) and "not found" in str(info.value)


def test_error_in_a_node_override_is_found_at_load(tmp_path: Path) -> None:
    """Validation covers every node, not only the one a test happens to run on."""
    err = error_for(tmp_path, '[nodes.n3.gpu.2]\nfabric_state = "broken"\n')
    assert err.key is not None and err.key.endswith("gpu.2.fabric_state")
    err = error_for(tmp_path, "[nodes.n2.gpu.1]\ntemprature = 1\n")
    assert err.key is not None and err.key.endswith("gpu.1.temprature")
    assert "unknown field" in str(err)


def test_error_in_a_node_override_names_the_node_table(tmp_path: Path) -> None:
    err = error_for(tmp_path, "[nodes.n2.gpu.1]\ntemprature = 1\n")
    assert err.key == "nodes.n2.gpu.1.temprature"


# -- well-formed scenarios ---------------------------------------------------------------


def test_defaults_are_a_healthy_h100_node(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, "", "plain.toml"))
    assert s.name == "plain"
    n = s.for_node("any")
    assert len(n.gpus) == 8 and n.faults == ()
    assert {g["nvlink_count"] for g in n.gpus} == {18}
    assert len({g["uuid"] for g in n.gpus}) == 8
    assert len({g["pci_bus_id"] for g in n.gpus}) == 8


def test_uuids_differ_between_nodes(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, ""))
    a = {g["uuid"] for g in s.for_node("n1").gpus}
    b = {g["uuid"] for g in s.for_node("n2").gpus}
    assert not a & b


def test_node_override_applies_only_to_that_node(tmp_path: Path) -> None:
    s = load_scenario(
        write(
            tmp_path,
            'driver_version = "550.90.07"\n'
            "[nodes.n2]\n"
            'driver_version = "535.104.05"\n'
            "[nodes.n2.gpu.1]\n"
            "margin_temperature = 0\n"
            "[[nodes.n2.faults]]\n"
            "gpu = 3\n"
            "xid = 79\n",
        )
    )
    n1, n2 = s.for_node("n1"), s.for_node("n2")
    assert n1.driver_version == "550.90.07" and n2.driver_version == "535.104.05"
    assert n1.gpus[1]["margin_temperature"] == 52
    assert n2.gpus[1]["margin_temperature"] == 0
    assert n2.gpus[0]["margin_temperature"] == 52
    assert n1.faults == ()
    assert [(f.xid, f.gpus) for f in n2.faults] == [(79, (3,))]

    snap1 = backend(s, "n1", tmp_path).snapshot()
    snap2 = backend(s, "n2", tmp_path).snapshot()
    fleet = "550.90.07"
    assert run_checks(CheckContext(snapshot=snap1, expected_driver=fleet)) == []
    got = {
        (f.check, f.gpu) for f in run_checks(CheckContext(snapshot=snap2, expected_driver=fleet))
    }
    assert got == {("driver_version", None), ("thermal_margin", 1)}


def test_fault_addressed_to_one_node(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, '[[faults]]\nnode = "n2"\ngpu = 0\nxid = 48\n'))
    assert s.for_node("n1").faults == ()
    assert [f.xid for f in s.for_node("n2").faults] == [48]


def test_wildcard_node_applies_to_unlisted_nodes(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, "[nodes.n1]\ngpus = 8\n[nodes.'*']\ngpus = 4\n"))
    assert len(s.for_node("n1").gpus) == 8
    assert len(s.for_node("n9").gpus) == 4


def test_node_gpu_override_adds_to_top_level_gpu_table(tmp_path: Path) -> None:
    s = load_scenario(
        write(
            tmp_path,
            "[gpu.1]\npersistence_mode = false\n[nodes.n2.gpu.1]\nmargin_temperature = 0\n",
        )
    )
    g1 = s.for_node("n2").gpus[1]
    assert g1["margin_temperature"] == 0
    assert g1["persistence_mode"] is False


def test_fault_fields_parse(tmp_path: Path) -> None:
    s = load_scenario(
        write(
            tmp_path,
            "[[faults]]\nat = 60\nuntil = 120\ngpu = [1, 2]\n"
            'set = { lost = true, "nvlink.3.state" = "inactive" }\n'
            "rate = { nvlink.4.replay = 2 }\n",
        )
    )
    (f,) = s.for_node("n1").faults
    assert (f.at, f.until, f.gpus) == (60.0, 120.0, (1, 2))
    assert dict(f.set) == {"lost": True, "nvlink.3.state": "inactive"}
    assert dict(f.rate) == {"nvlink.4.replay": 2.0}


# -- presets -----------------------------------------------------------------------------


def test_preset_a100_has_12_links(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, 'preset = "a100-sxm4"\ngpus = 4\n'))
    snap = backend(s, "n1", tmp_path).snapshot()
    assert len(snap.gpus) == 4
    for g in snap.gpus:
        assert g.status is GpuStatus.OK and g.name == "NVIDIA A100-SXM4-80GB"
        assert g.nvlinks is not None and len(g.nvlinks) == 12
        assert all(link.active and link.version == 3 for link in g.nvlinks)
        assert g.remap_pending is False and g.fabric_state == "completed"
        assert (g.pcie_gen, g.pcie_gen_max) == (4, 4)
    per_model = {"NVIDIA A100-SXM4-80GB": 12}
    assert run_checks(CheckContext(snapshot=snap, nvlinks_per_model=per_model)) == []


def test_preset_v100_has_6_links_and_no_row_remap(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, 'preset = "v100-sxm2"\n'))
    snap = backend(s, "n1", tmp_path).snapshot()
    for g in snap.gpus:
        assert g.status is GpuStatus.OK and g.error is None
        assert g.name == "Tesla V100-SXM2-32GB"
        assert g.nvlinks is not None and len(g.nvlinks) == 6
        assert all(link.active for link in g.nvlinks)
        assert (g.remap_pending, g.remap_failure, g.remapped_rows_correctable) == (None,) * 3
        assert g.retired_pages_pending is False  # the pre-Ampere replacement is read instead
        assert g.margin_temperature_c is None and g.fabric_state is None
    per_model = {"Tesla V100-SXM2-32GB": 6}
    assert run_checks(CheckContext(snapshot=snap, nvlinks_per_model=per_model)) == []


def test_v100_retired_pages_pending_fails(tmp_path: Path) -> None:
    s = load_scenario(
        write(tmp_path, 'preset = "v100-sxm2"\n[gpu.6]\nretired_pages_pending = true\n')
    )
    snap = backend(s, "n1", tmp_path).snapshot()
    f = run_checks(CheckContext(snapshot=snap))
    assert [(x.check, x.gpu, x.failing) for x in f] == [("row_remap", 6, True)]


# -- shipped scenarios -------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", sorted(str(p) for p in (REPO / "scenarios").glob("*.toml")), ids=lambda p: Path(p).stem
)
def test_shipped_scenarios_load(path: str) -> None:
    s = load_scenario(path)
    assert s.description
    assert s.name == Path(path).stem
