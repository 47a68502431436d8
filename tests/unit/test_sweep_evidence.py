"""The sweep's verdict as `slurmhealth sweep --json` writes it (Verdict.to_dict): each
suspect's summary, confidence and evidence rows exactly, the references, every unit's row,
tests merged per suspect, switch paths, and why a sweep names nobody."""

from __future__ import annotations

from typing import Any

import pytest

from slurmhealth.sweep.model import Result
from slurmhealth.sweep.verdict import judge

BUSBW = "all_reduce_perf.busbw@8589934592"


def row(
    test: str,
    nodes: tuple[str, ...],
    values: list[float | None],
    value: float | None,
    reference: float | None,
    ratio: float | None,
    status: str,
    **kw: Any,
) -> dict[str, Any]:
    """A unit's evidence row as the JSON carries it."""
    return {"test": test, "nodes": list(nodes), "value": value,
            "unit": {"nccl": "GB/s", "ib": "Gb/s"}[test], "reference": reference, "ratio": ratio,
            "status": status, "attempts": len(values), "values": values,
            "job_ids": kw.get("job_ids", []), "errors": kw.get("errors", []),
            "hcas": kw.get("hcas", {})}  # fmt: skip


def nccl(nodes: tuple[str, ...], attempt: int, value: float | None, **kw: Any) -> Result:
    return Result("nccl", nodes, attempt, attempt, value, **kw)


def test_a_node_slow_with_both_its_partners_is_named_with_every_row() -> None:
    res = [nccl((n,), 1, 200.0, metric=BUSBW, job_id=f"1{i}") for i, n in enumerate(THREE)]
    for a in (1, 2):  # the slow pairs repeated: confirmed
        res += [nccl(("n2", "n1"), a, 50.0, job_id=f"2{a}"),
                nccl(("n2", "n3"), a, 40.0 + a, job_id=f"3{a}")]  # fmt: skip
    res.append(nccl(("n1", "n3"), 1, 100.0, job_id="41"))
    slow12 = row("nccl", ("n1", "n2"), [50.0, 50.0], 50.0, 100.0, 0.5, "slow",
                 job_ids=["21", "22"])  # fmt: skip
    slow23 = row("nccl", ("n2", "n3"), [41.0, 42.0], 41.5, 100.0, 0.415, "slow",
                 job_ids=["31", "32"])  # fmt: skip
    assert judge(res).to_dict() == {
        "suspects": [{
            "kind": "node", "nodes": ["n2"], "tests": ["nccl"], "confidence": 0.67,
            "summary": "n2: slow with 2 of 2 partners "
            "(n1 50.0 GB/s = 50% of 100.0, n3 41.5 GB/s = 42% of 100.0)",
            "evidence": {"pairs": [slow12, slow23]},
        }],
        "inconclusive": None,
        # pairs: the median of each node's best pair (n1 100, n2 50, n3 100)
        "references": {"nccl.intra": 200.0, "nccl.pair": 100.0},
        "units": [
            *(row("nccl", (n,), [200.0], 200.0, 200.0, 1.0, "ok", job_ids=[f"1{i}"])
              for i, n in enumerate(THREE)),
            slow12,
            row("nccl", ("n1", "n3"), [100.0], 100.0, 100.0, 1.0, "ok", job_ids=["41"]),
            slow23,
        ],
    }  # fmt: skip


THREE = ("n1", "n2", "n3")


def _ib(nodes: tuple[str, ...], attempt: int, value: float | None, slow_hca: float = 391.0,
        **kw: Any) -> Result:  # fmt: skip
    return Result("ib", nodes, 1, attempt, value, hcas={"mlx5_0": 392.0, "mlx5_3": slow_hca}, **kw)


