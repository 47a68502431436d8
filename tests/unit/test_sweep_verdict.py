"""The sweep's verdict: node, link or intra suspect from the pair table, or nobody."""

from __future__ import annotations

import random

import pytest

from slurmhealth.sweep import plan
from slurmhealth.sweep.model import Result
from slurmhealth.sweep.verdict import judge
from tests.support.sweep_fabric import Fabric

THREE = ["n1", "n2", "n3"]


def _sweep(fabric: Fabric) -> plan.Driven:
    return plan.drive(fabric.nodes, ["nccl"], None, fabric.measure, lambda rs: judge(rs))


def _quiet(nodes: list[str]) -> Fabric:
    return Fabric(nodes, noise=0.0, glitch=0.0, node_spread=0.0)


def test_three_nodes_healthy_names_nobody() -> None:
    d = _sweep(_quiet(THREE))
    assert d.verdict.suspects == ()
    assert not d.verdict.inconclusive
    assert d.jobs == 6  # 3 alone, 3 pairs, nothing to repeat


def test_three_nodes_n2_slow_with_both_partners_is_the_node() -> None:
    fabric = _quiet(THREE)
    fabric.node_fault["n2"] = 0.5
    (s,) = _sweep(fabric).verdict.suspects
    assert (s.kind, s.nodes) == ("node", ("n2",))
    pairs = {tuple(p["nodes"]): p["status"] for p in s.evidence["pairs"]}
    assert pairs == {("n1", "n2"): "slow", ("n2", "n3"): "slow"}
    assert all(p["attempts"] >= 2 for p in s.evidence["pairs"])  # repeated before accused
    assert "2 of 2 partners" in s.summary


def test_three_nodes_only_n1_n3_slow_is_the_link_not_a_node() -> None:
    fabric = _quiet(THREE)
    fabric.link_fault[("n1", "n3")] = 0.5
    (s,) = _sweep(fabric).verdict.suspects
    assert (s.kind, s.nodes) == ("link", ("n1", "n3"))
    assert s.evidence["pair"]["attempts"] == 3
    assert s.evidence["pair"]["status"] == "slow"
    assert "n1 fine with 1, n3 with 1" in s.summary


def test_a_node_slow_alone_is_an_intra_suspect_and_explains_its_pairs() -> None:
    fabric = _quiet(THREE)
    fabric.intra_fault["n2"] = 0.5
    fabric.node_fault["n2"] = 0.7  # its slow NVLink shows in its pairs too
    (s,) = _sweep(fabric).verdict.suspects
    assert (s.kind, s.nodes) == ("intra", ("n2",))
    assert s.evidence["unit"]["ratio"] == pytest.approx(0.5, abs=0.01)


def test_the_reference_survives_a_bad_node_in_a_small_set() -> None:
    """Two of three pairs are slow: their median would be slow; the median of each node's
    best pair is not."""
    fabric = _quiet(THREE)
    fabric.node_fault["n2"] = 0.5
    refs = _sweep(fabric).verdict.references
    assert refs["nccl.pair"] == pytest.approx(370.0)


def test_one_dip_then_fine_is_flaky_not_a_suspect() -> None:
    res = [Result("nccl", ("n1", "n2"), 1, 1, 200.0), Result("nccl", ("n1", "n2"), 4, 2, 369.0),
           Result("nccl", ("n1", "n3"), 2, 1, 370.0),
           Result("nccl", ("n2", "n3"), 3, 1, 371.0)]  # fmt: skip
    v = judge(res)
    assert v.suspects == ()
    assert {u.nodes: u.status for u in v.units}[("n1", "n2")] == "flaky"


def test_two_nodes_cannot_tell_node_from_link_and_say_so() -> None:
    res = [Result("nccl", ("a",), 0, 1, 480.0), Result("nccl", ("b",), 0, 1, 480.0),
           Result("nccl", ("a", "b"), 1, 1, 100.0), Result("nccl", ("a", "b"), 2, 2, 100.0),
           Result("nccl", ("a", "b"), 3, 3, 100.0)]  # fmt: skip
    v = judge(res, pinned={"nccl.pair": 370.0})
    (s,) = v.suspects
    assert s.kind == "link" and "may be the node" in s.summary
    assert s.confidence < 0.5


def test_mostly_failed_tests_are_inconclusive_and_name_nobody() -> None:
    res = [Result("nccl", (n,), 0, 1, None, error="all_reduce_perf: not found") for n in THREE]
    res += [Result("nccl", ("n1", "n2"), 1, 1, 370.0)]
    v = judge(res)
    assert v.suspects == ()
    assert "measured nothing" in v.inconclusive


