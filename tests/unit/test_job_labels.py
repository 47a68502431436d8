"""``[metrics] job_labels``: what a job adds to the node's endpoint in each mode, through
the exporter's own path (the sidecar's families as its state file holds them, merged with
the node's other jobs and the finished jobs' published stats)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from slurmhealth import final_series
from slurmhealth.export_state import encode, merged
from slurmhealth.metrics import SidecarCollector
from slurmhealth.model_records import ExportState
from slurmhealth.rdma.model import Hca, IbPort, Rate, RdmaSnapshot
from tests.unit.test_metrics import state

PORT = IbPort("mlx5_0", 1, 4, "ACTIVE", 5, "LinkUp", Rate(400.0, 4, "NDR"), "InfiniBand",
              {"symbol_error": 3, "port_xmit_data": 10**9, "port_rcv_data": 10**9})  # fmt: skip
RDMA = RdmaSnapshot(1.7e9, (Hca("mlx5_0", (PORT,)),))
STATS = {"samples": 10, "util_mean": 50.0, "util_max": 90.0, "temp_max_c": 70.0}


def job_state(job_id: str, user: str = "alice") -> ExportState:
    base = state(rdma=RDMA)
    labels = dataclasses.replace(base.labels, job_id=job_id, user=user, node="gpu-a01")
    return dataclasses.replace(base, labels=labels)


def families(st: ExportState, mode: str) -> list[dict[str, object]]:
    """The sidecar's families, as its state file holds them."""
    doc = json.loads(encode(SidecarCollector(lambda: st, job_labels=mode).collect(),
                            st.labels.job_id, 1, 0.0))  # fmt: skip
    fams: list[dict[str, object]] = doc["families"]
    return fams


def published(st: ExportState, mode: str) -> list[dict[str, object]]:
    assert st.snapshot is not None
    gpus = [{**STATS, "gpu": g.index, "uuid": g.uuid} for g in st.snapshot.gpus]
    return final_series.families(st.labels, "gpu-a01", gpus, mode)


def series(fams: list[list[dict[str, object]]]) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {(s.name, tuple(sorted(s.labels.items()))) for m in merged(fams) for s in m.samples}


Series = set[tuple[str, tuple[tuple[str, str], ...]]]


def quiet(job_id: str, user: str = "alice") -> ExportState:
    """A job without task metrics or events: its job-level series are job_info and the
    sample count."""
    return dataclasses.replace(job_state(job_id, user), task=None, event_counts={})


def lives(mode: str, back_to_back: bool) -> tuple[Series, Series]:
    """What the node serves while job 101 runs, and every series job 102 ever adds to it:
    while it runs and once its stats are published (job 103 running then).
    ``back_to_back``: 101's stats are still served as 102 starts (jobs of minutes); else
    they went long before (jobs of a day: Prometheus has forgotten them by 102's end)."""
    one, two = quiet("101"), quiet("102", user="bob")
    before = series([families(one, mode)])
    running = [families(two, mode)] + ([published(one, mode)] if back_to_back else [])
    after = series(running) | series([families(quiet("103"), mode), published(two, mode)])
    return before, after


def new_of_102(mode: str, back_to_back: bool) -> tuple[Series, Series, Series]:
    before, after = lives(mode, back_to_back)
    others = {("job_id", "101"), ("job_id", "103")}  # the jobs before and after it
    new = {(n, labels) for n, labels in after - before if not others & set(labels)}
    return before, after, new


@pytest.mark.parametrize("back_to_back", [True, False], ids=["short-jobs", "long-jobs"])
def test_in_series_mode_a_job_makes_all_its_series_anew(back_to_back: bool) -> None:
    _, _, new = new_of_102("series", back_to_back)
    assert len(new) > 25 * 8 + 4 * 8  # its live series and its published per-GPU stats
    assert sum(1 for n, _ in new if n == "slurmhealth_job_gpu_stat") >= 4 * 8


@pytest.mark.parametrize("back_to_back", [True, False], ids=["short-jobs", "long-jobs"])
def test_in_info_mode_a_job_adds_its_gpus_plus_a_handful(back_to_back: bool) -> None:
    """Its GPUs' info series, job_info, the sample count and, after it, its record of
    stats (one for the node): the GPUs' and the ports' series go on, at any job rate."""
    before, after, new = new_of_102("info", back_to_back)
    assert all(("job_id", "102") in labels for _, labels in new)
    assert sorted(n for n, _ in new) == ["slurmhealth_job_gpu_info"] * 8 + [
        "slurmhealth_job_gpu_stats_info", "slurmhealth_job_info",
        "slurmhealth_sidecar_samples_total"]  # fmt: skip
    kept = {name for name, _ in after & before}
    assert {"slurmhealth_gpu_temperature_celsius", "slurmhealth_rdma_port_up",
            "slurmhealth_gpu_xid_errors_total"} <= kept  # fmt: skip
    assert len(after & before) > 25 * 8


def test_in_info_mode_events_are_the_jobs_own() -> None:
    """A job that raised events: those carry its labels (they are the job's, in both
    modes); of the per-GPU series only its info series are new."""
    before = series([families(job_state("101"), "info")])
    new = series([families(job_state("102", user="bob"), "info")]) - before
    assert all(("job_id", "102") in labels for _, labels in new)
    assert sum(1 for name, _ in new if name == "slurmhealth_job_gpu_info") == 8
    assert "slurmhealth_events_total" in {n for n, _ in new}