def test_a_slow_link_names_its_hca_switches_and_the_partners_each_node_was_fine_with() -> None:
    res = [_ib(("a", "b"), k, 190.0 + k, 190.0 + k, job_id=f"j{k}") for k in (1, 2)]
    res += [_ib(p, 1, 392.0) for p in (("a", "c"), ("b", "d"), ("c", "d"), ("a", "d"))]
    res += [Result("ib", ("b", "c"), 2, 1, None, error="job 9 TIMEOUT"),
            Result("ib", ("b", "c"), 3, 2, 392.0)]  # fmt: skip  # slow once: flaky, fine
    verdict = judge(res, switches={"a": "leaf1", "b": "leaf2", "c": "leaf1"})
    hcas = {"mlx5_0": 392.0, "mlx5_3": 391.0}
    pair = row("ib", ("a", "b"), [191.0, 192.0], 191.5, 392.0, 0.489, "slow",
               job_ids=["j1", "j2"], hcas={"mlx5_0": 392.0, "mlx5_3": 191.0})  # fmt: skip
    fine = {p: row("ib", p, [392.0], 392.0, 392.0, 1.0, "ok", hcas=hcas)
            for p in (("a", "c"), ("a", "d"), ("b", "d"), ("c", "d"))}  # fmt: skip
    flaky = row("ib", ("b", "c"), [None, 392.0], 392.0, 392.0, 1.0, "flaky",
                errors=["job 9 TIMEOUT"])  # fmt: skip
    (s,) = verdict.to_dict()["suspects"]
    assert s == {
        "kind": "link", "nodes": ["a", "b"], "tests": ["ib"], "confidence": 1.0,
        "summary": "link a-b HCA mlx5_3 (switches leaf1 - leaf2): 191.5 Gb/s = 49% of 392.0; "
        "a fine with 2, b with 2 other partners",
        "evidence": {
            "pair": pair,
            "pairs": [pair, fine[("a", "c")], fine[("a", "d")], flaky, fine[("b", "d")]],
            "hcas": {"mlx5_3": 191.0, "mlx5_0": 392.0},  # slowest first
            "switches": {"a": "leaf1", "b": "leaf2"},
        },
    }  # fmt: skip
    assert verdict.references == {"ib.pair": 392.0}
    assert verdict.to_dict()["units"][-3:] == [flaky, fine[("b", "d")], fine[("c", "d")]]


def test_a_link_on_one_switch_and_one_without_switches_or_hcas() -> None:
    res = [Result("ib", ("a", "b"), 1, k, 100.0) for k in (1, 2)]
    res += [Result("ib", p, 1, 1, 392.0) for p in (("a", "c"), ("b", "d"), ("c", "d"), ("a", "d"))]
    (s,) = judge(res, switches={"a": "leaf1", "b": "leaf1"}).suspects
    assert s.summary.startswith("link a-b (switch leaf1): 100.0 Gb/s = 26% of 392.0;")
    (bare,) = judge(res).suspects
    assert bare.summary.startswith("link a-b: 100.0 Gb/s")
    assert "hcas" not in bare.evidence and "switches" not in bare.evidence
    (half,) = judge(res, switches={"b": "leaf2"}).suspects  # one node's switch known
    assert half.evidence["switches"] == {"a": None, "b": "leaf2"}
    assert half.summary.startswith("link a-b: ")


def test_a_link_seen_once_is_less_sure_and_one_without_fine_partners_may_be_the_node() -> None:
    res = [Result("nccl", ("a", "b"), 1, 1, 100.0)]
    res += [Result("nccl", p, 1, 1, 392.0) for p in (("a", "c"), ("b", "d"), ("c", "d"))]
    (once,) = judge(res).suspects
    assert once.confidence == 0.35  # 2 fine partners of 4 wanted, x 0.7 unconfirmed
    assert once.summary.endswith("a fine with 1, b with 1 other partners")
    lone = [Result("nccl", ("a", "b"), 1, k, 100.0) for k in (1, 2)]
    lone += [Result("nccl", p, 1, 1, 392.0) for p in (("b", "c"), ("b", "d"), ("c", "d"))]
    (s,) = judge(lone).suspects
    assert s.summary.endswith("a fine with 0, b with 2 other partners; a met no other partner "
                              "that was fine: may be the node")  # fmt: skip
    assert s.confidence == 0.25  # 2 of 4, halved


