"""The training-loop client (slurmhealth.job) and the sidecar's reader of what it writes."""

from __future__ import annotations

import ast
import io
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmhealth import job
from slurmhealth.sidecar import task
from slurmhealth.sidecar.task import PEAK_BF16_FLOPS, TaskReader, parse_line, peak_bf16_flops

T0 = 1_700_000_000.0


@pytest.fixture(autouse=True)
def _fresh_client(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("SLURMHEALTH_JOB_DIR", "SLURM_JOB_ID", "SLURM_PROCID", "RANK"):
        monkeypatch.delenv(var, raising=False)
    job.close()
    yield
    job.close()


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_step_writes_one_line_per_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMHEALTH_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("SLURM_PROCID", "3")
    before = time.time()
    job.step(samples=32, tokens=65536, flops=1.5e15, comm_seconds=0.01, data_wait_seconds=0.002)
    time.sleep(0.02)
    job.step(samples=32)
    time.sleep(0.02)
    job.step()  # no arguments: still a step with its time
    job.flush()
    rows = lines(tmp_path / "steps-3.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert {r["rank"] for r in rows} == {3}
    assert rows[0]["step_seconds"] is None
    for r in rows[1:]:
        assert isinstance(r["step_seconds"], float) and 0.015 <= r["step_seconds"] < 2.0
    first = rows[0]
    assert isinstance(first["ts"], float) and before <= first["ts"] <= time.time()
    assert (first["samples"], first["tokens"], first["flops"]) == (32, 65536, 1.5e15)
    assert (first["comm_seconds"], first["data_wait_seconds"]) == (0.01, 0.002)
    assert rows[2]["samples"] is None
    assert set(first) == {
        "ts",
        "rank",
        "step",
        "step_seconds",
        "samples",
        "tokens",
        "flops",
        "comm_seconds",
        "data_wait_seconds",
    }


def test_rank_and_default_dir_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    rec = job.Recorder.from_env({"SLURM_JOB_ID": "4242", "SLURM_PROCID": "1", "RANK": "9"})
    assert rec.path == "/run/slurmhealth/jobs/4242/steps-9.jsonl"  # RANK: torchrun's global rank
    assert job.Recorder.from_env({"SLURM_JOB_ID": "7", "SLURM_PROCID": "2"}).rank == 2
    assert job.Recorder.from_env({}).path is None


def test_odd_values_never_break_a_line(tmp_path: Path) -> None:
    rec = job.Recorder(str(tmp_path), 0)

    class Tensorish:
        def __float__(self) -> float:
            return 12.0

    rec.step(samples=Tensorish(), tokens=float("nan"), flops="lots", comm_seconds=True)
    rec.close()
    (row,) = lines(tmp_path / "steps-0.jsonl")
    assert (row["samples"], row["tokens"], row["flops"], row["comm_seconds"]) == (
        12.0,
        None,
        None,
        None,
    )


@pytest.mark.parametrize("where", ["missing", "file", "unwritable", "no_slurm"])
def test_never_raises_and_warns_once(tmp_path: Path, where: str) -> None:
    job_dir: str | None = str(tmp_path / "jobs" / "1")
    if where == "file":
        (tmp_path / "jobs").write_text("not a directory")
    elif where == "unwritable":  # the rank file cannot be opened (works as root too)
        (tmp_path / "jobs" / "1" / "steps-0.jsonl").mkdir(parents=True)
    elif where == "no_slurm":
        job_dir = None
    err = io.StringIO()
    rec = job.Recorder(job_dir, 0, stderr=err)
    for _ in range(5):
        rec.step(samples=1)
    rec.flush()
    rec.close()
    assert rec.disabled
    warnings = err.getvalue().splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("slurmhealth.job: step reporting off")


def test_module_level_step_is_silent_after_one_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURMHEALTH_JOB_DIR", str(tmp_path / "nope"))
    for _ in range(3):
        job.step(samples=1)
    job.flush()
    assert capsys.readouterr().err.count("slurmhealth.job:") == 1
    assert not (tmp_path / "nope").exists()


def test_write_failure_mid_run_disables(tmp_path: Path) -> None:
    err = io.StringIO()
    rec = job.Recorder(str(tmp_path), 0, stderr=err)
    rec.step()
    assert rec._fh is not None
    rec._fh.close()  # the file went away under us (e.g. disk full, fs gone)
    rec.step()
    rec.step()
    assert rec.disabled and err.getvalue().count("\n") == 1


def test_client_is_stdlib_only_and_python38_syntax() -> None:
    source = Path(job.__file__).read_text()
    tree = ast.parse(source, feature_version=(3, 8))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 0
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


# -- TaskReader ----------------------------------------------------------------------------


def rec_line(rank: int, step: int, ts: float, **fields: float | None) -> str:
    row: dict[str, object] = {"ts": ts, "rank": rank, "step": step, "step_seconds": 2.0}
    row |= {"samples": 32, "flops": 989e12, "comm_seconds": 0.5, "data_wait_seconds": 0.2}
    row |= fields
    return json.dumps(row) + "\n"


def test_reader_combines_ranks_medians_ratios_and_mfu(tmp_path: Path) -> None:
    for rank in (0, 1):
        with open(tmp_path / f"steps-{rank}.jsonl", "w") as fh:
            fh.write(rec_line(rank, 1, T0, step_seconds=None))
            for step in range(2, 11):
                fh.write(rec_line(rank, step, T0 + 2 * step))
    reader = TaskReader(str(tmp_path), peak_flops_per_gpu=989e12, gpus=2)
    stats = reader.read(T0 + 30)
    assert stats is not None
    assert stats.steps_total == 10
    assert stats.step_seconds == 2.0
    assert stats.samples_per_second == pytest.approx(32.0)  # 16/s per rank, two ranks
    assert stats.tokens_per_second is None
    assert stats.mfu_ratio == pytest.approx(0.5)
    assert stats.comm_ratio == pytest.approx(0.25)
    assert stats.data_wait_ratio == pytest.approx(0.1)
    assert stats.last_step_ts == T0 + 20
    assert TaskReader(str(tmp_path), None, 2).read(T0).mfu_ratio is None  # type: ignore[union-attr]


def test_reader_is_incremental_and_tolerates_garbage(tmp_path: Path) -> None:
    path = tmp_path / "steps-0.jsonl"
    reader = TaskReader(str(tmp_path), None, 1)
    assert reader.read(T0) is None  # nothing yet
    path.write_text(
        rec_line(0, 1, T0, step_seconds=1.0)
        + "garbage\n"
        + '{"ts": "x", "rank": 0, "step": 2}\n'
        + "[1, 2]\n"
        + rec_line(0, 2, T0 + 1, step_seconds=3.0)
    )
    first = reader.read(T0 + 1)
    assert first is not None and (first.steps_total, first.step_seconds) == (2, 2.0)
    partial = rec_line(0, 3, T0 + 3, step_seconds=2.5)
    with open(path, "a") as fh:
        fh.write(partial[:20])  # the writer is mid-line
    again = reader.read(T0 + 2)
    assert again is not None and again.steps_total == 2
    with open(path, "a") as fh:
        fh.write(partial[20:])
    done = reader.read(T0 + 3)
    assert done is not None and (done.steps_total, done.step_seconds) == (3, 2.5)
    assert done.last_step_ts == T0 + 3
    assert done.samples_per_second == pytest.approx(3 * 32 / 6.5)


def test_reader_window_and_backlog_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(task, "MAX_BACKLOG_BYTES", 4096)
    with open(tmp_path / "steps-0.jsonl", "w") as fh:
        for step in range(1, 501):  # old steps were slow, the recent ones fast
            fh.write(rec_line(0, step, T0 + step, step_seconds=9.0 if step <= 450 else 1.0))
    stats = TaskReader(str(tmp_path), None, 1).read(T0)
    assert stats is not None and stats.steps_total == 500
    assert stats.step_seconds == 1.0  # only the last 50 steps count


def test_reader_restarts_on_truncation(tmp_path: Path) -> None:
    path = tmp_path / "steps-0.jsonl"
    path.write_text("".join(rec_line(0, s, T0 + s) for s in range(1, 6)))
    reader = TaskReader(str(tmp_path), None, 1)
    assert reader.read(T0).steps_total == 5  # type: ignore[union-attr]
    path.write_text(rec_line(0, 1, T0 + 100))
    assert reader.read(T0).steps_total == 1  # type: ignore[union-attr]


def test_client_to_reader_round_trip(tmp_path: Path) -> None:
    writers = [job.Recorder(str(tmp_path), rank) for rank in (0, 1)]
    reader = TaskReader(str(tmp_path), peak_bf16_flops("NVIDIA H100 80GB HBM3"), 2)
    for _ in range(4):
        for w in writers:
            w.step(samples=8, flops=1e12, comm_seconds=0.001)
        time.sleep(0.01)
    assert reader.read(time.time()).steps_total == 4  # type: ignore[union-attr]
    for w in writers:
        w.step(samples=8, flops=1e12, comm_seconds=0.001)
        w.close()
    stats = reader.read(time.time())
    assert stats is not None and stats.steps_total == 5
    assert stats.step_seconds is not None and 0.005 < stats.step_seconds < 2.0
    assert stats.samples_per_second is not None and stats.samples_per_second > 0
    assert stats.mfu_ratio is not None and 0 < stats.mfu_ratio < 1
    assert stats.comm_ratio is not None and 0 < stats.comm_ratio < 1
    assert sorted(os.listdir(tmp_path)) == ["steps-0.jsonl", "steps-1.jsonl"]


def test_parse_line_rejects_malformed() -> None:
    assert parse_line(b'{"ts": 1.0, "rank": 0, "step": 1}') is not None
    for bad in (b"", b"{", b"null", b'{"ts": 1, "rank": true, "step": 1}', b"\xff\xfe"):
        assert parse_line(bad) is None


def test_peak_flops_lookup() -> None:
    assert peak_bf16_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_bf16_flops("NVIDIA H200") == PEAK_BF16_FLOPS["NVIDIA H200"] == 989e12
    assert peak_bf16_flops("nvidia a100-sxm4-80gb") == 312e12
    assert peak_bf16_flops("NVIDIA H200 141GB HBM3e") == 989e12  # longest known prefix
    assert peak_bf16_flops("NVIDIA H100 NVL") == 835e12
    assert peak_bf16_flops("Tesla V100-SXM2-32GB") is None
    assert peak_bf16_flops(None) is None
