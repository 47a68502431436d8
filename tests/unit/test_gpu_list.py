"""GPU lists (``SLURM_JOB_GPUS``, ``--gpus``): bounded to GPU index 1023, so a typo like
``0-99999999999`` is one usage error instead of a MemoryError, and 10,000 fuzzed lists
give indices or a UsageError, nothing else."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.errors import UsageError
from slurmhealth.hooks.job import job_from_env
from slurmhealth.model import MAX_GPU_INDEX, parse_gpu_list
from tests.conftest import run_cli


@pytest.mark.parametrize(
    "text",
    ["0-99999999999", "1024", "0-1024", "9" * 5000, "0," + "1" * 30, "1-" + "9" * 5000],
)
def test_an_index_above_the_bound_is_one_usage_error(text: str) -> None:
    with pytest.raises(UsageError, match=rf"^--gpus: '.*' names a GPU above {MAX_GPU_INDEX}$"):
        parse_gpu_list(text, source="--gpus")


def test_the_bound_itself_and_leading_zeros_are_indices() -> None:
    assert parse_gpu_list(f"0-{MAX_GPU_INDEX}") == tuple(range(MAX_GPU_INDEX + 1))
    assert parse_gpu_list("0" * 5000 + "7,0003") == (3, 7)


def test_a_long_bad_entry_is_shortened_in_the_message() -> None:
    with pytest.raises(UsageError) as err:
        parse_gpu_list("9" * 5000)
    assert len(str(err.value)) < 120


def test_slurm_job_gpus_out_of_range_is_a_usage_error() -> None:
    env = {"SLURM_JOB_ID": "5", "SLURM_JOB_GPUS": "0-99999999999"}
    with pytest.raises(UsageError, match="SLURM_JOB_GPUS"):
        job_from_env(env, "n1")


def test_check_gpus_huge_range_exits_2_with_one_line(
    sim_env: Callable[..., dict[str, str]],
) -> None:
    proc = run_cli("check", "--gpus", "0-99999999999", env=sim_env("healthy"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--gpus" in lines[0] and "1023" in lines[0], proc.stderr


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, MAX_GPU_INDEX), st.integers(0, 8)), max_size=6))
def test_any_list_of_ranges_gives_its_indices(ranges: list[tuple[int, int]]) -> None:
    text = ",".join(f"{lo}-{min(lo + n, MAX_GPU_INDEX)}" for lo, n in ranges)
    want = {i for lo, n in ranges for i in range(lo, min(lo + n, MAX_GPU_INDEX) + 1)}
    assert parse_gpu_list(text) == tuple(sorted(want))


PIECES = ["0", "1", "7", "-", ",", " ", "1023", "1024", "99999999999", "٣", "²", "x", "gpu:",
          "\x00", "", "0" * 50, "-1", ",,", "3-1", "9" * 5000]  # fmt: skip


def test_gpu_list_fuzz_ten_thousand_inputs() -> None:
    rng = random.Random(20261211)
    outcomes = {"indices": 0, "UsageError": 0}
    for _ in range(10_000):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 8)))
        try:
            gpus = parse_gpu_list(text, source="--gpus")
        except UsageError as exc:
            outcomes["UsageError"] += 1
            assert str(exc).startswith("--gpus: ") and "\n" not in str(exc)
            continue
        outcomes["indices"] += 1
        assert list(gpus) == sorted(set(gpus))
        assert all(0 <= g <= MAX_GPU_INDEX for g in gpus)
    assert min(outcomes.values()) > 1000, outcomes