def test_slow_pairs_between_two_leaf_switches_name_the_path() -> None:
    switches = {"a1": "leaf1", "a2": "leaf1", "b1": "leaf2", "b2": "leaf2", "c": "leaf3"}
    values = {("a1", "b1"): 100.0, ("a2", "b2"): 100.0, ("a1", "b2"): 392.0,
              ("a2", "b1"): 392.0, ("a1", "a2"): 392.0, ("b1", "b2"): 392.0,
              ("a1", "c"): 392.0, ("b2", "c"): 392.0, ("a2", "c"): 392.0}  # fmt: skip
    res = [Result("ib", p, 1, k, v) for p, v in values.items() for k in (1, 2)]
    found = {s.nodes: s for s in judge(res, switches=switches).suspects}
    assert sorted(found) == [("a1", "b1"), ("a2", "b2")]
    s = found[("a1", "b1")]
    assert s.evidence["switch_path"] == {"switches": ["leaf1", "leaf2"], "slow_pairs": 2,
                                         "pairs_tested": 4}  # fmt: skip
    assert s.summary.endswith("; 2 of 4 pairs tested between leaf1 and leaf2 slow: the switch path")
    assert s.summary.startswith("link a1-b1 (switches leaf1 - leaf2): 100.0 Gb/s")
    assert (s.tests, s.confidence) == (("ib",), 1.0)
    half = {n: switches[n] for n in ("a1", "a2")}  # the other ends' switches unknown: no path
    assert all("switch_path" not in x.evidence for x in judge(res, switches=half).suspects)
    alone = {p: v for p, v in values.items() if p != ("a2", "b2")}  # one slow pair: its cable
    res = [Result("ib", p, 1, k, v) for p, v in alone.items() for k in (1, 2)]
    (one,) = judge(res, switches=switches).suspects
    assert "switch_path" not in one.evidence and "the switch path" not in one.summary


def test_slow_pairs_within_one_leaf_name_it_once() -> None:
    switches = dict.fromkeys(("a", "b", "c", "d", "e", "f"), "leaf1")
    slow = {("a", "b"), ("c", "d")}
    pairs = [(x, y) for x in "abcdef" for y in "abcdef" if x < y]
    res = [Result("ib", p, 1, k, 100.0 if p in slow else 392.0) for p in pairs for k in (1, 2)]
    for s in judge(res, switches=switches).suspects:
        assert s.summary.endswith("; 2 of 15 pairs tested between leaf1 slow: the switch path")


def test_a_node_slow_alone_is_named_with_its_pairs() -> None:
    res = [nccl((n,), 1, 100.0 if n == "n2" else 200.0) for n in THREE]
    res.append(nccl(("n2",), 2, 90.0))
    res += [nccl(p, 1, 392.0) for p in (("n1", "n2"), ("n1", "n3"), ("n2", "n3"))]
    (s,) = judge(res).to_dict()["suspects"]
    assert (s["kind"], s["nodes"], s["tests"], s["confidence"]) == ("intra", ["n2"], ["nccl"], 0.9)
    assert s["summary"] == "n2 alone: 95.0 GB/s = 48% of 200.0 (NVLink/GPUs)"
    assert s["evidence"]["unit"] == row("nccl", ("n2",), [100.0, 90.0], 95.0, 200.0, 0.475, "slow")
    assert [p["nodes"] for p in s["evidence"]["pairs"]] == [["n1", "n2"], ["n2", "n3"]]
    res.remove(nccl(("n2",), 2, 90.0))
    (once,) = judge(res).suspects
    assert once.confidence == 0.6  # slow in its only attempt


def test_a_node_accused_in_two_tests_is_one_suspect_over_both() -> None:
    res = []
    for test in ("ib", "nccl"):
        for a in (1, 2):
            res += [Result(test, ("n1", "n2"), 1, a, 50.0), Result(test, ("n2", "n3"), 1, a, 50.0)]
        res.append(Result(test, ("n1", "n3"), 1, 1, 100.0))
    (s,) = judge(res).suspects
    assert (s.kind, s.nodes, s.tests, s.confidence) == ("node", ("n2",), ("ib", "nccl"), 0.67)
    assert s.summary == (
        "n2: slow with 2 of 2 partners (n1 50.0 Gb/s = 50% of 100.0, n3 50.0 Gb/s = 50% of "
        "100.0); n2: slow with 2 of 2 partners (n1 50.0 GB/s = 50% of 100.0, n3 50.0 GB/s = "
        "50% of 100.0)"
    )
    assert sorted(s.evidence) == ["nccl.pairs", "pairs"]
    assert [u.test for u in judge(res).units] == ["ib"] * 3 + ["nccl"] * 3
    assert [p["test"] for p in s.evidence["pairs"]] == ["ib", "ib"]
    assert [p["test"] for p in s.evidence["nccl.pairs"]] == ["nccl", "nccl"]


