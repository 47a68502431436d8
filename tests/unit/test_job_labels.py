"""``[metrics] job_labels``: what a job adds to the node's endpoint in each mode, through
the exporter's own path (the sidecar's families as its state file holds them, merged with
the node's other jobs and the finished jobs' published stats)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from slurmhealth.metrics import final_series
from slurmhealth.metrics.export_state import Limits, encode, merged, read_states, write_final
from slurmhealth.metrics.job_series import SidecarCollector
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


def endpoints(mode: str) -> tuple[set[Any], set[Any]]:
    """The node's jobs' series while job 101 runs (job 100's stats published), then while
    job 102 runs (101's published)."""
    zero, one, two = job_state("100"), job_state("101"), job_state("102", user="bob")
    before = series([families(one, mode), published(zero, mode)])
    return before, series([families(two, mode), published(one, mode)])


def test_in_series_mode_a_job_makes_all_its_series_anew() -> None:
    before, after = endpoints("series")
    assert after & before == set()
    assert len(after) > 30 * 8


def test_in_info_mode_only_the_jobs_own_series_are_new() -> None:
    """Its GPUs' info series and its job-level ones (job_info, samples, the task metrics it
    reports, its events): the GPUs', the ports' and the published stats' series go on."""
    before, after = endpoints("info")
    new = after - before
    assert all(("job_id", "102") in labels for _, labels in new)
    assert sum(1 for name, _ in new if name == "slurmhealth_job_gpu_info") == 8
    kept = {name for name, _ in after & before}
    assert {"slurmhealth_gpu_temperature_celsius", "slurmhealth_rdma_port_up",
            "slurmhealth_job_gpu_stat", "slurmhealth_gpu_xid_errors_total"} <= kept  # fmt: skip
    assert len(after & before) > 25 * 8


def test_in_info_mode_a_job_adds_its_gpus_plus_its_job_level_series() -> None:
    """Without task metrics or events: its GPUs' info series, job_info, the sample count."""
    one, two = job_state("101"), job_state("102", user="bob")
    quiet = {"task": None, "event_counts": {}}
    one, two = (dataclasses.replace(s, **quiet) for s in (one, two))  # type: ignore[arg-type]
    assert one.snapshot is not None
    before = series([families(one, "info"), published(job_state("100"), "info")])
    after = series([families(two, "info"), published(one, "info")])
    new = after - before
    assert len(new) == len(one.snapshot.gpus) + 2
    assert {n for n, _ in new} == {"slurmhealth_job_gpu_info", "slurmhealth_job_info",
                                   "slurmhealth_sidecar_samples_total"}  # fmt: skip
    names = {n for n, _ in after}
    assert "slurmhealth_rdma_port_up" in names and "slurmhealth_gpu_temperature_celsius" in names


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


def test_published_stats_in_info_mode_name_their_job_by_a_stat() -> None:
    st = job_state("101")
    fams = published(st, "info")
    stats = fams[0]["samples"]
    assert {tuple(sorted(labels)) for _, labels, _ in stats} == {  # type: ignore[attr-defined]
        ("gpu", "node", "stat", "uuid")}  # fmt: skip
    ids = [v for _, labels, v in stats if labels["stat"] == "job_id"]  # type: ignore[attr-defined]
    assert ids == [101.0] * 8
    odd = dataclasses.replace(st, labels=dataclasses.replace(st.labels, job_id="101_2"))
    assert [f["samples"] for f in published(odd, "info")] == [[], []]  # whose? nothing
    assert published(odd, "series")[0]["samples"]  # labelled: published as before


def test_the_newest_finished_job_wins_a_gpu(tmp_path: Path) -> None:
    """Two finished jobs' stats of one GPU (info mode: the same series): the exporter
    serves the newer, once; the older stays served where it is alone."""
    run = str(tmp_path)
    older, newer = job_state("101"), job_state("102")
    for st, ts in ((newer, 2000.0), (older, 1000.0)):  # written in the other order
        data = encode_final(published(st, "info"), st.labels.job_id, ts)
        write_final(run, st.labels.job_id, data, 3600.0, ts)
        os.utime(os.path.join(run, "export", f"done-{st.labels.job_id}.json"), (ts, ts))
    states = read_states(run, now=2100.0, limits=Limits(linger_s=3600.0))
    assert list(states.finished) == ["102", "101"]
    served = [s for m in merged(states.finished.values()) for s in m.samples]
    ids = {s.value for s in served if s.labels.get("stat") == "job_id"}
    assert ids == {102.0}
    assert len(served) == len({(s.name, tuple(sorted(s.labels.items()))) for s in served})


def encode_final(fams: list[dict[str, object]], job_id: str, ts: float) -> bytes:
    from slurmhealth.metrics.export_state import encode_families

    return encode_families(fams, job_id, os.getpid(), ts)  # type: ignore[arg-type]


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
    stats = done["families"][0]["samples"]
    assert {s[1]["stat"]: s[2] for s in stats} == {"job_id": 503.0, "samples": 5.0}
    assert all("user" not in s[1] for s in stats)
