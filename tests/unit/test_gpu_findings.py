"""What `slurmhealth check` says of the GPUs themselves, exactly as an operator reads it:
count, driver, persistence mode and a previous job's leftovers, with their evidence."""

from __future__ import annotations

from dataclasses import replace

from slurmhealth.checks import run_checks
from slurmhealth.model import Action, GpuProcess, Severity
from tests.unit.test_checks import ctx, healthy_gpu, node, of, only

MIB = 2**20


def test_fewer_gpus_than_expected_and_an_allocated_one_missing() -> None:
    found = of(run_checks(ctx(node(count=6), expected_count=8, gpus=(1, 6, 7))), "gpu_count")
    assert [(f.message, f.evidence) for f in found] == [
        ("6 GPUs visible, 8 expected", {"visible": 6, "expected": 8}),
        ("allocated GPU(s) 6,7 not visible (6 GPUs)", {"visible": 6, "missing": [6, 7]}),
    ]
    assert all(f.gpu is None and f.severity is Severity.FAIL for f in found)


def test_another_driver_than_the_fleets() -> None:
    f = only(run_checks(ctx(node(driver_version="535.1"), expected_driver="550.9")),
             "driver_version")  # fmt: skip
    assert (f.message, f.evidence) == (
        "driver 535.1, expected 550.9",
        {"driver": "535.1", "expected": "550.9"},
    )


def test_persistence_mode_off_on_each_gpu() -> None:
    off = [replace(healthy_gpu(i), persistence_mode=False) for i in (2, 5)]
    found = of(run_checks(ctx(node(*off))), "persistence_mode")
    assert [(f.gpu, f.message, f.severity) for f in found] == [
        (2, "persistence mode is off", Severity.WARN),
        (5, "persistence mode is off", Severity.WARN),
    ]


def test_leftovers_of_a_previous_job_on_each_gpu() -> None:
    one = replace(healthy_gpu(1), processes=(GpuProcess(42, MIB),), memory_used_bytes=3 * MIB)
    mig = replace(healthy_gpu(2), mig_mode=True, processes=(GpuProcess(9, MIB),))
    many = replace(healthy_gpu(4), processes=tuple(GpuProcess(p, None) for p in (7, 8, 9)),
                   memory_used_bytes=None)  # fmt: skip
    memory = replace(healthy_gpu(6), memory_used_bytes=2048 * MIB)
    found = of(run_checks(ctx(node(one, mig, many, memory), phase="prolog")), "stale_job")
    assert [(f.gpu, f.message) for f in found] == [
        (1, "1 process(es) on the GPU before the job: pid 42"),
        (4, "3 process(es) on the GPU before the job: pid 7 and 2 more"),
        (6, "2048 MiB used with no process (limit 1024 MiB)"),
    ]
    assert [f.evidence for f in found] == [
        {"pids": [42], "memory_used_mib": 3.0},
        {"pids": [7, 8, 9], "memory_used_mib": None},
        {"memory_used_mib": 2048.0},
    ]
    assert all(f.severity is Severity.FAIL for f in found)


def test_row_remap_failure_pending_and_retired_pages() -> None:
    rows = {"remapped_rows_correctable": 3, "remapped_rows_uncorrectable": 1}
    failed = replace(healthy_gpu(1), remap_failure=True, remap_pending=True, **rows)
    pending = replace(healthy_gpu(3), remap_pending=True, **rows)
    retired = replace(healthy_gpu(5), retired_pages_pending=True)
    found = of(run_checks(ctx(node(failed, pending, retired))), "row_remap")
    assert [(f.gpu, f.message, f.severity) for f in found] == [
        (1, "row remapping failed: the GPU has no spare rows left", Severity.FAIL),
        (3, "row remap pending", Severity.FAIL),
        (5, "retired pages pending", Severity.FAIL),
    ]
    assert (
        found[0].evidence
        == found[1].evidence
        == {"remapped_rows": {"correctable": 3, "uncorrectable": 1}}
    )
    assert found[0].hint == "row remap failure: the GPU needs replacement (RMA); keep it drained"
    assert found[0].action is Action.DRAIN and found[1].action is Action.RESET


def test_a_downgraded_pcie_link() -> None:
    narrow = replace(healthy_gpu(1), pcie_width=8, pcie_width_max=16)
    slow = replace(healthy_gpu(2), pcie_gen=3, pcie_gen_max=5, utilization_gpu_pct=50)
    idle = replace(healthy_gpu(3), pcie_gen=1, pcie_gen_max=5, utilization_gpu_pct=None)
    at_max = replace(healthy_gpu(4), pcie_gen=5, pcie_gen_max=5, utilization_gpu_pct=99)
    found = of(run_checks(ctx(node(narrow, slow, idle, at_max))), "pcie_link")
    assert [(f.gpu, f.message, f.evidence) for f in found] == [
        (1, "PCIe width x8, max x16", {"width": 8, "width_max": 16}),
        (2, "PCIe gen 3 under load, max gen 5",
         {"gen": 3, "gen_max": 5, "utilization_pct": 50}),
    ]  # fmt: skip
    assert all(f.severity is Severity.WARN for f in found)


def test_replay_and_correctable_ecc_warnings_name_what_grew() -> None:
    from tests.unit.test_counter_rates import Node, ecc, pcie

    gpu = Node()
    gpu.run(0, pcie(0))
    f = only(gpu.run(600, pcie(100)), "pcie_replay")
    assert f.message == "100 PCIe replays in 600 s (10/min)"
    gpu = Node()
    gpu.run(0, ecc(0))
    f = only(gpu.run(300, ecc(3000)), "ecc_correctable")
    assert f.message == "3000 correctable ECC errors in 300 s (600/min)"