def test_suspects_are_listed_most_confident_first_then_node_before_link() -> None:
    res = [nccl((n,), a, 100.0 if n == "n5" else 200.0) for n in ("n1", "n5") for a in (1, 2)]
    nodes = ["n1", "n2", "n3", "n4", "n5"]
    pairs = [(x, y) for x in nodes for y in nodes if x < y]
    slow = {("n1", "n2"), ("n1", "n3"), ("n1", "n4"), ("n2", "n3")}
    res += [nccl(p, a, 50.0 if p in slow else 392.0) for p in pairs for a in (1, 2)]
    assert [(s.kind, s.nodes, s.confidence) for s in judge(res).suspects] == [
        ("node", ("n1",), 1.0), ("link", ("n2", "n3"), 1.0), ("intra", ("n5",), 0.9)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("failed", "inconclusive"),
    [
        (3, "3 of 5 tests measured nothing: the test program or the job setup, not the nodes "
            "(see the errors)"),
        (2, None),  # 2 of 5: not most
    ],
)  # fmt: skip
def test_most_tests_measuring_nothing_is_the_tool(failed: int, inconclusive: str | None) -> None:
    units = [("n1",), ("n2",), ("n3",), ("n1", "n2"), ("n2", "n3")]
    res = [
        nccl(u, 1, None if i < failed else 300.0, error="no output") for i, u in enumerate(units)
    ]
    got = judge(res).to_dict()
    assert got["inconclusive"] == inconclusive
    if inconclusive:
        assert got["suspects"] == []
    half = judge(res[1:] if failed == 3 else res[:2] + res[3:])  # 2 of 4 failed: not most
    assert half.inconclusive == "" and len(half.units) == 4


def test_no_test_and_no_reference_are_said() -> None:
    assert judge([]).inconclusive == "no test ran"
    lone = judge([nccl(("n1",), 1, 300.0)])
    assert lone.inconclusive == "no reference: no test measured a bandwidth"
    assert lone.references == {}


@pytest.mark.parametrize(("slow_nodes", "fleet_wide"), [(3, True), (2, False)])
def test_suspects_holding_most_nodes_are_a_fabric_wide_fault(
    slow_nodes: int, fleet_wide: bool
) -> None:
    nodes = [f"n{i}" for i in range(1, 5)]
    res = [nccl((n,), a, 100.0 if i < slow_nodes else 300.0, metric=BUSBW)
           for i, n in enumerate(nodes) for a in (1, 2)]  # fmt: skip
    v = judge(res, pinned={BUSBW: 300.0})
    if fleet_wide:
        assert v.inconclusive == (
            "3 of 4 nodes look slow: a fabric-wide fault or a wrong reference, not single nodes"
        )
        assert v.suspects == ()
    else:
        assert not v.inconclusive and [s.nodes for s in v.suspects] == [("n1",), ("n2",)]


def pairs_at(
    slow: set[tuple[str, str]], pairs: list[tuple[str, str]], attempts: int = 2
) -> list[Result]:
    return [
        nccl(p, a, 100.0 if p in slow else 392.0) for p in pairs for a in range(1, attempts + 1)
    ]


