"""What `slurmhealth check` says of the GPUs themselves, exactly as an operator reads it:
count, driver, persistence mode and a previous job's leftovers, with their evidence."""

from __future__ import annotations

from dataclasses import replace

from slurmhealth.checks import run_checks
from slurmhealth.model import GpuProcess, Severity
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
