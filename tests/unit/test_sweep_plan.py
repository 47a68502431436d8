"""The sweep's plan: perfect matchings, few jobs, follow-ups that repeat and triangulate."""

from __future__ import annotations

import itertools
from typing import Any

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


def test_rounds_per_node_count() -> None:
    """Every pair for up to 6 nodes (an odd count takes one round more: a bye each round),
    5 rounds beyond; none for fewer than 2 nodes."""
    assert [plan.default_rounds(n) for n in range(9)] == [0, 0, 1, 3, 3, 5, 5, 5, 5]


def test_the_matchings_of_four_and_three_nodes_exactly() -> None:
    assert plan.matching_rounds(list("abcd"), 10) == [
        [("a", "d"), ("b", "c")], [("a", "c"), ("b", "d")], [("a", "b"), ("c", "d")]
    ]  # fmt: skip  # at most N - 1 rounds, each pair named in order
    assert plan.matching_rounds(list("abc"), 10) == [[("b", "c")], [("a", "c")], [("a", "b")]]


def test_the_base_plan_exactly() -> None:
    assert plan.base_plan(["c", "a", "b", "a"], ["nccl", "ib"], rounds=1) == [
        [Planned(("a",), 0, 1, ("nccl",)), Planned(("b",), 0, 1, ("nccl",)),
         Planned(("c",), 0, 1, ("nccl",))],
        [Planned(("b", "c"), 1, 1, ("nccl", "ib"))],
    ]  # fmt: skip
    assert plan.base_plan(["c", "a", "b"], ["ib"]) == [
        [Planned(("b", "c"), 1, 1, ("ib",))], [Planned(("a", "c"), 2, 1, ("ib",))],
        [Planned(("a", "b"), 3, 1, ("ib",))],
    ]  # fmt: skip


def test_pack_keeps_each_jobs_tests_and_attempt() -> None:
    jobs = [Planned(("a", "b"), 0, 2, ("ib",)), Planned(("a", "c"), 0, 1, ("nccl", "ib"))]
    assert plan.pack(jobs, 4) == [
        [Planned(("a", "b"), 4, 2, ("ib",))], [Planned(("a", "c"), 5, 1, ("nccl", "ib"))]
    ]  # fmt: skip


S, F = 100.0, 392.0  # slow and fine against the pinned reference


def _next(values: dict[tuple[str, ...], list[float | None]], test: str = "nccl") -> list[list[Any]]:
    res = [Result(test, k, 1, a, v) for k, vs in values.items() for a, v in enumerate(vs, 1)]
    verdict = judge(res, pinned={f"{test}.pair": F})
    nodes = sorted({n for k in values for n in k})
    return [[(t.nodes, t.round, t.attempt, t.tests) for t in r]
            for r in plan.followups(verdict, nodes, 7)]  # fmt: skip


def test_endpoints_of_a_slow_pair_meet_the_least_loaded_fresh_nodes() -> None:
    values: dict[tuple[str, ...], list[float | None]] = {
        ("a", "b"): [S], ("c", "d"): [F], ("e", "f"): [F], ("g", "h"): [F]
    }  # fmt: skip
    assert _next(values, "ib") == [
        [(("a", "b"), 7, 2, ("ib",))],
        [(("a", "c"), 8, 1, ("ib",)), (("b", "d"), 8, 1, ("ib",))],  # c taken: d for b
    ]


# a-b slow twice; whether a third run comes depends on whether a already looks bad: slow with
# 2 or more partners and with more than half of those it met (a failed pair counts as slow)
OTHERS: dict[tuple[str, ...], list[float | None]] = {
    ("b", "f"): [F], ("b", "g"): [F], ("b", "h"): [F], ("c", "d"): [F], ("e", "f"): [F],
    ("g", "h"): [F],
}  # fmt: skip


@pytest.mark.parametrize(
    ("a_met", "expected"),
    [
        ({("a", "c"): [S], ("a", "d"): [F]},  # 2 of 3: looks bad, no third run
         [[(("a", "c"), 7, 2, ("nccl",))], [(("c", "e"), 8, 1, ("nccl",))]]),
        ({("a", "c"): [S], ("a", "d"): [F], ("a", "e"): [F]},  # 2 of 4: not
         [[(("a", "b"), 7, 3, ("nccl",)), (("c", "e"), 7, 1, ("nccl",))],
          [(("a", "c"), 8, 2, ("nccl",))]]),
        ({("a", "c"): [S]},  # 2 of 2
         [[(("a", "c"), 7, 2, ("nccl",))],
          [(("a", "d"), 8, 1, ("nccl",)), (("c", "e"), 8, 1, ("nccl",))]]),
        ({},  # 1 of 1: too few to look bad
         [[(("a", "b"), 7, 3, ("nccl",))], [(("a", "c"), 8, 1, ("nccl",))]]),
        ({("a", "c"): [None], ("a", "d"): [F]}, []),  # failed counts as slow
    ],
)  # fmt: skip
def test_a_confirmed_slow_pair_runs_a_third_time_unless_a_node_of_it_looks_bad(
    a_met: dict[tuple[str, ...], list[float | None]], expected: list[list[Any]]
) -> None:
    assert _next({("a", "b"): [S, S], **a_met, **OTHERS}) == expected