def test_info_mode_labels() -> None:
    st = job_state("101")
    by_name = {f["name"]: f["samples"] for f in families(st, "info")}
    gpu = by_name["slurmhealth_gpu_temperature_celsius"][0][1]  # type: ignore[index]
    assert set(gpu) == {"node", "gpu", "uuid"}
    port = by_name["slurmhealth_rdma_port_up"][0][1]  # type: ignore[index]
    assert set(port) == {"node", "hca", "port", "state"}
    info = by_name["slurmhealth_job_gpu_info"]
    assert info[0][1] == {  # type: ignore[index]
        "job_id": "101", "user": "alice", "account": "ml", "partition": "gpu",
        "qos": "normal", "priority": "1000", "node": "gpu-a01", "gpu": "0"}  # fmt: skip
    samples = by_name["slurmhealth_sidecar_samples"][0][1]  # type: ignore[index]
    assert samples["job_id"] == "101" and samples["user"] == "alice"  # job-level: labelled
    with pytest.raises(ValueError, match="job_labels"):
        SidecarCollector(lambda: st, job_labels="none")


def test_published_stats_in_info_mode_are_one_record_per_node() -> None:
    """One series naming the job, its GPUs' stats in its labels; they read back exactly,
    also for a job id that is not a number (an array job's)."""
    st = job_state("101_2")
    assert st.snapshot is not None
    gpus = [{**STATS, "gpu": g.index, "uuid": g.uuid, "power_mean_w": 0.1 + 0.2,
             "throttle_seconds": {"hw_slowdown": 12.5} if g.index == 2 else {}}
            for g in st.snapshot.gpus]  # fmt: skip
    fams = final_series.families(st.labels, "gpu-a01", gpus, "info")
    assert [f["name"] for f in fams] == ["slurmhealth_job_gpu_stats_info"]
    [(_, labels, value)] = fams[0]["samples"]  # type: ignore[misc]
    assert value == 1.0 and labels["job_id"] == "101_2" and labels["node"] == "gpu-a01"
    assert "user" not in labels
    assert sorted(k for k in labels if k.startswith("gpu_")) == [
        f"gpu_{g.index}" for g in st.snapshot.gpus]  # fmt: skip
    back = final_series.decode(labels)
    assert back[2] == {"uuid": st.snapshot.gpus[2].uuid, "samples": 10.0, "util_mean": 50.0,
                       "util_max": 90.0, "temp_max_c": 70.0, "power_mean_w": 0.1 + 0.2,
                       "throttle_seconds": {"hw_slowdown": 12.5}}  # fmt: skip
    assert back[0]["throttle_seconds"] == {}
    assert final_series.decode({**labels, "gpu_0": "GPU-0 1 2"}).keys() == set(back) - {0}
    assert published(st, "series")[0]["samples"]  # labelled: per GPU and stat as before


def test_a_real_sidecar_in_dcgm_and_info_mode(tmp_path: Path) -> None:
    """``slurmhealth sidecar`` with ``mode = "dcgm"`` and ``job_labels = "info"``: it writes
    dcgm-exporter's job-mapping files as in the other mode, and publishes per-GPU series
    without the job's labels beside one info series per GPU; the epilog's publish of the
    job's stats follows the mode too."""
    import subprocess
    import sys
    import time

    from slurmhealth.config import load_config
    from slurmhealth.sidecar.lifecycle import publish_final
    from tests.support.sim_config import sidecar_config, sidecar_env

    config = sidecar_config(
        tmp_path, 'name = "idle"\n[all_gpus]\nutilization_gpu = 10\n',
        dcgm_job_mapping_dir=f'"{tmp_path}/dcgm-job-mapping"',
        extra='[metrics]\nmode = "dcgm"\njob_labels = "info"\n',
    )  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmhealth", "sidecar", "--job", "503", "--gpus", "0-3"],
        env=sidecar_env(config), stderr=subprocess.DEVNULL,
    )  # fmt: skip
    state_file = tmp_path / "run" / "export" / "job-503.json"
    mapping = tmp_path / "dcgm-job-mapping"
    try:
        deadline = time.monotonic() + 90
        while not (state_file.exists() and mapping.is_dir() and len(list(mapping.iterdir())) == 4):
            assert time.monotonic() < deadline, "no state file / job mapping within 90 s"
            time.sleep(0.05)
        assert {p.read_text().strip() for p in mapping.iterdir()} == {"503"}
        by_name = {f["name"]: f["samples"] for f in json.loads(state_file.read_text())["families"]}
    finally:
        proc.terminate()
        assert proc.wait(timeout=90) == 0
    up = by_name["slurmhealth_gpu_up"]
    assert sorted(s[1]["gpu"] for s in up) == ["0", "1", "2", "3"]
    assert all(set(s[1]) == {"node", "gpu", "uuid", "status"} for s in up)
    assert "slurmhealth_gpu_utilization_ratio" not in by_name  # dcgm mode: dcgm-exporter's
    info = by_name["slurmhealth_job_gpu_info"]
    assert {(s[1]["job_id"], s[1]["node"]) for s in info} == {("503", "node1")} and len(info) == 4
    assert by_name["slurmhealth_sidecar_samples"][0][1]["job_id"] == "503"
    cfg = load_config(str(config), env={})
    assert publish_final(cfg, dataclasses.replace(job_state("503").labels, node="node1"),
                         [{"gpu": 0, "uuid": "GPU-0", "samples": 5}])  # fmt: skip
    done = json.loads((tmp_path / "run" / "export" / "done-503.json").read_text())
    [(name, labels, _)] = done["families"][0]["samples"]
    assert name == "slurmhealth_job_gpu_stats_info" and labels["job_id"] == "503"
    assert final_series.decode(labels)[0]["samples"] == 5.0 and "user" not in labels
