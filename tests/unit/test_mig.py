"""MIG: NVML MIG handles in the adapter and simulator, a job's MIG devices mapped to parent
GPU and instance, checks on the parent (shared) and on the instance, a contained Xid naming
GPU-I:NN affecting that instance's job only, and the job's series per instance."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from slurmhealth.checks.mig import instance_results, mig_order, only_instances, resolve
from slurmhealth.config import Config, load_config
from slurmhealth.gpu.nvml import NvmlBackend
from slurmhealth.gpu.scenario import load_scenario
from slurmhealth.gpu.sim import SimulatedNvml
from slurmhealth.history import Batch, History
from slurmhealth.hooks.job import job_from_env
from slurmhealth.hooks.prolog import Adapters, HookResult, run_hook
from slurmhealth.metrics.job_series import SidecarCollector
from slurmhealth.model import NodeSnapshot
from slurmhealth.model_records import ExportState, Job
from tests.conftest import run_cli
from tests.support.db_rows import table_rows
from tests.support.recording_slurm import JOB, RecordingSlurm
from tests.support.sim_config import hook_flags

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
NODE = "n1"
# on an 8x H100 with seven 1g.10gb each, GRES index 16 is GPU 2's third instance (GI 9)
GRES_GI9_ON_GPU2 = 16


def snap(scenario: str, tmp_path: Path) -> NodeSnapshot:
    lib = SimulatedNvml(
        load_scenario(str(SCENARIOS / f"{scenario}.toml")), NODE,
        kernel_log_path=str(tmp_path / "kmsg"),
    )  # fmt: skip
    backend = NvmlBackend(lib, node=NODE)
    try:
        return backend.snapshot()
    finally:
        backend.close()


def test_adapter_reads_seven_1g_instances_per_h100(tmp_path: Path) -> None:
    s = snap("mig-h100", tmp_path)
    assert len(s.gpus) == 8 and all(g.mig_mode for g in s.gpus)
    g2 = s.gpu(2)
    assert g2 is not None and g2.mig_devices is not None
    assert [m.gpu_instance_id for m in g2.mig_devices] == [7, 8, 9, 10, 11, 12, 13]
    assert all(m.uuid and m.uuid.startswith("MIG-") for m in g2.mig_devices)
    assert len({m.uuid for g in s.gpus for m in g.mig_devices or ()}) == 56
    assert {m.memory_total_bytes for m in g2.mig_devices} == {9856 << 20}
    assert all("1g.10gb" in (m.name or "") for m in g2.mig_devices)


def test_adapter_reads_a_mixed_a100_layout(tmp_path: Path) -> None:
    g = snap("mig-a100-mixed", tmp_path).gpu(0)
    assert g is not None and g.mig_devices is not None
    assert [(m.gpu_instance_id, (m.name or "").rsplit(" ", 1)[-1]) for m in g.mig_devices] == [
        (2, "3g.40gb"), (3, "2g.20gb"), (9, "1g.10gb"), (10, "1g.10gb"),
    ]  # fmt: skip


def test_a_gpu_without_mig_reads_as_not_in_mig_mode(tmp_path: Path) -> None:
    s = snap("healthy", tmp_path)
    assert {(g.mig_mode, g.mig_devices) for g in s.gpus} == {(False, None)}


def test_gres_indices_and_uuids_map_to_parent_and_instance(tmp_path: Path) -> None:
    s = snap("mig-h100", tmp_path)
    order = mig_order(s)
    assert len(order) == 56 and order[GRES_GI9_ON_GPU2][0].index == 2
    parents, migs = resolve(s, [GRES_GI9_ON_GPU2], ())
    mig = order[GRES_GI9_ON_GPU2][1]
    assert mig is not None and (parents, migs) == ((2,), (mig.uuid,))
    assert mig.gpu_instance_id == 9
    # by UUID, as CUDA_VISIBLE_DEVICES names them; an index past the end names nothing
    other = order[40][1]
    assert other is not None and other.uuid
    assert resolve(s, [99], [other.uuid]) == ((order[40][0].index,), (other.uuid,))


def test_job_env_keeps_mig_uuids_and_drops_hostile_tokens() -> None:
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_GPUS": "MIG-4b9f0e5e-1f7c-5a7a-9a59-0c1b6a3c2d11,3",
        "CUDA_VISIBLE_DEVICES": "MIG-../../etc/passwd,MIG-" + "a" * 200 + ",MIG-ABCDEF",
    }
    job = job_from_env(env, NODE)
    assert job.gpus == (3,)
    assert job.mig == ("MIG-4b9f0e5e-1f7c-5a7a-9a59-0c1b6a3c2d11", "MIG-abcdef")


def test_nvlink_is_not_judged_in_mig_mode(tmp_path: Path) -> None:
    s = snap("mig-h100", tmp_path)
    assert all(not link.active for g in s.gpus for link in g.nvlinks or ())  # links idle
    done = _check_cli("mig-h100", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["findings"] == []


def _check_cli(scenario: str, tmp_path: Path) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURMHEALTH_")}
    cfg = tmp_path / "config.toml"
    cfg.write_text("")
    env |= {
        "SLURMHEALTH_CONFIG": str(cfg),
        "SLURMHEALTH_GPU_BACKEND": "sim",
        "SLURMHEALTH_SIM_SCENARIO": str(SCENARIOS / "healthy.toml"),
        "SLURMHEALTH_SIM_KERNEL_LOG": str(tmp_path / "kmsg"),
        "SLURMHEALTH_DB": str(tmp_path / "history.db"),
        "SLURMHEALTH_NODE_NAME": NODE,
    }
    if not (tmp_path / "kmsg").exists():  # a node checked before: new lines are acted on
        (tmp_path / "kmsg").touch()
        assert run_cli("check", env=env).returncode == 0
    return run_cli(
        "check",
        "--json",
        env={**env, "SLURMHEALTH_SIM_SCENARIO": str(SCENARIOS / f"{scenario}.toml")},
    )


def test_check_json_gives_each_instance_its_result(tmp_path: Path) -> None:
    done = _check_cli("mig-h100", tmp_path)
    out = json.loads(done.stdout)
    for g in out["gpus"]:
        assert g["mig_mode"] is True and len(g["mig"]) == 7
        assert {(m["status"], m["checks"] == []) for m in g["mig"]} == {("ok", True)}
        assert all(m["mig_uuid"].startswith("MIG-") for m in g["mig"])


def test_contained_xid_on_one_instance_marks_that_instance_only(tmp_path: Path) -> None:
    done = _check_cli("mig-xid-contained", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr  # no drain, no failure
    out = json.loads(done.stdout)
    (f,) = out["findings"]
    assert (f["check"], f["severity"], f["action"], f["gpu"]) == ("xid", "warn", "record", 2)
    assert f["evidence"]["gpu_instance"] == 9 and "GPU-I:09" in f["message"]
    statuses = {(g["index"], m["gpu_instance"]): m["status"] for g in out["gpus"] for m in g["mig"]}
    assert statuses.pop((2, 9)) == "warn"
    assert set(statuses.values()) == {"ok"}  # every other instance, of every GPU


def test_a_shared_hardware_finding_holds_for_every_instance(tmp_path: Path) -> None:
    s = snap("mig-h100", tmp_path)
    from slurmhealth.checks import CheckContext, run_checks

    g0 = s.gpu(0)
    assert g0 is not None
    import dataclasses

    bad = dataclasses.replace(s, gpus=(dataclasses.replace(g0, ecc_volatile_uncorrectable=2),))
    findings = run_checks(CheckContext(snapshot=bad))
    assert any(f.check == "ecc_uncorrectable" and f.failing for f in findings)
    rows = instance_results(bad, findings)[0]
    assert {r["status"] for r in rows} == {"fail"}  # ECC is the parent's: every slice


# -- the prolog of a job on one MIG slice ---------------------------------------------------
def _prolog(tmp_path: Path, scenario: str, gres: str, **flags: Any) -> tuple[HookResult, Path]:
    db = tmp_path / "history.db"
    with History(db) as h:
        assert h.write(Batch())
    cfg_file = tmp_path / "config.toml"
    cfg_file.write_text("")
    cfg: Config = load_config(
        str(cfg_file), env={},
        flags={**hook_flags(tmp_path, SCENARIOS / f"{scenario}.toml"), "gpu.mig_gres": True,
               **flags},
    )  # fmt: skip
    env = {"SLURM_JOB_ID": JOB, "SLURMD_NODENAME": NODE, "SLURM_JOB_USER": "alice",
           "SLURM_JOB_UID": "1000", "SLURM_JOB_GPUS": gres}  # fmt: skip

    def gpu(_timeout: float) -> NvmlBackend:
        lib = SimulatedNvml(load_scenario(cfg.gpu.sim_scenario), NODE,
                            kernel_log_path=str(tmp_path / "kmsg"))  # fmt: skip
        return NvmlBackend(lib, node=NODE)

    (tmp_path / "kmsg").touch()
    history = History(db, spool_path=tmp_path / "spool.jsonl")
    try:
        slurm = RecordingSlurm([])
        result = run_hook(
            cfg, job_from_env(env, NODE), env, "prolog", Adapters(slurm, gpu, history)
        )
        assert slurm.drains == []
        return result, db
    finally:
        history.close()


_rows = table_rows


def test_prolog_on_one_slice_checks_its_parent_and_names_the_instance(tmp_path: Path) -> None:
    result, db = _prolog(tmp_path, "mig-h100", str(GRES_GI9_ON_GPU2))
    assert (result.exit_code, result.status) == (0, "ok")
    assert result.job.gpus == (2,) and len(result.job.mig) == 1  # what the sidecar is given
    assert _rows(db, "findings") == []


STALE = """
preset = "h100-sxm-mig"
[gpu.2]
mig_devices = [
  { profile = "1g.10gb", gi = 7, ci = 0, memory_mib = 9856, used_mib = 0 },
  { profile = "1g.10gb", gi = 8, ci = 0, memory_mib = 9856, used_mib = 0 },
  {profile="1g.10gb", gi=9, ci=0, memory_mib=9856, used_mib=2048, processes=[{pid=999}]},
  { profile = "1g.10gb", gi = 10, ci = 0, memory_mib = 9856, used_mib = 0 },
]
"""


def test_stale_process_on_the_jobs_slice_warns_never_drains(tmp_path: Path) -> None:
    scenario = tmp_path / "stale.toml"
    scenario.write_text(STALE)
    flags = {"gpu.sim_scenario": str(scenario)}
    # GPU 0 and 1 have seven instances each: GRES 16 is GPU 2's third (GI 9)
    result, db = _prolog(tmp_path, "mig-h100", str(GRES_GI9_ON_GPU2), **flags)
    assert (result.exit_code, result.status) == (0, "warn")
    (f,) = _rows(db, "findings")
    assert (f["check_name"], f["severity"], f["gpu"]) == ("mig_instance", "warn", 2)
    assert json.loads(f["evidence"])["gpu_instance"] == 9
    # a job on the next slice of the same GPU is not blamed for it
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    other, _ = _prolog(other_dir, "mig-h100", str(GRES_GI9_ON_GPU2 + 1), **flags)
    assert (other.exit_code, other.status) == (0, "ok")


def test_job_series_cover_its_own_instances_only(tmp_path: Path) -> None:
    s = snap("mig-h100", tmp_path)
    _, migs = resolve(s, [GRES_GI9_ON_GPU2], ())
    parents = tuple(g for g in s.gpus if g.index == 2)
    import dataclasses

    mine = only_instances(dataclasses.replace(s, gpus=parents), migs)
    job = Job(job_id="42", node=NODE, user="alice", gpus=(2,), mig=migs)
    reg = CollectorRegistry()
    reg.register(SidecarCollector(lambda: ExportState(labels=job, snapshot=mine)))
    samples = [
        x for fam in reg.collect() for x in fam.samples if x.name.startswith("slurmhealth_mig_")
    ]
    assert {x.name for x in samples} == {
        "slurmhealth_mig_memory_used_bytes", "slurmhealth_mig_memory_total_bytes",
        "slurmhealth_mig_processes",
    }  # fmt: skip
    assert {(x.labels["job_id"], x.labels["gpu"], x.labels["gpu_instance"], x.labels["mig_uuid"])
            for x in samples} == {("42", "2", "9", migs[0])}  # fmt: skip


@pytest.mark.parametrize("scenario", ["mig-h100", "mig-a100-mixed", "mig-xid-contained"])
def test_mig_scenarios_exit_zero(scenario: str, tmp_path: Path) -> None:
    assert _check_cli(scenario, tmp_path).returncode == 0


def test_other_jobs_on_the_same_gpu_never_make_a_slice_prolog_fail(tmp_path: Path) -> None:
    """In MIG mode the parent GPU shows every instance's processes and memory: the jobs on
    the other slices are no leftovers (stale_job judges GPUs outside MIG mode only)."""
    scenario = tmp_path / "busy.toml"
    scenario.write_text(
        'preset = "h100-sxm-mig"\n[gpu.2]\nmemory_used_mib = 20000\n'
        "processes = [{ pid = 31, used_mib = 9000 }, { pid = 32, used_mib = 9000 }]\n"
    )
    result, db = _prolog(tmp_path, "mig-h100", str(GRES_GI9_ON_GPU2),
                         **{"gpu.sim_scenario": str(scenario)})  # fmt: skip
    assert (result.exit_code, result.status) == (0, "ok")
    assert _rows(db, "findings") == []
