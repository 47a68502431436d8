"""The node's shared GPU snapshot: a burst of prologs reads each GPU once, only answers are
shared, and the cache files are trusted only when they are root's own regular files."""

from __future__ import annotations

import dataclasses
import fcntl
import os
from collections.abc import Sequence
from pathlib import Path

from slurmhealth.hooks.snapshot_cache import MAX_AGE_S, shared_snapshot
from slurmhealth.model import GpuState, GpuStatus, NodeSnapshot
from tests.support.skips import root_only
from tests.unit.test_hooks_decisions import _config, _gpu


class Reader:
    """Reads the simulated GPUs of ``scenario`` and counts what it was asked for."""

    def __init__(self, tmp_path: Path, scenario: str = "healthy", timeout_s: float = 30.0) -> None:
        self.cfg = _config(tmp_path, scenario)
        self.timeout_s = timeout_s  # generous: a GPU that answers is never cut on a busy CI
        self.tmp_path = tmp_path
        self.asked: list[list[int]] = []

    def __call__(self, indices: Sequence[int] | None) -> tuple[NodeSnapshot, str | None]:
        self.asked.append(list(indices or []))
        backend = _gpu(self.cfg, self.tmp_path, timeout_s=self.timeout_s)
        try:
            return backend.snapshot(indices), backend.kernel_log_hint
        finally:
            backend.close()


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def _share(
    run: Path, reader: Reader, wanted: Sequence[int], clock: Clock
) -> tuple[NodeSnapshot, str | None]:
    got = shared_snapshot(str(run), reader, wanted, 1.0, now=clock)
    assert got is not None
    return got


def test_a_burst_of_prologs_reads_each_gpu_once(tmp_path: Path) -> None:
    reader, clock = Reader(tmp_path), Clock()
    first, hint = _share(tmp_path / "run", reader, range(8), clock)
    clock.t += MAX_AGE_S / 2
    second, hint2 = _share(tmp_path / "run", reader, [2, 3], clock)
    assert reader.asked == [list(range(8))]
    assert second.gpus == tuple(g for g in first.gpus if g.index in (2, 3))
    assert hint2 == hint and hint  # the simulator's kernel log, without opening it again
    assert os.stat(tmp_path / "run").st_mode & 0o777 == 0o700


def test_an_old_read_is_not_used(tmp_path: Path) -> None:
    reader, clock = Reader(tmp_path), Clock()
    _share(tmp_path / "run", reader, [0], clock)
    clock.t += MAX_AGE_S + 0.1
    _share(tmp_path / "run", reader, [0], clock)
    assert reader.asked == [[0], [0]]


def test_only_the_gpus_missing_from_the_cache_are_read(tmp_path: Path) -> None:
    reader, clock = Reader(tmp_path), Clock()
    _share(tmp_path / "run", reader, [0, 1], clock)
    got, _ = _share(tmp_path / "run", reader, [1, 2], clock)
    assert reader.asked == [[0, 1], [2]]
    assert [g.index for g in got.gpus] == [1, 2]


def test_a_gpu_that_did_not_answer_is_read_again_by_the_next_prolog(tmp_path: Path) -> None:
    reader, clock = Reader(tmp_path, "gpu-hang", timeout_s=1.0), Clock()
    first, _ = _share(tmp_path / "run", reader, [5, 6], clock)
    assert [g.status for g in first.gpus] == [GpuStatus.OK, GpuStatus.UNRESPONSIVE]
    second, _ = _share(tmp_path / "run", reader, [5, 6], clock)
    assert reader.asked == [[5, 6], [6]]  # GPU 5 from the cache, the hung one read again
    assert second.gpu(6) is not None and second.gpu(6).status is GpuStatus.UNRESPONSIVE  # type: ignore[union-attr]


def test_every_field_survives_the_cache(tmp_path: Path) -> None:
    reader, clock = Reader(tmp_path, "nvlink-errors"), Clock()
    first, _ = _share(tmp_path / "run", reader, range(8), clock)
    second, _ = _share(tmp_path / "run", reader, range(8), clock)
    assert len(reader.asked) == 1
    assert second == first
    assert any(g.nvlinks for g in second.gpus)


def test_a_planted_symlink_is_never_followed(tmp_path: Path) -> None:
    reader, clock = Reader(tmp_path), Clock()
    run = tmp_path / "run"
    _share(run, reader, [0], clock)
    target = tmp_path / "elsewhere.json"
    os.replace(run / "snapshot.json", target)
    before = target.read_text()
    (run / "snapshot.json").symlink_to(target)
    _share(run, reader, [0], clock)
    assert reader.asked == [[0], [0]]  # the link's content was not read...
    assert target.read_text() == before  # ...nor written through
    assert not (run / "snapshot.json").is_symlink()


@root_only("chown needs root")
def test_a_cache_owned_by_someone_else_is_ignored(tmp_path: Path) -> None:
    reader, clock = Reader(tmp_path), Clock()
    run = tmp_path / "run"
    good, _ = _share(run, reader, [0], clock)
    forged = dataclasses.replace(good.gpus[0], temperature_c=-99)
    text = (
        (run / "snapshot.json")
        .read_text()
        .replace(f'"temperature_c": {good.gpus[0].temperature_c}', '"temperature_c": -99')
    )
    (run / "snapshot.json").write_text(text)
    os.chown(run / "snapshot.json", 65534, 65534)
    got, _ = _share(run, reader, [0], clock)
    assert got.gpus[0] != forged and len(reader.asked) == 2


def test_a_prolog_that_cannot_get_the_lock_in_time_gets_none(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    fd = os.open(run / "snapshot.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another prolog is reading the GPUs
        reader = Reader(tmp_path)
        assert shared_snapshot(str(run), reader, [0], 0.05) is None
        assert reader.asked == []
    finally:
        os.close(fd)


def test_without_a_usable_run_dir_the_prolog_reads_alone(tmp_path: Path) -> None:
    (tmp_path / "run").write_text("a file where the run dir should be")
    reader = Reader(tmp_path)
    got = shared_snapshot(str(tmp_path / "run"), reader, [0, 1], 1.0)
    assert got is not None and [g.index for g in got[0].gpus] == [0, 1]
    assert isinstance(got[0].gpus[0], GpuState)
