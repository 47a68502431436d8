"""A sweep job's output through the baseline parsers; the batch commands' formats."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmhealth.slurm import BatchJob, SlurmError
from slurmhealth.slurm.batch import parse_job_states, parse_sbatch, parse_topology, sbatch_argv
from slurmhealth.sweep.ingest import baseline_rows, results_of, sections
from slurmhealth.sweep.model import Planned

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "baseline"
PAIR = Planned(("n1", "n3"), 2, 1, ("nccl", "ib"))


def _section(test: str, body: str, rc: int | None = 0, hca: str = "") -> str:
    h = f" hca={hca}" if hca else ""
    end = "" if rc is None else f"### slurmhealth-sweep end test={test}{h} rc={rc}\n"
    return f"### slurmhealth-sweep test={test}{h} nodes=n1 n3\n{body}\n{end}"


def test_the_headline_is_the_largest_size_busbw_and_ib_the_slowest_hca() -> None:
    nccl = (FIX / "nccl_all_reduce_2x8.txt").read_text()
    ib = (FIX / "perftest_write_gbits.txt").read_text()
    text = "srun: job step started\n" + _section("nccl", nccl) + _section("ib", ib, hca="mlx5_0")
    text += _section("ib", ib.replace("392.11", "201.50"), hca="mlx5_1")
    got = {r.test: r for r in results_of(PAIR, "77", "COMPLETED", text, "", 5.0)}
    assert got["nccl"].value == 371.87
    assert got["nccl"].metric == "all_reduce_perf.busbw@8589934592"
    assert got["ib"].value == 201.5
    assert got["ib"].hcas == {"mlx5_0": 392.11, "mlx5_1": 201.5}
    rows = baseline_rows(list(got.values()), "S1", "/out ")
    assert {(r["node"], r["kind"], r["label"]) for r in rows} == {
        ("n1,n3", "nccl", "sweep:S1"), ("n1,n3", "perftest", "sweep:S1")}  # fmt: skip
    assert sorted(r["source"] for r in rows if r["kind"] == "perftest") == [
        "/out job 77 mlx5_0", "/out job 77 mlx5_1"]  # fmt: skip


def test_a_test_that_measured_nothing_says_why() -> None:
    text = _section("nccl", "NCCL failure common.cu:1067 'unhandled system error'", rc=1)
    (nccl, ib) = results_of(PAIR, "78", "FAILED", text, "", 0.0)
    assert nccl.value is None and "unhandled system error" in nccl.error
    assert ib.value is None and "job 78 FAILED: no ib output" in ib.error
    (cut,) = results_of(Planned(("n1",), 0), "79", "TIMEOUT", "", "job 79 cancelled", 0.0)
    assert cut.value is None and cut.error == "job 79 cancelled"


def test_data_errors_in_the_table_fail_the_test() -> None:
    wrong = (FIX / "nccl_all_reduce_wrong.txt").read_text()
    (r,) = results_of(Planned(("n1",), 0), "80", "COMPLETED", _section("nccl", wrong), "", 0.0)
    assert r.value is None and "reported errors" in r.error


def test_a_section_without_its_end_marker_is_kept_and_one_hca_missing_fails() -> None:
    found = sections(_section("nccl", "x\ny", rc=None))
    assert found == {("nccl", ""): ("x\ny", None)}
    ib = (FIX / "perftest_write_gbits.txt").read_text()
    text = _section("ib", ib, hca="mlx5_0") + _section("ib", "Couldn't connect", 1, "mlx5_1")
    (r,) = results_of(Planned(("a", "b"), 1, 1, ("ib",)), "81", "FAILED", text, "", 0.0)
    assert r.value is None and "ib mlx5_1" in r.error


def test_sbatch_argv_pins_the_nodes_and_bounds_the_time() -> None:
    job = BatchJob("/x/sweep.sbatch", ("n1", "n3"), "sw", 7, "/o/r1-%j.out", "gpu", 8, 8)
    argv = sbatch_argv(job)
    assert argv[:2] == ["sbatch", "--parsable"] and argv[-1] == "/x/sweep.sbatch"
    for flag in (
        "--nodes=2",
        "--nodelist=n1,n3",
        "--time=7",
        "--output=/o/r1-%j.out",
        "--partition=gpu",
        "--gres=gpu:8",
        "--ntasks-per-node=8",
        "--exclusive",
    ):
        assert flag in argv  # fmt: skip


def test_sbatch_squeue_and_topology_answers() -> None:
    assert parse_sbatch("1234\n") == "1234"
    assert parse_sbatch("1234;shtest\n") == "1234"
    with pytest.raises(SlurmError):
        parse_sbatch("sbatch: error: Batch job submission failed")
    assert parse_job_states("12|RUNNING\n13|COMPLETED\njunk\n14|weird state\n") == {
        "12": "RUNNING", "13": "COMPLETED"}  # fmt: skip
    topo = ("SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=gpu[01-02]\n"
            "SwitchName=leaf2 Level=0 LinkSpeed=1 Nodes=gpu03\n"
            "SwitchName=spine Level=1 Nodes=gpu[01-03] Switches=leaf[1-2]\n")  # fmt: skip
    assert parse_topology(topo) == {"gpu01": "leaf1", "gpu02": "leaf1", "gpu03": "leaf2"}
    assert parse_topology("") == {}
