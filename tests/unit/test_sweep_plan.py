"""The sweep's plan: perfect matchings, few jobs, follow-ups that repeat and triangulate."""

from __future__ import annotations

import itertools

import pytest

from slurmhealth.sweep import plan
from slurmhealth.sweep.model import Planned, Result
from slurmhealth.sweep.verdict import judge


@pytest.mark.parametrize("n", [2, 3, 4, 7, 64, 257])
def test_every_round_is_a_matching_and_no_pair_repeats(n: int) -> None:
    nodes = [f"n{i}" for i in range(n)]
    rounds = plan.matching_rounds(nodes, plan.default_rounds(n))
    seen = set()
    for pairs in rounds:
        busy = [x for p in pairs for x in p]
        assert len(busy) == len(set(busy)), "a node twice in one round"
        assert len(pairs) == n // 2, "every node busy (but one when odd)"
        seen.update(pairs)
    assert len(seen) == sum(len(r) for r in rounds), "a pair met twice"


def test_small_sets_meet_every_pair_large_ones_far_fewer_than_all() -> None:
    three = plan.matching_rounds(["n1", "n2", "n3"], plan.default_rounds(3))
    assert sorted(p for r in three for p in r) == [("n1", "n2"), ("n1", "n3"), ("n2", "n3")]
    nodes = [f"g{i:04d}" for i in range(1024)]
    jobs = sum(len(r) for r in plan.base_plan(nodes, ["nccl"]))
    assert jobs == 1024 + 5 * 512  # each node alone, 5 rounds of pairs
    assert jobs < 1024 * 1023 / 2 / 100
    met = {n: 0 for n in nodes}
    for r in plan.matching_rounds(nodes, 5):
        for a, b in r:
            met[a] += 1
            met[b] += 1
    assert set(met.values()) == {5}


def test_ib_has_no_single_node_round_and_rides_in_the_pair_jobs() -> None:
    both = plan.base_plan(["a", "b", "c", "d"], ["nccl", "ib"])
    assert [len(t.nodes) for t in both[0]] == [1, 1, 1, 1]
    assert all(t.tests == ("nccl", "ib") for r in both[1:] for t in r)
    ib = plan.base_plan(["a", "b", "c", "d"], ["ib"])
    assert all(len(t.nodes) == 2 for r in ib for t in r)


def test_pack_never_puts_a_node_in_two_tests_of_a_round() -> None:
    tests = [Planned(p, 0) for p in itertools.combinations("abcde", 2)]
    rounds = plan.pack(tests, 7)
    assert sum(len(r) for r in rounds) == 10
    for i, r in enumerate(rounds):
        busy = [x for t in r for x in t.nodes]
        assert len(busy) == len(set(busy))
        assert {t.round for t in r} == {7 + i}


def _results(values: dict[tuple[str, ...], list[float]]) -> list[Result]:
    return [
        Result("nccl", k, 1, a, v, "m") for k, vs in values.items() for a, v in enumerate(vs, 1)
    ]


def test_a_pair_slow_once_is_repeated_and_a_fine_repeat_clears_it() -> None:
    values = {("a", "b"): [200.0], ("c", "d"): [370.0], ("a", "c"): [370.0],
              ("b", "d"): [370.0], ("a", "d"): [371.0], ("b", "c"): [369.0]}  # fmt: skip
    nxt = plan.followups(judge(_results(values)), list("abcd"), 4)
    assert [(t.nodes, t.attempt) for r in nxt for t in r] == [(("a", "b"), 2)]
    values[("a", "b")].append(368.0)
    v = judge(_results(values))
    assert not v.suspects
    assert plan.followups(v, list("abcd"), 5) == []


def test_a_lone_slow_pair_gets_a_third_run_and_fresh_partners() -> None:
    """a-b slow twice, a and b each met only one other partner: a third run of a-b, and a
    and b meet a node they have not met whose tests were all fine."""
    values = {("a", "b"): [200.0, 190.0], ("a", "c"): [370.0], ("b", "d"): [370.0],
              ("c", "d"): [370.0], ("e", "f"): [370.0], ("c", "e"): [370.0],
              ("d", "f"): [370.0]}  # fmt: skip
    nxt = plan.followups(judge(_results(values)), list("abcdef"), 4)
    got = {(t.nodes, t.attempt) for r in nxt for t in r}
    assert (("a", "b"), 3) in got
    fresh = {k for k, a in got if a == 1}
    assert any("a" in k for k in fresh) and any("b" in k for k in fresh)
    assert all(("a" in k) != ("b" in k) for k in fresh)  # never a-b itself


def test_a_bad_nodes_pairs_are_repeated_only_twice_not_all_in_a_row() -> None:
    nodes = [f"n{i}" for i in range(12)]
    res = []
    for t in [t for r in plan.base_plan(nodes, ["nccl"]) for t in r]:
        slow = len(t.nodes) == 2 and "n5" in t.nodes
        res.append(
            Result(
                "nccl",
                t.nodes,
                t.round,
                1,
                185.0 if slow else (370.0 if len(t.nodes) == 2 else 480.0),
            )
        )
    nxt = plan.followups(judge(res), nodes, 9)
    repeats = [t for r in nxt for t in r if t.attempt == 2]
    assert len(repeats) == plan.REPEATS_PER_NODE
    assert all("n5" in t.nodes for t in repeats)