def test_a_fleet_wide_slowdown_with_a_pinned_reference_names_nobody() -> None:
    fabric = _quiet([f"n{i}" for i in range(8)])
    for n in fabric.nodes:
        fabric.node_fault[n] = 0.5
    d = plan.drive(fabric.nodes, ["nccl"], None, fabric.measure,
                   lambda rs: judge(rs, pinned={"nccl.pair": 370.0}))  # fmt: skip
    assert d.verdict.suspects == ()
    assert "fabric-wide" in d.verdict.inconclusive


def test_a_failed_pair_counts_as_slow_with_the_error_as_evidence() -> None:
    fabric = _quiet(THREE)
    res = _sweep(fabric).results
    res = [r if r.nodes != ("n1", "n3") else Result("nccl", r.nodes, r.round, r.attempt, None,
           error="job 7 TIMEOUT") for r in res]  # fmt: skip
    res += [Result("nccl", ("n1", "n3"), 9, a, None, error="job 8 TIMEOUT") for a in (2, 3)]
    (s,) = judge(res).suspects
    assert (s.kind, s.nodes) == ("link", ("n1", "n3"))
    assert "TIMEOUT" in s.evidence["pair"]["errors"][0]


def test_switches_and_hcas_name_the_path() -> None:
    res = [Result("ib", ("a", "b"), 1, k, 190.0, hcas={"mlx5_0": 392.0, "mlx5_3": 190.0})
           for k in (1, 2, 3)]  # fmt: skip
    res += [Result("ib", p, 1, 1, 392.0, hcas={"mlx5_0": 392.0, "mlx5_3": 392.0})
            for p in (("a", "c"), ("b", "d"), ("c", "d"), ("a", "d"), ("b", "c"))]  # fmt: skip
    (s,) = judge(res, switches={"a": "leaf1", "b": "leaf2"}).suspects
    assert s.kind == "link"
    assert "HCA mlx5_3" in s.summary and "leaf1 - leaf2" in s.summary
    assert list(s.evidence["hcas"]) == ["mlx5_3", "mlx5_0"]


@pytest.mark.parametrize("seed", range(6))
def test_noisy_64_nodes_one_bad_node_is_named_alone(seed: int) -> None:
    rng = random.Random(seed)
    nodes = [f"g{i:03d}" for i in range(64)]
    fabric = Fabric(nodes, rng=rng, noise=0.03, glitch=0.02)
    bad = rng.choice(nodes)
    fabric.node_fault[bad] = 0.6
    (s,) = _sweep(fabric).verdict.suspects
    assert (s.kind, s.nodes) == ("node", (bad,))
    assert s.confidence >= 0.9


def test_slow_pairs_sharing_a_switch_pair_name_the_switch_path() -> None:
    """Two leaf switches of 4 nodes each; the path between leaf1 and leaf2 slow for the
    pairs of its first two uplinks (a bad spine link): link suspects that name the path."""
    nodes = [f"n{i}" for i in range(8)]
    switches = {n: "leaf1" if i < 4 else "leaf2" for i, n in enumerate(nodes)}
    fabric = _quiet(nodes)
    bad = [("n0", "n5"), ("n1", "n6")]
    fabric.link_fault.update({p: 0.5 for p in bad})
    d = plan.drive(nodes, ["nccl"], 7, fabric.measure, lambda rs: judge(rs, switches=switches))
    found = sorted(s.nodes for s in d.verdict.suspects)
    assert found == bad and all(s.kind == "link" for s in d.verdict.suspects)
    for s in d.verdict.suspects:
        assert s.evidence["switch_path"]["switches"] == ["leaf1", "leaf2"]
        assert "between leaf1 and leaf2 slow: the switch path" in s.summary


def test_a_lone_pair_is_not_judged_against_itself() -> None:
    """Two nodes, one pair at half speed, nothing pinned: the pair is its own median, so it
    is left unjudged and the page says why (seen on Slurm 24.11 with n1, n2)."""
    from slurmhealth.sweep.render import verdict_lines

    res = [Result("nccl", ("a",), 0, 1, 480.0), Result("nccl", ("b",), 0, 1, 480.0),
           Result("nccl", ("a", "b"), 1, 1, 185.0)]  # fmt: skip
    v = judge(res)
    assert v.suspects == () and "nccl.pair" not in v.references
    assert {u.nodes: u.status for u in v.units}[("a", "b")] == "unjudged"
    (line,) = verdict_lines(v.to_dict())
    assert "1 test(s) not judged" in line and "baseline.pinned" in line
