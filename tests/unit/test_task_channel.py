"""The task channel under a hostile job user: what a user can put in the job dir never
crashes, freezes or bloats the root sidecar's reader (DESIGN.md 5b, issue 11)."""

from __future__ import annotations

import json
import logging
import math
import os
import random
import threading
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth import job
from slurmhealth.sidecar import task
from slurmhealth.sidecar.state import TaskStats
from slurmhealth.sidecar.task import RANGES, StepRecord, TaskReader, parse_line

T0 = 1_700_000_000.0
GOOD = {"ts": T0, "rank": 0, "step": 7, "step_seconds": 2.0, "samples": 32, "flops": 1e15}


def line(**fields: object) -> str:
    return json.dumps(GOOD | fields) + "\n"


def read_in_thread(reader: TaskReader, timeout: float = 10.0) -> TaskStats | None:
    """``reader.read`` that fails the test instead of hanging it."""
    out: list[TaskStats | None] = []
    worker = threading.Thread(target=lambda: out.append(reader.read(T0)), daemon=True)
    worker.start()
    worker.join(timeout)
    assert not worker.is_alive(), "the reader blocked"
    return out[0]


def count_calls(monkeypatch: pytest.MonkeyPatch, name: str) -> list[tuple[object, ...]]:
    """Record every call of ``task.os.<name>`` (still calling the real one)."""
    calls: list[tuple[object, ...]] = []
    real: Callable[..., object] = getattr(os, name)

    def spy(*args: object, **kwargs: object) -> object:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(task.os, name, spy)
    return calls


def assert_valid(rec: StepRecord) -> None:
    for name in ("ts", "rank", "step", *task.FIELDS):
        value = getattr(rec, name)
        if value is None:
            continue
        low, high = RANGES[name]
        assert math.isfinite(value) and low <= value <= high, (name, value)
    assert isinstance(rec.rank, int) and isinstance(rec.step, int)


# -- one line --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bomb",
    [
        "[" * 100_000,  # the line from the issue: RecursionError in json before
        "[" * 4000,  # short enough for the length limit: the depth test stops it
        '{"a":' * 800 + "1" + "}" * 800,
        '{"ts": 1e9, "rank": 0, "step": 1, "x": ' + "[" * 3000 + "]" * 3000 + "}",
        "{" * 100_000,
    ],
)
def test_nesting_bombs_are_rejected_not_raised(bomb: str) -> None:
    assert parse_line(bomb) is None
    assert parse_line(bomb.encode()) is None


def test_huge_integers_never_overflow() -> None:
    digits = "9" * 400
    assert parse_line(f'{{"ts": {digits}, "rank": 0, "step": 1}}') is None
    assert parse_line(f'{{"ts": 1e9, "rank": 0, "step": {digits}}}') is None
    assert parse_line(f'{{"ts": 1e9, "rank": {digits}, "step": 1}}') is None
    rec = parse_line(f'{{"ts": 1e9, "rank": 0, "step": 1, "samples": {digits}}}')
    assert rec is not None and rec.samples is None  # a value out of range is dropped alone
    assert parse_line(f'{{"ts": 1e9, "rank": 0, "step": 1, "flops": 1e{digits}}}') is not None


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity", "1e400", "-1", "-0.5"])
def test_non_finite_and_negative_numbers(bad: str) -> None:
    assert parse_line(f'{{"ts": {bad}, "rank": 0, "step": 1}}') is None
    rec = parse_line(f'{{"ts": 1e9, "rank": 0, "step": 1, "step_seconds": {bad}, "tokens": {bad}}}')
    assert rec is not None and rec.step_seconds is None and rec.tokens is None


def test_ranges_per_field() -> None:
    assert parse_line(line(step_seconds=2e6)).step_seconds is None  # type: ignore[union-attr]
    assert parse_line(line(step_seconds=0)).step_seconds is None  # type: ignore[union-attr]
    assert parse_line(line(samples=10**18 + 1)).samples is None  # type: ignore[union-attr]
    assert parse_line(line(flops=6e19)).flops == 6e19  # type: ignore[union-attr]
    assert parse_line(line(comm_seconds=True)).comm_seconds is None  # type: ignore[union-attr]
    assert parse_line(line(step=-1)) is None
    assert parse_line(line(rank=2**31)) is None
    assert parse_line(line(ts=0)) is None
    assert parse_line(line(step=2.5)) is None


def test_a_line_over_the_length_limit_is_rejected() -> None:
    padded = json.dumps(GOOD | {"pad": "x" * task.MAX_LINE_BYTES})
    assert parse_line(padded) is None
    assert parse_line(line()) == StepRecord(T0, 0, 7, 2.0, 32.0, None, 1e15, None, None)


# -- the reader ------------------------------------------------------------------------------


