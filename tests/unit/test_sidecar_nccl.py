"""The sidecar's NCCL watch: the job's NCCL files read through the one reader while the job
runs; sockets between nodes become one event (a warning, or information when the job asked
for them), the user's files are read only when the job's user owns them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurmhealth.config import Config, load_config
from slurmhealth.model import Severity
from slurmhealth.model_records import Job
from slurmhealth.sidecar.nccl import GIVE_UP_S, POLL_S, NcclWatch
from tests.support.skips import root_only

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"
T0 = 1_700_000_000.0


def cfg(tmp_path: Path) -> Config:
    (tmp_path / "config.toml").write_text("")
    glob = str(tmp_path / "nccl-logs" / "{job_id}" / "*.log")
    return load_config(str(tmp_path / "config.toml"), env={},
                       flags={"evidence.nccl_globs": [glob]})  # fmt: skip


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / "nccl-logs" / "7" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def job(nodes: str = "n[1-8]") -> Job:
    return Job("7", "n1", user="", uid=os.getuid(), nodes=nodes)


def test_sockets_between_nodes_are_one_warning_once_the_logs_say_so(tmp_path: Path) -> None:
    watch = NcclWatch(cfg(tmp_path), job(), T0)
    assert watch.observe(T0) == []  # no log yet: asked again later
    write(tmp_path, "rank0.log", (DATA / "issue226_nccl247_8hosts_socket.log").read_text())
    assert watch.observe(T0 + 1) == []  # not before the next poll
    (e,) = watch.observe(T0 + POLL_S)
    assert (e.kind, e.severity) == ("nccl_socket", Severity.WARN)
    assert e.evidence["version"] == "2.4.7" and e.evidence["hosts"] == 8
    assert "did not ask" in e.message
    assert watch.observe(T0 + 10 * POLL_S) == []  # once


def test_the_jobs_own_choice_is_information(tmp_path: Path) -> None:
    lines = ["a:1:2 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.",
             "a:1:2 [0] NCCL INFO Using network Socket"]  # fmt: skip
    write(tmp_path, "rank0.log", "\n".join(lines))
    (e,) = NcclWatch(cfg(tmp_path), job("n[1-2]"), T0).observe(T0)
    assert e.severity == Severity.INFO and e.evidence["user_choice"] == "NCCL_IB_DISABLE=1"


@pytest.mark.parametrize("name", ["issue1189_h20_ib_gdrdma_cumem.log", "one_node"])
def test_infiniband_and_one_node_jobs_raise_nothing(tmp_path: Path, name: str) -> None:
    if name == "one_node":
        write(tmp_path, "r.log", (DATA / "issue1267_nccl2193_one_rank_socket.log").read_text())
        watch = NcclWatch(cfg(tmp_path), job("n1"), T0)
    else:
        write(tmp_path, "r.log", (DATA / name).read_text())
        watch = NcclWatch(cfg(tmp_path), job(), T0)
    assert watch.observe(T0) == [] and watch.done


@root_only("needs root to give the file away")
def test_a_file_the_jobs_user_does_not_own_is_not_read(tmp_path: Path) -> None:
    path = write(tmp_path, "rank0.log", (DATA / "issue226_nccl247_8hosts_socket.log").read_text())
    os.chown(path, 54321, 54321)
    watch = NcclWatch(cfg(tmp_path), job(), T0)
    assert watch.observe(T0) == [] and not watch.done
    assert watch.observe(T0 + GIVE_UP_S) == [] and watch.done  # gives up in the end
