"""Slurm hostlist expressions (``scontrol show hostnames``): the forms Slurm writes, the ones
it refuses, a bound on the names one expression may stand for, and 10,000 fuzzed
expressions that either expand or raise HostlistError in one line, never hang."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.history import Batch, History
from slurmhealth.history.read import Reader
from slurmhealth.slurm import MAX_HOSTS, HostlistError, expand_hostlist
from slurmhealth.summary.collect import job_facts


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("", ()),
        ("n1", ("n1",)),
        ("n[1-3],login1", ("n1", "n2", "n3", "login1")),
        ("gpu[08-10,12]", ("gpu08", "gpu09", "gpu10", "gpu12")),
        ("n[001-003]", ("n001", "n002", "n003")),
        ("n[8-10]", ("n8", "n9", "n10")),  # no padding: the width of the first number
        ("n[1-2]-ib", ("n1-ib", "n2-ib")),
        ("rack[1-2]-n[1-2]", ("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2")),
        ("n[3,1,3]", ("n3", "n1", "n3")),  # Slurm keeps order and repeats
        ("a b,c", ("a", "b", "c")),  # blanks separate like commas
        ("n[1-2],,m[ 5 ]", ("n1", "n2", "m5")),
        ("[1-2]", ("1", "2")),
    ],
)
def test_expands_like_scontrol_show_hostnames(text: str, names: tuple[str, ...]) -> None:
    assert expand_hostlist(text) == names


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("n[1-1e30]", "is not N or N-M"),
        ("n[3-1]", "is not N or N-M"),
        ("n[]", "is not N or N-M"),
        ("n[a-b]", "is not N or N-M"),
        ("n[1-2", "unbalanced or nested bracket"),
        ("n1-2]", "unbalanced or nested bracket"),
        ("n[1-[2-3]]", "unbalanced or nested bracket"),
        ("n[[1]]", "unbalanced or nested bracket"),
        ("n[1-99999999999]", f"more than {MAX_HOSTS} names"),
        ("n[1-999999999999999999]", f"more than {MAX_HOSTS} names"),
        ("a[1-300]b[1-300]", f"more than {MAX_HOSTS} names"),
        ("a[1-40000],b[1-40000]", f"more than {MAX_HOSTS} names"),
        ("n[" + "9" * 5000 + "]", "is not N or N-M"),
    ],
)
def test_refused_in_one_line(text: str, why: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(HostlistError, match=why) as err:
        expand_hostlist(text)
    assert "\n" not in str(err.value) and len(str(err.value)) < 200
    assert time.monotonic() - t0 < 1.0  # counted, not enumerated


def test_the_bound_is_exact_and_counts_every_expression() -> None:
    assert len(expand_hostlist(f"n[1-{MAX_HOSTS}]")) == MAX_HOSTS
    with pytest.raises(HostlistError):
        expand_hostlist(f"n[1-{MAX_HOSTS}],extra")
    assert expand_hostlist("n[1-5]", limit=5) == ("n1", "n2", "n3", "n4", "n5")
    with pytest.raises(HostlistError, match="more than 4 names"):
        expand_hostlist("n[1-5]", limit=4)


_PREFIX = st.text("abcnode-_.", min_size=0, max_size=6)
_RANGE = st.tuples(st.integers(0, 300), st.integers(0, 20), st.integers(1, 4))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(prefix=_PREFIX, suffix=_PREFIX, ranges=st.lists(_RANGE, min_size=1, max_size=4))
def test_any_idlist_expands_to_its_numbers(
    prefix: str, suffix: str, ranges: list[tuple[int, int, int]]
) -> None:
    """``prefix[lo-hi,...]suffix``: every number of every range, padded to lo's width."""
    idlist = ",".join(f"{lo:0{w}d}-{lo + n:0{w}d}" for lo, n, w in ranges)
    want = tuple(f"{prefix}{i:0{w}d}{suffix}" for lo, n, w in ranges for i in range(lo, lo + n + 1))
    assert expand_hostlist(f"{prefix}[{idlist}]{suffix}") == want


# -- fuzzing ---------------------------------------------------------------------------------

PIECES = ["n", "gpu", "rack", "-", "_", ".", "[", "]", ",", " ", "1", "01", "001", "-", "[1-3]",
          "[001-010]", "[1-2,5]", "[1-99999999999]", "[1-1e30]", "[0-65536]", "[]", "[[", "]]",
          "\x00", "é", "٣", "\t", "\n", "[3-1]", "[1-300]", "(null)"]  # fmt: skip


def _fuzz_hostlist(rng: random.Random) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 12)))


def test_hostlist_fuzz_ten_thousand_expressions() -> None:
    rng = random.Random(20261211)
    outcomes = {"names": 0, "HostlistError": 0}
    t0 = time.monotonic()
    for _ in range(10_000):
        text = _fuzz_hostlist(rng)
        try:
            names = expand_hostlist(text)
        except HostlistError as exc:
            outcomes["HostlistError"] += 1
            assert "\n" not in str(exc)
            continue
        outcomes["names"] += 1
        assert len(names) <= MAX_HOSTS
        for name in names:
            assert name and not any(c in name for c in "[], \t\n"), (text, name)
    assert min(outcomes.values()) > 1000, outcomes
    assert time.monotonic() - t0 < 20  # bounded by construction: no input is enumerated


# -- the report reads a job's stored node list -----------------------------------------------


def test_report_job_facts_survive_a_stored_node_list_no_one_can_expand(tmp_path: Path) -> None:
    """A job row holding an absurd node list (or Slurm's "(null)" for an unset account)
    gives the node the row came from and empty fields, which the report shows as "-"."""
    path = tmp_path / "n1.db"
    row = {"job_id": "7", "node": "n1", "user": "alice", "account": "(null)", "qos": "(null)",
           "partition": "gpu", "nodes": "n[1-99999999999]"}  # fmt: skip
    with History(path) as db:
        assert db.write(Batch(upserts=[("jobs", row, "job_id")]))
    reader = Reader(path)
    try:
        facts = job_facts(reader, "7")
    finally:
        reader.close()
    assert facts is not None
    assert (facts.account, facts.qos, facts.partition, facts.node_names) == ("", "", "gpu", ("n1",))
