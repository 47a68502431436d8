"""gpu-burn output as gpu_burn-drv.cpp prints it: the right GPU blamed for any GPU count,
signed values kept, and runs that measured nothing refused (exit 1, nothing stored)."""

from __future__ import annotations

import json
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.baseline.model import BaselineParseError, BenchmarkFailed, ParseResult
from slurmhealth.baseline.parsers import parse
from tests.conftest import run_cli
from tests.unit.gpuburn_printf import progress_line, verdicts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "baseline"
HEAD = "Burning for 30 seconds.\n"


def _gflops(r: ParseResult) -> dict[int | None, float]:
    return {m.gpu: m.value for m in r.measurements if m.metric == "gpuburn.gflops"}


def test_16_gpus_errors_blamed_on_the_right_gpus() -> None:
    r = parse("gpuburn", (FIXTURES / "gpuburn_16gpu_v100.txt").read_text())
    assert r.errors == (
        "GPU 6: died (proc'd -1, errors -1)",
        "GPU 11: 4 errors (WARNING!)",  # counted before a 'Summary at' reset zeroed it
        "GPU 13: 2 errors (WARNING!)",
        "GPU 6: FAULTY",
        "GPU 11: FAULTY",
        "GPU 13: FAULTY",
        'tool: Failure during compute: Error in "Read faultyelemdata" (gpu_burn-drv.cpp:275):'
        " an illegal memory access was encountered",
    )
    assert not r.passed and r.problems == ()  # 'read[6] error 0' on stderr is not a column
    values = _gflops(r)
    assert sorted(values) == [g for g in range(16) if g != 6]  # the dead GPU is no baseline
    assert values[2] == 14230 and values[15] == 14212
    by_gpu = {m.gpu: m.detail for m in r.measurements}
    assert by_gpu[12]["errors"] == 0 and by_gpu[12]["temp_c"] == 49
    assert "temp_c" not in by_gpu[2]  # printed '--': no reading, and GPU 3 keeps its own
    assert by_gpu[3]["temp_c"] == 49
    assert r.gpu_model == "Tesla V100-SXM3-32GB" and r.meta["tested"] == 16


def test_negative_values_keep_their_sign() -> None:
    line = progress_line(100.0, [500, -1, 498], [9000, 8800, 9100], [0, -1, 0], [60, 61, 0])
    r = parse("gpuburn", HEAD + line + verdicts([False, True, False]))
    assert r.errors == ("GPU 1: died (proc'd -1, errors -1)", "GPU 1: FAULTY")
    assert _gflops(r) == {0: 9000.0, 2: 9100.0}


def test_srun_label_prefix() -> None:
    text = HEAD + progress_line(100.0, [10, 11], [5000, 5100], [0, 2], [40, 41])
    text += verdicts([False, True])
    labelled = "".join(f"0: {line}\n" for line in text.splitlines())
    r = parse("gpuburn", labelled)
    assert _gflops(r) == {0: 5000.0, 1: 5100.0} and r.meta["verdicts"] == {0: "OK", 1: "FAULTY"}


def test_pre_0_8_slash_separators() -> None:
    line = progress_line(100.0, [10, 11], [5000, 5100], [0, 7], [40, 41], sep="/ ")
    r = parse("gpuburn", HEAD + line + verdicts([False, True]))
    assert _gflops(r) == {0: 5000.0, 1: 5100.0}
    assert r.errors == ("GPU 1: 7 errors (WARNING!)", "GPU 1: FAULTY")


def test_pre_0_7_output_has_no_rates_to_store() -> None:
    old = "\r100.0%  proc'd: 8123 / 8120   errors: 0 / 0   temps: 61 C / 60 C "
    with pytest.raises(BenchmarkFailed, match="no Gflop/s in the progress lines"):
        parse("gpuburn", HEAD + old + verdicts([False, False]))


def test_single_gpu_run_with_i_names_the_device() -> None:
    text = (
        "Initialized device 5 with 81008 MB of memory (80307 MB available, using 72276 MB of"
        " it), using FLOATS\n" + progress_line(100.0, [900], [43000], [3], [70])
    )
    r = parse("gpuburn", text + verdicts([True]))
    assert _gflops(r) == {5: 43000.0}
    assert r.errors == ("GPU 5: 3 errors (WARNING!)", "GPU 5: FAULTY")