def test_the_node_with_the_largest_share_of_slow_partners_is_accused_first() -> None:
    """A is slow with both its partners, B with 3 of 4 (one of them A): A first, then B on
    the pairs A does not explain (2 of 3). By count alone B would go first and leave A with
    one slow pair: a link."""
    pairs = [("A", "B"), ("A", "C"), ("B", "D"), ("B", "E"), ("B", "F"), ("C", "G"), ("D", "H"),
             ("E", "I"), ("F", "J"), ("G", "H"), ("I", "J"), ("C", "D"), ("E", "F"), ("G", "I"),
             ("H", "J")]  # fmt: skip
    v = judge(pairs_at({("A", "B"), ("A", "C"), ("B", "D"), ("B", "E")}, pairs))
    assert [(s.kind, s.nodes, s.confidence) for s in v.suspects] == [
        ("node", ("A",), 0.67), ("node", ("B",), 0.44)
    ]  # fmt: skip
    assert v.suspects[1].summary.startswith("B: slow with 2 of 3 partners (D 100.0 GB/s")
    leaves = {n: "leaf1" for p in pairs for n in p}  # node suspects name no switch path
    with_switches = judge(pairs_at({("A", "B"), ("A", "C"), ("B", "D"), ("B", "E")}, pairs),
                          switches=leaves)  # fmt: skip
    assert with_switches.suspects == v.suspects


def test_of_equal_shares_the_node_with_more_slow_partners_is_accused_first() -> None:
    pairs = [("A", "B"), ("A", "C"), ("B", "D"), ("B", "E"), ("C", "G"), ("D", "H"), ("E", "I"),
             ("F", "J"), ("G", "H"), ("I", "J"), ("C", "D"), ("E", "F"), ("G", "I"), ("H", "J"),
             ("F", "G")]  # fmt: skip
    v = judge(pairs_at({("A", "B"), ("A", "C"), ("B", "D"), ("B", "E")}, pairs))
    assert [(s.kind, s.nodes) for s in v.suspects] == [("node", ("B",)), ("link", ("A", "C"))]


def test_a_node_slow_with_half_its_partners_is_not_accused() -> None:
    pairs = [("n1", "n2"), ("n1", "n3"), ("n1", "n4"), ("n1", "n5"), ("n2", "n3"), ("n4", "n5"),
             ("n2", "n4"), ("n3", "n5"), ("n1", "n6"), ("n2", "n6")]  # fmt: skip
    v = judge(pairs_at({("n1", "n2"), ("n1", "n3")}, pairs))
    assert [(s.kind, s.nodes) for s in v.suspects] == [
        ("link", ("n1", "n2")),
        ("link", ("n1", "n3")),
    ]
    four = judge(pairs_at({("n1", "n2"), ("n1", "n3")}, pairs[:-2]))  # 2 of 4 exactly
    assert {s.kind for s in four.suspects} == {"link"}
    link = v.suspects[0]  # n1's other slow pair is no fine partner; 3 + 3 fine ones: sure
    assert link.summary.endswith("n1 fine with 3, n2 with 3 other partners")
    assert link.confidence == 1.0


def test_a_node_confirmed_on_one_slow_pair_of_two_is_less_sure() -> None:
    res = [nccl(("n1", "n2"), a, 100.0) for a in (1, 2)]
    res += [nccl(("n1", "n3"), 1, 100.0), nccl(("n2", "n3"), 1, 392.0),
            nccl(("n3", "n4"), 1, 392.0), nccl(("n2", "n4"), 1, 392.0)]  # fmt: skip
    (s,) = judge(res).suspects
    assert (s.kind, s.nodes, s.confidence) == ("node", ("n1",), 0.47)  # 2/3 x 0.7


def test_a_node_slow_with_four_partners_is_certain() -> None:
    nodes = [f"n{i}" for i in range(1, 9)]
    pairs = [(a, b) for a in nodes for b in nodes if a < b and (a != "n1" or b <= "n5")]
    (s,) = judge(pairs_at({("n1", n) for n in ("n2", "n3", "n4", "n5")}, pairs)).suspects
    assert (s.nodes, s.confidence) == (("n1",), 1.0)


def test_one_slow_partner_is_enough_where_the_site_says_so() -> None:
    res = [nccl(("n1", "n2"), a, 100.0) for a in (1, 2)] + [nccl(("n3", "n4"), 1, 392.0)]
    res += [nccl(("n3", "n5"), 1, 392.0)]
    found = {s.nodes: s.kind for s in judge(res, min_partners=1).suspects}
    assert found == {("n1",): "node"}  # the first by name of two equal candidates


