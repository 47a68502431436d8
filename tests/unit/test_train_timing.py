"""The step timer under the PyTorch hooks and callbacks (standard library only)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from slurmhealth import job
from slurmhealth.train.timing import StepTimer, batch_size_of, tokens_of, union_seconds


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def recording_timer(**kw: Any) -> tuple[StepTimer, list[dict[str, Any]], Clock]:
    calls: list[dict[str, Any]] = []
    clock = Clock()
    return StepTimer(report=lambda **k: calls.append(k), clock=clock, **kw), calls, clock


def test_union_counts_overlaps_once() -> None:
    assert union_seconds([]) == 0
    assert union_seconds([(0, 1), (0.5, 2), (3, 4)]) == pytest.approx(3.0)
    assert union_seconds([(0, 4), (1, 2)]) == pytest.approx(4.0)
    assert union_seconds([(2, 1)]) == 0  # a backwards interval is dropped


def test_a_step_reports_measured_comm_and_data_wait_then_resets() -> None:
    timer, calls, _ = recording_timer(flops_per_token=6.0)
    timer.add_comm(1.0, 1.5)
    timer.add_comm(1.2, 1.7)  # the same all-reduce seen by the hook and the collective patch
    timer.add_data_wait(0.25)
    timer.step(samples=8, tokens=100)
    timer.step(samples=8)
    assert calls[0] == {
        "samples": 8,
        "tokens": 100,
        "flops": 600.0,
        "comm_seconds": pytest.approx(0.7),
        "data_wait_seconds": 0.25,
        "step": None,
    }
    assert calls[1]["comm_seconds"] == 0 and calls[1]["data_wait_seconds"] == 0
    assert calls[1]["flops"] is None


def test_data_wrapper_times_each_next() -> None:
    timer, calls, clock = recording_timer()

    def slow_loader() -> Any:
        for i in range(3):
            clock.now += 0.5 * (i + 1)  # the loader takes 0.5, 1.0, 1.5 s
            yield i

    got = []
    for item in timer.data(slow_loader()):
        got.append(item)
        clock.now += 10  # compute is not data wait
        timer.step()
    assert got == [0, 1, 2]
    assert [c["data_wait_seconds"] for c in calls] == [0.5, 1.0, 1.5]


def test_gpu_intervals_count_in_the_step_they_complete() -> None:
    timer, calls, _ = recording_timer()
    ready = threading.Event()
    timer.add_pending(lambda: (5.0, 5.4) if ready.is_set() else None)
    timer.step()
    ready.set()
    timer.step()
    assert [c["comm_seconds"] for c in calls] == [0, pytest.approx(0.4)]


def test_an_internal_error_turns_timing_off_not_training(
    capsys: pytest.CaptureFixture[str],
) -> None:
    timer, calls, _ = recording_timer()

    def broken() -> tuple[float, float]:
        raise RuntimeError("event destroyed")

    timer.add_pending(broken)
    timer.step(samples=4)
    timer.step(samples=4)
    assert [(c["samples"], c["comm_seconds"]) for c in calls] == [(4, None), (4, None)]
    assert capsys.readouterr().err.count("communication timing off") == 1


def test_default_report_writes_the_rank_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURMHEALTH_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    job.close()
    try:
        timer = StepTimer()
        timer.add_comm(0.0, 0.2)
        timer.step(samples=2, step=7)
    finally:
        job.close()
    rec = json.loads((tmp_path / "steps-3.jsonl").read_text())
    assert (rec["step"], rec["samples"], rec["comm_seconds"]) == (7, 2, pytest.approx(0.2))


class Shaped:
    def __init__(self, *shape: int) -> None:
        self.shape = shape

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@pytest.mark.parametrize(
    ("batch", "size"),
    [
        (Shaped(16, 128), 16),
        ((Shaped(8, 3), Shaped(8)), 8),
        ([1, 2, 3], 3),
        ({"input_ids": Shaped(4, 512), "labels": Shaped(4, 512)}, 4),
        ({"x": Shaped(5, 2)}, 5),
        (Shaped(), None),
        (object(), None),
        ({}, None),
    ],
)
def test_batch_size_of_common_batch_shapes(batch: Any, size: int | None) -> None:
    assert batch_size_of(batch) == size


def test_tokens_of_a_tokenized_batch() -> None:
    assert tokens_of({"input_ids": Shaped(4, 512)}) == 2048
    assert tokens_of(Shaped(4, 512)) is None


def test_importing_the_package_imports_no_framework() -> None:
    code = (
        "import sys, slurmhealth.train, slurmhealth.train.timing, slurmhealth.job;"
        "print(sorted(m for m in ('torch', 'transformers', 'lightning', 'click', 'rich')"
        " if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