def test_zero_gflops_is_not_a_measurement() -> None:
    line = progress_line(100.0, [100, 0], [7000, 0], [0, 0], [50, 50])
    r = parse("gpuburn", HEAD + line + verdicts([False, False]))
    assert _gflops(r) == {0: 7000.0}
    assert r.errors == ("GPU 1: 0 Gflop/s (not computing)",) and not r.passed
    all_zero = progress_line(100.0, [0, 0], [0, 0], [0, 0], [50, 50])
    with pytest.raises(BenchmarkFailed, match="no GPU measured a positive Gflop/s"):
        parse("gpuburn", HEAD + all_zero + verdicts([False, False]))


def test_a_progress_line_of_another_width_is_skipped_not_misread() -> None:
    wide = progress_line(10.0, [1, 2, 3], [5, 5, 6], [0, 4, 0], [40, 41, 42])
    last = progress_line(100.0, [90, 91], [5000, 5001], [0, 0], [40, 41])
    r = parse("gpuburn", HEAD + wide + last + verdicts([False, False]))
    assert r.passed and _gflops(r) == {0: 5000.0, 1: 5001.0}
    assert r.problems == ("a progress line did not have 2 readable GPU columns; it was skipped",)


OK_LINE = progress_line(50.0, [10, 10], [9000, 9000], [0, 0], [50, 50])
FAILED_RUNS = {
    "truncated": (HEAD + OK_LINE + "\n", r"run cut short: no final 'Tested N GPUs' verdicts"),
    "half_verdicts": (
        HEAD + OK_LINE + verdicts([False, False]).rsplit("\tGPU 1", 1)[0],
        r"'Tested 2 GPUs' but 1 verdict lines",
    ),
    "cuinit": (
        "cuInit returned 999 (CUDA_ERROR_UNKNOWN)\nCouldn't init CUDA: Error (x.cpp:71):"
        " unknown error\nNo CUDA devices\n",
        r"run failed: cuInit returned 999",
    ),
    "gpu_init": (
        HEAD + "Couldn't init a GPU test: Error in A alloc (gpu_burn-drv.cpp:200): out of"
        " memory\n" + OK_LINE + verdicts([False, False]),
        r"Couldn't init a GPU test: Error in A alloc",
    ),
    "no_progress": (
        "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-1)\n" + HEAD + "Killed\n",
        r"no progress line",
    ),
}


@pytest.mark.parametrize("case", sorted(FAILED_RUNS))
def test_runs_that_measured_nothing_fail(case: str) -> None:
    text, reason = FAILED_RUNS[case]
    with pytest.raises(BenchmarkFailed, match=reason) as info:
        parse("gpuburn", text)
    assert info.value.exit_code == 1 and "\n" not in str(info.value)


FAILED_FIXTURES = {
    "gpuburn_all_died.txt": "gpuburn: run failed: No clients are alive!  Aborting",
    "gpuburn_init_error.txt": (
        "gpuburn: run failed: Couldn't init a GPU test: Error: CUDA_ERROR_UNKNOWN"
    ),
    "gpuburn_no_progress.txt": "gpuburn: no progress line ('proc'd: ...'); nothing burned",
}


@pytest.mark.parametrize("name", sorted(FAILED_FIXTURES))
def test_failed_runs_as_reported_publicly_store_nothing(
    name: str, sim_env: Callable[..., dict[str, str]]
) -> None:
    with pytest.raises(BenchmarkFailed) as info:
        parse("gpuburn", (FIXTURES / name).read_text())
    assert str(info.value) == FAILED_FIXTURES[name]
    env = sim_env()
    proc = run_cli("baseline", "ingest", "gpuburn", str(FIXTURES / name), env=env)
    assert proc.returncode == 1 and proc.stderr == f"slurmhealth: error: {FAILED_FIXTURES[name]}\n"
    assert not Path(env["SLURMHEALTH_DB"]).exists() or _baseline_rows(env) == 0