def test_a_unit_at_exactly_the_slow_fraction_is_fine() -> None:
    res = [nccl(("a", "b"), 1, 85.0), nccl(("c", "d"), 1, 100.0), nccl(("a", "c"), 1, 100.0)]
    units = {u.nodes: u.status for u in judge(res, pinned={"nccl.pair": 100.0}).units}
    assert units[("a", "b")] == "ok"
    res[0] = nccl(("a", "b"), 1, 84.99)
    assert {u.nodes: u.status for u in judge(res, pinned={"nccl.pair": 100}).units}[
        ("a", "b")
    ] == "slow"


@pytest.mark.parametrize(("pinned", "reference"), [(0, 100.0), (0.5, 0.5), (-3, 100.0)])
def test_only_a_positive_pinned_value_is_a_reference(pinned: float, reference: float) -> None:
    res = [nccl(p, 1, 100.0) for p in (("a", "b"), ("c", "d"), ("a", "c"))]
    assert judge(res, pinned={"nccl.pair": pinned}).references["nccl.pair"] == reference


def test_values_of_zero_or_less_are_left_out_of_the_reference() -> None:
    res = [nccl(p, 1, v) for p, v in ((("a", "b"), 0.0), (("c", "d"), 0.5), (("a", "c"), 0.7))]
    # b measured only 0: no typical value; a 0.7, c its best 0.7, d 0.5 (values below 1 count)
    assert judge(res).references == {"nccl.pair": 0.7}
    negative = judge([nccl(p, 1, -1.0) for p in (("a", "b"), ("c", "d"))])
    assert (negative.references, negative.inconclusive) == (
        {}, "no reference: no test measured a bandwidth"
    )  # fmt: skip


def test_a_failed_node_alone_measured_nothing() -> None:
    res = [nccl(("n1",), 1, 200.0), nccl(("n3",), 1, 200.0)]
    res += [nccl(("n2",), a, None, error="timeout") for a in (1, 2)]
    res += [nccl(p, 1, 392.0) for p in (("n1", "n3"), ("n1", "n4"), ("n3", "n4"))]
    (s,) = judge(res).suspects
    assert (s.kind, s.summary, s.confidence) == (
        "intra",
        "n2 alone: measured nothing (NVLink/GPUs)",
        0.9,
    )
    assert s.evidence["unit"]["errors"] == ["timeout", "timeout"]


def test_a_value_is_shown_to_three_places() -> None:
    res = [
        nccl(p, 1, v)
        for p, v in ((("a", "b"), 123.45678), (("c", "d"), 100.0), (("a", "c"), 100.0))
    ]
    row_ab = judge(res, pinned={"nccl.pair": 100.0}).to_dict()["units"][0]
    assert (row_ab["value"], row_ab["values"], row_ab["ratio"]) == (123.457, [123.457], 1.235)


def test_a_test_without_a_known_unit_shows_none() -> None:
    values = {("a", "b"): 50.0, ("c", "d"): 100.0, ("a", "c"): 100.0, ("b", "d"): 100.0}
    res = [Result("gpuburn", p, 1, 1, v) for p, v in values.items()]
    v = judge(res)
    assert {u["unit"] for u in v.to_dict()["units"]} == {""}
    (s,) = v.suspects
    assert s.summary.startswith("link a-b: 50.0  = 50% of 100.0;")


def test_partners_and_touched_nodes_of_a_verdict() -> None:
    res = [nccl(("n1",), 1, 100.0), nccl(("n1", "n2"), 1, 100.0), nccl(("n2", "n3"), 1, 392.0),
           nccl(("n3", "n4"), 1, None), nccl(("n1", "n3"), 1, 392.0)]  # fmt: skip
    v = judge(res)
    assert v.partners() == {"n1": {"n2", "n3"}, "n2": {"n1", "n3"}, "n3": {"n1", "n2", "n4"},
                            "n4": {"n3"}}  # fmt: skip
    assert v.touched() == {"n1", "n2", "n3", "n4"}  # slow n1-n2, failed n3-n4
    assert judge(res[1:3] + res[4:]).touched() == {"n1", "n2"}


