"""The one straggler rule (sidecar detector, report, diagnosis): below ratio x the peers'
median, judged only while the peers are busy."""

from __future__ import annotations

from slurmhealth.checks.straggler import PEERS_BUSY_PCT, RATIO, Straggler, stragglers


def test_one_gpu_at_60_vs_peers_at_95_is_the_straggler() -> None:
    util = {i: 95.0 for i in range(8)} | {3: 60.0}
    assert stragglers(util, RATIO, PEERS_BUSY_PCT) == [Straggler(3, 60.0, 95.0)]


def test_close_to_the_peers_or_peers_idle_is_no_straggler() -> None:
    assert stragglers({i: 95.0 for i in range(8)} | {3: 92.0}, RATIO, PEERS_BUSY_PCT) == []
    idle = {i: 20.0 for i in range(8)} | {3: 5.0}
    assert stragglers(idle, RATIO, PEERS_BUSY_PCT) == []
    assert stragglers(idle, RATIO) == [Straggler(3, 5.0, 20.0)]  # no busy gate: judged


def test_the_gpu_itself_is_not_among_its_peers() -> None:
    # with themselves in the median (50, 50, 80, 80 -> 65) neither (50) would lag RATIO x 65 = 48.75
    values = {0: 50.0, 1: 50.0, 2: 80.0, 3: 80.0}
    assert [(s.gpu, s.peers_median) for s in stragglers(values, RATIO)] == [(0, 80.0), (1, 80.0)]


def test_needs_two_gpus_and_works_across_nodes() -> None:
    assert stragglers({0: 1.0}) == []
    job = {("n1", 0): 300.0, ("n1", 1): 650.0, ("n2", 0): 660.0, ("n2", 1): 640.0}
    assert [(s.gpu, s.peers_median) for s in stragglers(job)] == [(("n1", 0), 650.0)]