def test_a_bad_nodes_other_pairs_wait_once_two_were_repeated() -> None:
    nodes = [f"n{i}" for i in range(12)]
    res = [
        Result("nccl", t.nodes, t.round, 1,
               (185.0 if "n5" in t.nodes else 370.0) if len(t.nodes) == 2 else 480.0)
        for r in plan.base_plan(nodes, ["nccl"]) for t in r
    ]  # fmt: skip
    first = plan.followups(judge(res), nodes, 9)
    assert [[(t.nodes, t.attempt) for t in r] for r in first] == [
        [(("n0", "n5"), 2)], [(("n10", "n5"), 2)]
    ]  # fmt: skip
    res += [Result("nccl", t.nodes, t.round, t.attempt, 185.0) for r in first for t in r]
    assert plan.followups(judge(res), nodes, 12) == []  # its case is made
    assert [(s.kind, s.nodes) for s in judge(res).suspects] == [("node", ("n5",))]


def test_the_sweep_loop_round_by_round() -> None:
    from tests.support.sweep_fabric import Fabric

    fabric = Fabric(["n1", "n2", "n3", "n4"], noise=0.0, glitch=0.0, node_spread=0.0)
    fabric.link_fault[("n1", "n2")] = 0.5
    lines: list[str] = []
    d = plan.drive(fabric.nodes, ["nccl"], None, fabric.measure, judge, lines.append)
    assert lines == [
        "round 0: 4 job(s), alone", "round 1: 2 job(s), pairs", "round 2: 2 job(s), pairs",
        "round 3: 2 job(s), pairs", "round 4: 1 job(s), pairs", "round 5: 1 job(s), pairs",
    ]  # fmt: skip
    assert (d.jobs, d.rounds) == (12, 6)
    assert [(r.nodes, r.round, r.attempt) for r in d.results][-3:] == [
        (("n3", "n4"), 3, 1), (("n1", "n2"), 4, 2), (("n1", "n2"), 5, 3)
    ]  # fmt: skip
    assert [(s.kind, s.nodes) for s in d.verdict.suspects] == [("link", ("n1", "n2"))]
    one = plan.drive(fabric.nodes, ["nccl"], 1, fabric.measure, judge)
    assert (one.jobs, one.rounds) == (6, 2)  # the rounds asked for, nothing slow
    empty = plan.drive(["n1"], ["ib"], None, fabric.measure, judge)
    assert (empty.jobs, empty.rounds, empty.verdict.inconclusive) == (0, 0, "no test ran")


def _next_all(values: dict[tuple[str, ...], list[float | None]], nodes: list[str],
              tests: tuple[str, ...] = ("nccl",)) -> list[list[Any]]:  # fmt: skip
    res = [Result(t, k, 1, a, v) for t in tests for k, vs in values.items()
           for a, v in enumerate(vs, 1)]  # fmt: skip
    verdict = judge(res, pinned={f"{t}.pair": F for t in tests})
    return [[(t.nodes, t.attempt, t.tests) for t in r] for r in plan.followups(verdict, nodes, 7)]


def test_each_endpoint_of_a_slow_pair_is_considered_on_its_own() -> None:
    """a met 3 partners (enough), b one: b alone gets a fresh partner; likewise when a has
    no fresh node left to meet."""
    enough = {("a", "b"): [S], ("a", "c"): [F], ("a", "d"): [F], ("c", "d"): [F], ("e", "f"): [F]}
    none_left = {("a", "b"): [S], ("a", "c"): [F]}
    for values, nodes in ((enough, list("abcdef")), (none_left, list("abc"))):
        assert _next_all(values, nodes) == [
            [(("a", "b"), 2, ("nccl",))], [(("b", "c"), 1, ("nccl",))]
        ]  # fmt: skip


def test_a_node_that_sat_out_every_round_is_a_fresh_partner() -> None:
    res = [Result("nccl", (n,), 0, 1, 480.0) for n in "abc"]  # one round of 3: a sits out
    res.append(Result("nccl", ("b", "c"), 1, 1, S))
    got = plan.followups(judge(res, pinned={"nccl.pair": F}), list("abc"), 2)
    assert [[(t.nodes, t.attempt) for t in r] for r in got] == [
        [(("a", "b"), 1)], [(("a", "c"), 1)], [(("b", "c"), 2)]
    ]  # fmt: skip


def test_fresh_partners_per_test_never_meet_twice_and_spread_the_load() -> None:
    two_tests = _next_all({("a", "b"): [S], ("c", "d"): [F]}, list("abcd"), ("ib", "nccl"))
    assert two_tests == [
        [(("a", "b"), 2, ("ib", "nccl"))],
        [(("a", "c"), 1, ("ib",)), (("b", "d"), 1, ("ib",))],
        [(("a", "d"), 1, ("nccl",)), (("b", "c"), 1, ("nccl",))],  # not c and d again
    ]
    four = _next_all({("a", "b"): [S], ("c", "d"): [S], ("e", "f"): [F]}, list("abcdef"))
    assert four[1:] == [
        [(("a", "e"), 1, ("nccl",)), (("b", "f"), 1, ("nccl",))],
        [(("c", "e"), 1, ("nccl",)), (("d", "f"), 1, ("nccl",))],  # e and f twice each
    ]


def test_a_repeat_of_a_node_alone_does_not_count_against_its_pairs() -> None:
    nodes = [f"n{i}" for i in range(8)]
    res = [
        Result("nccl", t.nodes, t.round, 1,
               (185.0 if "n5" in t.nodes else 370.0) if len(t.nodes) == 2
               else (240.0 if t.nodes == ("n5",) else 480.0))
        for r in plan.base_plan(nodes, ["nccl"]) for t in r
    ]  # fmt: skip
    got = plan.followups(judge(res), nodes, 9)
    assert [[(t.nodes, t.attempt) for t in r] for r in got] == [
        [(("n0", "n5"), 2)], [(("n1", "n5"), 2)], [(("n5",), 2)]
    ]  # fmt: skip