def test_a_node_with_four_partners_or_more_is_typically_its_median_pair() -> None:
    values = {("a", "b"): 300.0, ("a", "c"): 310.0, ("a", "d"): 320.0, ("a", "e"): 330.0,
              ("b", "c"): 340.0, ("b", "d"): 350.0, ("b", "e"): 360.0, ("c", "d"): 370.0,
              ("c", "e"): 380.0, ("d", "e"): 390.0}  # fmt: skip
    # each node's median of 4 (315, 345, 355, 360, 370), not its best (330 ... 390)
    assert judge([nccl(p, 1, v) for p, v in values.items()]).references == {"nccl.pair": 355.0}


def test_pairs_a_node_alone_explains_are_left_out_of_another_nodes_case() -> None:
    pairs = [("n1", "n2"), ("n2", "n3"), ("n2", "n4"), ("n1", "n4"), ("n3", "n4"), ("n4", "n5"),
             ("n1", "n3"), ("n1", "n5"), ("n3", "n5"), ("n5", "n6"), ("n1", "n6"),
             ("n3", "n6")]  # fmt: skip
    slow = {("n1", "n2"), ("n2", "n3"), ("n2", "n4"), ("n1", "n4"), ("n3", "n4"), ("n4", "n5")}
    res = [nccl((n,), a, 100.0 if n == "n2" else 200.0) for n in ("n1", "n2", "n3") for a in (1, 2)]
    res += pairs_at(slow, pairs)
    v = judge(res)
    assert [(s.kind, s.nodes, s.confidence) for s in v.suspects] == [
        ("node", ("n4",), 1.0), ("intra", ("n2",), 0.9)
    ]  # fmt: skip  # no link: n2's slow pairs are n2's
    assert v.suspects[0].summary.startswith("n4: slow with 3 of 3 partners (n1 ")
    assert [p["nodes"] for p in v.suspects[0].evidence["pairs"]] == [
        ["n1", "n4"], ["n3", "n4"], ["n4", "n5"]
    ]  # fmt: skip


def test_equal_confidence_lists_intra_before_node_before_link() -> None:
    pairs = [("a", "b"), ("a", "c"), ("a", "d"), ("a", "e"), ("a", "f"), ("b", "c"), ("d", "e"),
             ("f", "z"), ("b", "z"), ("c", "d"), ("e", "f")]  # fmt: skip
    res = [nccl((n,), 1, 100.0 if n == "z" else 200.0) for n in ("a", "z", "b")]
    res += pairs_at({("a", "b"), ("a", "c"), ("a", "d")}, pairs)
    assert [(s.kind, s.nodes, s.confidence) for s in judge(res).suspects] == [
        ("intra", ("z",), 0.6), ("node", ("a",), 0.6)
    ]  # fmt: skip
    pairs = [("n1", "z"), ("n2", "z"), ("n3", "z"), ("a", "b"), ("a", "c"), ("a", "d"), ("b", "c"),
             ("b", "d"), ("c", "n1"), ("d", "n2"), ("a", "n3"), ("n1", "n2")]  # fmt: skip
    slow = {("n1", "z"), ("n2", "z"), ("n3", "z"), ("a", "b")}
    assert [(s.kind, s.nodes, s.confidence) for s in judge(pairs_at(slow, pairs)).suspects] == [
        ("node", ("z",), 1.0), ("link", ("a", "b"), 1.0)
    ]  # fmt: skip


def test_an_unconfirmed_link_with_few_fine_partners_and_a_pair_alone() -> None:
    res = [nccl(("a", "b"), 1, 100.0)]
    res += [nccl(p, 1, 392.0) for p in (("a", "c"), ("b", "d"), ("b", "e"), ("c", "d"))]
    (s,) = judge(res).suspects
    assert s.confidence == 0.52  # 3 of 4 fine partners x 0.7, to two places
    two = judge([nccl(("a", "b"), a, 100.0) for a in (1, 2)], pinned={"nccl.pair": 392.0})
    assert two.suspects[0].summary == (
        "link a-b: 100.0 GB/s = 26% of 392.0; a fine with 0, b with 0 other partners; a, b met "
        "no other partner that was fine: may be the node"
    )