def _baseline_rows(env: dict[str, str]) -> int:
    with sqlite3.connect(env["SLURMHEALTH_DB"]) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        if "baselines" not in tables:
            return 0
        return int(conn.execute("SELECT COUNT(*) FROM baselines").fetchone()[0])


def test_wrapped_negative_counts_blame_their_own_gpus() -> None:
    # 16 GPUs, counts that wrapped below zero, GPU 0's errors zeroed by a summary
    r = parse("gpuburn", (FIXTURES / "gpuburn_16gpu_wrapped_counts.txt").read_text())
    assert r.errors == (
        "GPU 0: 3 errors (WARNING!)",
        *(f"GPU {g}: -524288000 errors (WARNING!)" for g in (2, 5, 9, 14)),
        *(f"GPU {g}: FAULTY" for g in (0, 2, 5, 9, 14)),
    )
    assert sorted(_gflops(r)) == list(range(16)) and _gflops(r)[15] == 6400 + 13 * 15


def test_text_that_is_not_gpuburn_is_a_usage_error() -> None:
    with pytest.raises(BaselineParseError, match="not gpu-burn output") as info:
        parse("gpuburn", "hello\n")
    assert not isinstance(info.value, BenchmarkFailed) and info.value.exit_code == 2


@pytest.mark.parametrize("case", sorted(FAILED_RUNS))
def test_ingest_of_a_failed_run_exits_1_and_stores_nothing(
    case: str, sim_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    env = sim_env()
    out = tmp_path / "burn.log"
    out.write_text(FAILED_RUNS[case][0])
    proc = run_cli("baseline", "ingest", "gpuburn", str(out), env=env)
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("slurmhealth: error: gpuburn: ") and "Traceback" not in proc.stderr
    assert "stored" not in proc.stdout
    assert not Path(env["SLURMHEALTH_DB"]).exists() or _baseline_rows(env) == 0


def test_ingest_stores_the_gpu_model_named_in_the_output(
    sim_env: Callable[..., dict[str, str]],
) -> None:
    env = sim_env()
    fixture = str(FIXTURES / "gpuburn_16gpu_v100.txt")
    proc = run_cli("baseline", "ingest", "gpuburn", fixture, env=env)
    assert proc.returncode == 1  # GPUs 6, 11 and 13 are faulty: the tool reported errors
    assert "GPU 11: FAULTY" in proc.stdout
    with sqlite3.connect(env["SLURMHEALTH_DB"]) as conn:
        rows = conn.execute("SELECT gpu, gpu_model, value FROM baselines ORDER BY gpu").fetchall()
    assert [r[0] for r in rows] == [g for g in range(16) if g != 6]
    assert {r[1] for r in rows} == {"Tesla V100-SXM3-32GB"} and all(r[2] > 0 for r in rows)


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        (FAILED_RUNS["truncated"][0], "run cut short"),
        ("", "not gpu-burn output"),
        (HEAD + progress_line(100.0, [0], [0], [0], [50]) + verdicts([False]), "no GPU measured"),
    ],
)
def test_validate_fails_when_the_benchmark_measured_nothing(
    output: str, reason: str, sim_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    env = sim_env()
    (tmp_path / "burn.txt").write_text(output)
    script = tmp_path / "burn.py"
    script.write_text(
        f"import sys\nsys.stdout.write(open({str(tmp_path / 'burn.txt')!r}).read())\n"
    )
    command = json.dumps(f"{sys.executable} {script}")
    Path(env["SLURMHEALTH_CONFIG"]).write_text(
        f"[baseline]\nvalidate_commands = {{ gpuburn = {command} }}\n"
    )
    proc = run_cli("validate", "--json", env=env)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    assert data["status"] == "fail" and reason in " ".join(data["reasons"])
    assert data["benchmarks"][0]["stored"] == 0


_GPU = st.tuples(
    st.integers(-1, 10**7),  # iterations; -1: dead
    st.integers(0, 10**6),  # Gflop/s
    st.integers(-3, 10**5),  # errors in this report
    st.integers(0, 110),  # temperature; 0 prints '--'
)


@settings(max_examples=120, deadline=None)
@given(gpus=st.lists(_GPU, min_size=1, max_size=32), sep=st.sampled_from(["- ", "/ "]))
def test_any_gpu_count_round_trips(gpus: list[tuple[int, int, int, int]], sep: str) -> None:
    iters, gflops, errors, temps = (list(c) for c in zip(*gpus, strict=True))
    text = HEAD + progress_line(100.0, iters, gflops, errors, temps, sep)
    text += verdicts([e != 0 for e in errors])
    computing = {g: float(f) for g, (i, f, _e, _t) in enumerate(gpus) if i != -1 and f > 0}
    if not computing:
        with pytest.raises(BenchmarkFailed):
            parse("gpuburn", text)
        return
    r = parse("gpuburn", text)
    assert _gflops(r) == computing
    for m in r.measurements:
        i, _f, e, t = gpus[m.gpu or 0]
        assert m.detail["iterations"] == i and m.detail["errors"] == e
        assert m.detail.get("temp_c") == (t or None)
    blamed = {int(e.split(":")[0][4:]) for e in r.errors if e.endswith("FAULTY")}
    assert blamed == {g for g, (_i, _f, e, _t) in enumerate(gpus) if e != 0}
    for g, (i, _f, e, _t) in enumerate(gpus):
        if i == -1:
            assert f"GPU {g}: died (proc'd -1, errors {e})" in r.errors
        elif e != 0:  # a wrapped-around count prints negative: still errors, sign kept
            assert f"GPU {g}: {e} errors (WARNING!)" in r.errors


_NOISE = st.text(
    alphabet=st.sampled_from(list("0123456789 -/()CGflop/s%:'\r\n\tproc'derrstempsDIEWARNING!")),
    max_size=300,
)


@settings(max_examples=200, deadline=None)
@given(text=_NOISE)
def test_arbitrary_gpuburn_like_text_raises_only_parse_errors(text: str) -> None:
    try:
        r = parse("gpuburn", "proc'd: " + text)
    except BaselineParseError as exc:
        assert "\n" not in str(exc)
        return
    assert r.measurements and all(m.value > 0 for m in r.measurements)


_PIECE = st.one_of(
    st.builds(
        lambda gpus, sep: progress_line(50.0, *(list(c) for c in zip(*gpus, strict=True)), sep=sep),
        st.lists(_GPU, min_size=1, max_size=6),
        st.sampled_from(["- ", "/ "]),
    ),
    st.builds(verdicts, st.lists(st.booleans(), max_size=6)),
    st.integers(0, 6).map(lambda n: f"Tested {n} GPUs:\n"),
    st.tuples(st.integers(0, 6), st.sampled_from(["OK", "FAULTY"])).map(
        lambda t: f"\tGPU {t[0]}: {t[1]}\n"
    ),
    st.integers(0, 6).map(lambda n: f"Initialized device {n} with 1 MB of memory\n"),
    st.sampled_from(["Couldn't init a GPU test: x\n", "cuInit returned 0 (ok)\n", "\n"]),
    _NOISE,
)


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(_PIECE, max_size=8))
def test_shuffled_gpuburn_pieces_raise_only_parse_errors(pieces: list[str]) -> None:
    try:
        r = parse("gpuburn", HEAD + "".join(pieces))
    except BaselineParseError as exc:
        assert "\n" not in str(exc)
        return
    assert r.measurements and all(m.value > 0 for m in r.measurements)


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(st.lists(_GPU, min_size=1, max_size=5), min_size=1, max_size=4),
    tested=st.integers(1, 5),
)
def test_progress_lines_of_any_width_raise_only_parse_errors(
    lines: list[list[tuple[int, int, int, int]]], tested: int
) -> None:
    text = HEAD
    for gpus in lines:
        text += progress_line(10.0, *(list(c) for c in zip(*gpus, strict=True)))
    try:
        r = parse("gpuburn", text + verdicts([False] * tested))
    except BaselineParseError as exc:
        assert "\n" not in str(exc)
        return
    assert len(lines[-1]) == tested and r.measurements