def test_bad_lines_are_counted_and_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with open(tmp_path / "steps-0.jsonl", "w") as fh:
        fh.write(line(step=1))
        fh.write("[" * (task.MAX_BACKLOG_BYTES // 2) + "\n")  # longer ones: skipped backlog
        fh.write('{"ts": 1e9, "rank": 0, "step": ' + "9" * 400 + "}\n")
        fh.write('{"ts": NaN, "rank": 0, "step": 2}\n')
        fh.write(line(step=3))
    reader = TaskReader(str(tmp_path), None, 1)
    with caplog.at_level(logging.WARNING, "slurmhealth.sidecar"):
        stats = reader.read(T0)
        reader.read(T0)
    assert stats is not None and stats.steps_total == 3
    assert reader.rejected_lines == 3
    assert len([r for r in caplog.records if "steps-0.jsonl" in r.getMessage()]) == 1


def test_an_endless_line_is_dropped_once_and_reading_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "steps-0.jsonl"
    reads = count_calls(monkeypatch, "pread")
    reader = TaskReader(str(tmp_path), None, 1)
    path.write_text(line(step=1))
    assert reader.read(T0).steps_total == 1  # type: ignore[union-attr]
    for _ in range(3):
        with open(path, "a") as fh:
            fh.write("x" * 4 * task.MAX_LINE_BYTES)  # no end: over the limit, dropped as it comes
        assert reader.read(T0).steps_total == 1  # type: ignore[union-attr]
    assert reader.rejected_lines == 1
    with open(path, "a") as fh:  # a backlog over MAX_BACKLOG_BYTES is skipped, not parsed
        fh.write("x" * 5_000_000 + "\n" + line(step=2))
    assert reader.read(T0).steps_total == 2  # type: ignore[union-attr]
    assert reader.rejected_lines == 1
    assert max(int(str(args[1])) for args in reads) <= task.MAX_BACKLOG_BYTES


def test_a_fifo_named_like_a_rank_file_does_not_freeze_the_reader(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "steps-3.jsonl")
    (tmp_path / "steps-0.jsonl").write_text(line(step=4))
    reader = TaskReader(str(tmp_path), None, 1)
    stats = read_in_thread(reader)
    assert stats is not None and stats.steps_total == 4
    assert reader.ignored_files == 1


def test_symlinks_are_never_followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job_dir, elsewhere = tmp_path / "job", tmp_path / "records.jsonl"
    job_dir.mkdir()
    elsewhere.write_text(line(step=99))  # would count if the link were followed
    (job_dir / "steps-1.jsonl").symlink_to("/etc/shadow")
    (job_dir / "steps-2.jsonl").symlink_to(elsewhere)
    opened = count_calls(monkeypatch, "open")
    reader = TaskReader(str(job_dir), None, 1)
    assert read_in_thread(reader) is None
    assert reader.ignored_files == 2
    assert [args[0] for args in opened] == [str(job_dir)]  # only the dir itself


def test_the_link_swapped_in_after_the_listing_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A race: regular at listing time, a symlink when opened (O_NOFOLLOW refuses it)."""
    (tmp_path / "records.jsonl").write_text(line(step=99))
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "steps-0.jsonl").write_text(line(step=1))
    real_open = os.open

    def swap_then_open(path: str, flags: int, *args: object, **kw: object) -> int:
        if path == "steps-0.jsonl":
            (job_dir / path).unlink()
            (job_dir / path).symlink_to(tmp_path / "records.jsonl")
        return real_open(path, flags, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(task.os, "open", swap_then_open)
    reader = TaskReader(str(job_dir), None, 1)
    assert reader.read(T0) is None
    assert reader.ignored_files == 1


def test_files_of_another_owner_are_not_read(tmp_path: Path) -> None:
    """A hard link to a root file, as the job user could make one, has root as its owner."""
    (tmp_path / "steps-0.jsonl").write_text(line(step=5))
    assert TaskReader(str(tmp_path), None, 1, uid=os.getuid() + 1).read(T0) is None
    assert TaskReader(str(tmp_path), None, 1, uid=os.getuid()).read(T0) is not None
    assert TaskReader(str(tmp_path), None, 1).read(T0) is not None  # the dir's owner


def test_directories_and_odd_names_are_not_rank_files(tmp_path: Path) -> None:
    (tmp_path / "steps-7.jsonl").mkdir()
    (tmp_path / "steps-\n.jsonl").write_text(line(step=8))
    (tmp_path / "steps-1.jsonl.bak").write_text(line(step=8))
    reader = TaskReader(str(tmp_path), None, 1)
    assert reader.read(T0) is None
    assert reader.ignored_files == 1  # the directory; the others are simply not rank files


def test_five_thousand_rank_files_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "steps-0.jsonl").write_text(line())
    for rank in range(1, 5000):  # hard links: as good as copies here, and fast to make
        os.link(tmp_path / "steps-0.jsonl", tmp_path / f"steps-{rank}.jsonl")
    opened = count_calls(monkeypatch, "open")
    reader = TaskReader(str(tmp_path), None, 8)
    tracemalloc.start()
    try:
        stats = reader.read(T0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert reader.read(T0) == stats is not None and stats.steps_total == 7
    assert len(opened) == 2 * (1 + task.MAX_RANK_FILES)  # the dir and the first 1,024 files
    assert reader.ignored_files == 5000 - task.MAX_RANK_FILES
    assert peak < 16 << 20, f"{peak / 2**20:.1f} MiB"


def test_bytes_per_read_are_bounded_and_every_rank_gets_its_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(task, "MAX_READ_BYTES", 3 * len(line()))
    for rank in range(6):
        (tmp_path / f"steps-{rank}.jsonl").write_text(line(rank=rank, step=rank + 1))
    reads = count_calls(monkeypatch, "pread")
    reader = TaskReader(str(tmp_path), None, 1)
    reader.read(T0)
    assert sum(int(str(args[1])) for args in reads) <= task.MAX_READ_BYTES
    assert reader.read(T0).steps_total == 6  # type: ignore[union-attr]


def test_an_internal_error_never_reaches_the_sidecar_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "steps-0.jsonl").write_text(line())

    def boom(*_: object) -> None:
        raise ZeroDivisionError("bug")

    monkeypatch.setattr(TaskReader, "_summarise", boom)
    with caplog.at_level(logging.WARNING, "slurmhealth.sidecar"):
        assert TaskReader(str(tmp_path), None, 1).read(T0) is None
    assert "ZeroDivisionError" in caplog.text


def test_a_missing_job_dir_reads_as_nothing(tmp_path: Path) -> None:
    assert TaskReader(str(tmp_path / "gone"), None, 1).read(T0) is None


def test_the_writer_keeps_huge_python_ints_readable(tmp_path: Path) -> None:
    """``6 * params * tokens`` as a Python int: written as a float, not 21 digits."""
    writer = job.Recorder(str(tmp_path), 0)
    writer.step(flops=6 * 10**20, samples=10**400, tokens=2**40)
    writer.close()
    stats = TaskReader(str(tmp_path), 1e15, 1)
    assert stats.read(T0) is not None and stats.rejected_lines == 0
    rec = parse_line((tmp_path / "steps-0.jsonl").read_bytes())
    assert rec is not None and (rec.flops, rec.samples, rec.tokens) == (6e20, None, 2.0**40)


# -- fuzzing ---------------------------------------------------------------------------------

KEYS = ["ts", "rank", "step", *task.FIELDS, "x"]
ODD = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "9" * 400, "-" + "9" * 30, "1e-400"]


def _value(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.3:
        return rng.choice(ODD)
    if roll < 0.5:
        return json.dumps(rng.choice([None, True, "s", -1, 0, 2**63, 1e30, 1e18, []]))
    if roll < 0.6:
        return "[" * rng.randint(1, 3000) + "{" * rng.randint(0, 50)
    return repr(rng.uniform(-1e3, 1e20) if rng.random() < 0.5 else rng.randint(-5, 10**19))


def _fuzz_line(rng: random.Random) -> bytes:
    roll = rng.random()
    if roll < 0.15:
        return rng.randbytes(rng.randint(0, 300))
    fields = {k: _value(rng) for k in rng.sample(KEYS, rng.randint(0, len(KEYS)))}
    if rng.random() < 0.4:
        fields |= {"ts": repr(T0), "rank": "0", "step": str(rng.randint(0, 100))}
    text = "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"
    raw = bytearray(text.encode())
    for _ in range(rng.choice([0, 0, 1, 3])):  # flip, drop or insert a byte
        at = rng.randrange(len(raw) + 1)
        op = rng.randrange(3)
        if op == 0 and at < len(raw):
            raw[at] = rng.randrange(256)
        elif op == 1 and at < len(raw):
            del raw[at]
        else:
            raw.insert(at, rng.choice(b'{}[]",:-+.eE0123456789\\\x00\xff'))
    return bytes(raw)


def test_parse_line_fuzz_ten_thousand_inputs() -> None:
    rng = random.Random(20261201)
    kinds = {"none": 0, "record": 0}
    for _ in range(10_000):
        raw = _fuzz_line(rng)
        for form in (raw, raw.decode("utf-8", "replace")):
            rec = parse_line(form)
            kinds["none" if rec is None else "record"] += 1
            if rec is not None:
                assert_valid(rec)
    assert kinds["record"] > 1000 and kinds["none"] > 1000  # both paths exercised


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(KEYS),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.floats(allow_nan=True, allow_infinity=True),
            st.text(max_size=20),
            st.lists(st.integers(), max_size=3),
        ),
    )
)
def test_parse_line_only_returns_valid_records(row: dict[str, object]) -> None:
    text = json.dumps(row)
    rec = parse_line(text)
    if rec is not None:
        assert_valid(rec)


def test_reader_fuzz_appends_never_raise(tmp_path: Path) -> None:
    rng = random.Random(7)
    reader = TaskReader(str(tmp_path), None, 1)
    for _ in range(300):
        path = tmp_path / f"steps-{rng.randrange(4)}.jsonl"
        with open(path, "ab") as fh:
            fh.write(b"\n".join(_fuzz_line(rng) for _ in range(rng.randint(0, 5))))
            if rng.random() < 0.5:
                fh.write(b"\n")
        if rng.random() < 0.05:
            path.write_bytes(b"")  # truncated
        stats = reader.read(T0)
        assert stats is None or stats.steps_total >= 0
