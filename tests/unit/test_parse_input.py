"""What operators and Slurm type: GPU lists and durations, read by one parser each."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from slurmhealth.cli.history import parse_since
from slurmhealth.cli.report import parse_window
from slurmhealth.config.timeparse import duration_s, since_ts
from slurmhealth.errors import UsageError
from slurmhealth.model import parse_gpu_list

NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("text", "gpus"),
    [("", ()), (" 7 ", (7,)), ("3,1,3", (1, 3)), ("0-2,6", (0, 1, 2, 6)), ("4-4", (4,))],
)
def test_gpu_list(text: str, gpus: tuple[int, ...]) -> None:
    assert parse_gpu_list(text) == gpus


@pytest.mark.parametrize("text", ["gpu:2", "1-", "-1", "a-3", "²", "0,x"])
def test_gpu_list_names_its_source_in_the_error(text: str) -> None:
    with pytest.raises(UsageError, match=r"^--gpus: "):
        parse_gpu_list(text, source="--gpus")


def test_gpu_range_backwards_is_an_error() -> None:
    with pytest.raises(UsageError, match="backwards"):
        parse_gpu_list("3-1")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("600", 600), ("90s", 90), ("10m", 600), ("2 h", 7200), ("1.5d", 129600), ("0s", 0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert duration_s(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "10x", "-5m", "1e3", "٣m"])
def test_not_durations(text: str) -> None:
    assert duration_s(text) is None


def test_since_reads_durations_and_utc_dates() -> None:
    assert since_ts("30m", NOW) == NOW - 1800
    assert since_ts("600", NOW) == NOW - 600
    day = datetime(2024, 1, 1, tzinfo=UTC).timestamp()
    assert since_ts("2024-01-01", NOW) == day  # no zone: UTC
    assert since_ts("20240101", NOW) == day  # digits alone are a date, not seconds
    assert since_ts("2024-01-01T02:00:00+02:00", NOW) == day
    assert since_ts("2024-01-01T00:00:00Z", NOW) == day
    assert since_ts("yesterday", NOW) is None


def test_cli_edges_turn_unreadable_text_into_usage_errors() -> None:
    assert parse_since(None, NOW) is None and parse_since("1h", NOW) == NOW - 3600
    with pytest.raises(UsageError, match="--since"):
        parse_since("yesterday", NOW)
    assert parse_window("10m") == 600 and parse_window(None) is None
    for bad in ("0", "0s", "soon"):
        with pytest.raises(UsageError, match="--window"):
            parse_window(bad)


@pytest.mark.parametrize("text", ["8", "8.", "1.5m", " 2 s ", "0.5h"])
def test_one_duration_grammar_for_the_cli_and_the_wrappers_timeouts(text: str) -> None:
    """What an operator may type for ``--since`` is what the hook wrappers hand timeout(1)
    (SLURMHEALTH_PROLOG_TIMEOUT), and both read it to the same seconds."""
    from slurmhealth.config.ranges import wrapper_timeout

    seconds = duration_s(text)
    assert seconds is not None and seconds > 0
    assert wrapper_timeout({"SLURMHEALTH_PROLOG_TIMEOUT": text}, "prolog") == (
        seconds,
        "SLURMHEALTH_PROLOG_TIMEOUT",
    )
