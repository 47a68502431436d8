"""Counter rates need evidence: NVLink, PCIe replay and correctable ECC rates are judged over
a minimum window and a minimum count, with the counters remembered across runs."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from slurmhealth.checks import CheckContext, catalog, run_checks, window_of
from slurmhealth.checks.counters import FORGET_S, counters_of, load, pack, remember
from slurmhealth.model import Action, Finding, GpuState, GpuStatus, Severity
from tests.unit.test_checks import TS, healthy_gpu, node, of, only, with_link

WINDOW = window_of()


class Node:
    """One node checked run after run, its counter history kept as the prolog keeps it
    (JSON in the history's key-value table)."""

    def __init__(self, settings: dict[str, dict[str, float]] | None = None) -> None:
        self.stored: Any = None
        self.settings = settings or {}

    def run(self, t: float, *gpus: GpuState) -> list[Finding]:
        snap = node(*gpus, ts=TS + t)
        history = load(self.stored)
        findings = run_checks(CheckContext(snap, counter_history=history), self.settings)
        self.stored = json.loads(
            json.dumps(pack(remember(history, snap, window_of(self.settings))))
        )
        return findings


def replays(n: int, link: int = 4) -> GpuState:
    return with_link(healthy_gpu(2), link, replay_errors=n)


def test_one_replay_between_runs_5_s_apart_never_fails() -> None:
    gpu = Node()
    assert gpu.run(0, replays(10)) == []  # the epilog
    f = only(gpu.run(5, replays(11)), "nvlink_errors")  # the next prolog
    assert (f.severity, f.action) == (Severity.INFO, Action.RECORD)  # recorded, no bundle
    assert f.evidence["window_s"] == pytest.approx(5.0) and f.evidence["failing"] == []
    assert "judged from 300 s and 5 errors" in f.message


def test_one_replay_over_a_long_window_is_below_the_minimum_count() -> None:
    gpu = Node()
    gpu.run(0, replays(0))
    f = only(gpu.run(600, replays(1)), "nvlink_errors")
    assert f.severity is Severity.INFO


def test_a_handful_of_replays_in_a_short_window_warns_without_failing() -> None:
    gpu = Node()
    gpu.run(0, replays(10))
    f = only(gpu.run(5, replays(16)), "nvlink_errors")  # 6 replays in 5 s: a burst
    assert (f.severity, f.action, f.failing) == (Severity.WARN, Action.WARN, False)


def test_sustained_replays_fail_once_the_window_is_covered() -> None:
    gpu = Node()
    verdicts = [gpu.run(t, replays(2 * t // 60)) for t in range(0, 420, 60)]  # 2/min
    severities = [max((f.severity for f in run), default=Severity.OK) for run in verdicts]
    # 2 and 4 replays: fewer than min_count (5), recorded; 6 and 8: warned; then judged
    assert (
        severities
        == [Severity.OK] + [Severity.INFO] * 2 + [Severity.WARN] * 2 + [Severity.FAIL] * 2
    )
    f = only(verdicts[5], "nvlink_errors")  # t=300: 10 replays over 300 s
    assert (f.gpu, f.evidence["link"], f.evidence["failing"]) == (2, 4, ["replay"])
    assert f.evidence["replay_per_min"] == pytest.approx(2.0)
    assert f.evidence["window_s"] == pytest.approx(300.0)


def test_window_spans_prolog_job_epilog_and_next_prolog() -> None:
    gpu = Node()
    gpu.run(0, replays(0))  # prolog
    assert of(gpu.run(3600, replays(120)), "nvlink_errors")[0].failing  # epilog: 2/min
    again = only(gpu.run(3605, replays(121)), "nvlink_errors")  # next prolog, 5 s later
    assert again.failing and again.evidence["window_s"] == pytest.approx(3605.0)


def test_recovery_errors_fail_when_sustained() -> None:
    gpu = Node()
    gpu.run(0, with_link(healthy_gpu(2), 0, recovery_errors=0))
    f = only(gpu.run(600, with_link(healthy_gpu(2), 0, recovery_errors=12)), "nvlink_errors")
    assert f.failing and f.evidence["recovery_per_min"] == pytest.approx(1.2)


def crc(flit: int, data: int = 0) -> GpuState:
    return with_link(healthy_gpu(2), 5, crc_flit_errors=flit, crc_data_errors=data)


def test_crc_burst_warns_but_never_fails() -> None:
    gpu = Node()
    gpu.run(0, crc(0))
    gpu.run(600, crc(0))  # quiet for ten minutes
    burst = only(gpu.run(605, crc(9000, 1000)), "nvlink_errors")  # 10,000 in 5 s
    assert (burst.severity, burst.evidence["crc_per_s"]) == (
        Severity.WARN,
        pytest.approx(16.53, abs=0.01),
    )
    assert gpu.run(1000, crc(9000, 1000)) == []  # the burst is older than the window now


def test_crc_flood_sustained_over_the_window_fails() -> None:
    gpu = Node()
    gpu.run(0, crc(0))
    f = only(gpu.run(300, crc(50_000, 10_000)), "nvlink_errors")  # 200/s for 5 minutes
    assert f.failing and f.evidence["failing"] == ["crc"]
    assert f.evidence["crc_per_s"] == pytest.approx(200.0)


def test_window_and_count_are_thresholds_a_site_can_set() -> None:
    short = Node({"nvlink_errors": {"min_window_s": 60, "min_count": 2}})
    short.run(0, replays(10))
    assert only(short.run(60, replays(12)), "nvlink_errors").failing
    loose = Node({"nvlink_errors": {"replay_per_min": 5}})
    loose.run(0, replays(0))
    assert only(loose.run(600, replays(20)), "nvlink_errors").severity is Severity.WARN


@pytest.mark.parametrize("name", ["nvlink_errors", "pcie_replay", "ecc_correctable"])
def test_every_rate_check_shows_its_window_and_count(name: str) -> None:
    thresholds = catalog()[name].thresholds
    assert thresholds["min_window_s"] >= 60 and thresholds["min_count"] >= 1


def test_counters_that_went_back_start_a_new_window() -> None:
    gpu = Node()
    gpu.run(0, replays(500))
    assert gpu.run(600, replays(0)) == []  # driver reload: the counter restarted
    assert gpu.run(620, replays(3)) != []  # growth since the restart only: a warning
    assert not gpu.run(620, replays(3))[0].failing


def test_no_history_and_clock_going_back_judge_nothing() -> None:
    assert Node().run(0, replays(1000)) == []
    gpu = Node()
    gpu.run(0, replays(0))
    assert gpu.run(-60, replays(1000)) == []


def test_history_of_an_older_format_or_damaged_starts_empty() -> None:
    empty = {"v": 2, "gpus": {}}
    assert load({"ts": TS, "gpus": {"GPU-x": {"4.replay_errors": 3}}}) == empty  # format 1
    assert load("junk") == load(None) == empty
    good = {"span": [TS, TS + 60], "quiet": {"a": 4}, "rings": {"b": [[TS, 1], [TS + 9, 2]]}}
    damaged = {"v": 2, "gpus": {"x": {"rings": {"a": [["?", 1]]}}, "y": good, "z": 7}}
    assert load(damaged) == {  # the damaged GPUs dropped
        "v": 2,
        "gpus": {"y": {"a": [[TS, 4], [TS + 60, 4]], "b": [[TS, 1], [TS + 9, 2]]}},
    }


def test_stored_history_keeps_quiet_counters_as_one_value() -> None:
    history = load(None)
    for t in (0, 60, 120):
        remember(history, node(replays(t // 60), count=3, ts=TS + t), WINDOW)
    stored = pack(history)
    gpu = stored["gpus"][healthy_gpu(2).uuid]
    assert gpu["span"] == [TS, TS + 120] and gpu["quiet"]["nvlink.4.crc"] == 0
    assert list(gpu["rings"]) == ["nvlink.4.replay"]  # the one counter that moved
    assert load(json.loads(json.dumps(stored))) == history


def test_ring_stays_small_when_sampled_every_second() -> None:
    history = load(None)
    for t in range(0, 3600):
        remember(history, node(replays(t // 7), count=3, ts=TS + t), WINDOW)
    ring = history["gpus"][healthy_gpu(2).uuid]["nvlink.4.replay"]
    assert len(ring) <= 10
    assert ring[0][0] <= TS + 3599 - WINDOW < ring[1][0]  # still reaches back a full window
    quiet = history["gpus"][healthy_gpu(2).uuid]["nvlink.0.replay"]
    assert len(quiet) == 2


def test_counters_of_keys_by_uuid_link_and_counter() -> None:
    link = with_link(healthy_gpu(1), 4, replay_errors=9, crc_flit_errors=2, crc_data_errors=1)
    gpu = replace(link, pcie_replay_errors=7, ecc_volatile_correctable=3)
    counters = counters_of(node(gpu))[gpu.uuid or ""]
    assert counters["nvlink.4.replay"] == 9 and counters["nvlink.4.crc"] == 3
    assert counters["pcie_replay"] == 7 and counters["ecc_correctable"] == 3
    assert len(counters) == 18 * 3 + 2


def pcie(n: int) -> GpuState:
    return replace(healthy_gpu(6), pcie_replay_errors=n)


def test_pcie_replays_warn_only_when_sustained_above_dcgm_rate() -> None:
    burst = Node()
    burst.run(0, pcie(0))
    assert burst.run(5, pcie(40)) == []  # 5 s of evidence
    gpu = Node()
    gpu.run(0, pcie(0))
    f = only(gpu.run(600, pcie(100)), "pcie_replay")  # 10/min for ten minutes
    assert (f.severity, f.gpu, f.evidence["per_min"]) == (Severity.WARN, 6, pytest.approx(10.0))
    slow = Node()
    slow.run(0, pcie(0))
    assert slow.run(600, pcie(50)) == []  # 5/min: below 8/min


def ecc(n: int) -> GpuState:
    return replace(healthy_gpu(3), ecc_volatile_correctable=n)


def test_correctable_ecc_trickle_is_silent_a_sustained_rate_warns() -> None:
    gpu = Node()
    gpu.run(0, ecc(0))
    assert gpu.run(3600, ecc(60)) == []  # one a minute for an hour
    f = only(gpu.run(3900, ecc(60 + 3000)), "ecc_correctable")  # 600/min over 5 minutes
    assert f.severity is Severity.WARN and f.action is Action.WARN


def test_what_is_stored_of_each_gpus_counters() -> None:
    """Counters quiet over the GPU's common span as one value; one read is quiet too; a
    counter that grew, or was quiet over another span, as its ring."""
    history = {"v": 2, "gpus": {
        "g1": {"a": [[10.0, 5], [20.0, 5]], "b": [[10.0, 1], [20.0, 3]],
               "c": [[15.0, 7], [20.0, 7]]},
        "g2": {"x": [[30.0, 2]]},
        "g3": {"m": [[10.0, 1], [20.0, 2]]},
    }}  # fmt: skip
    assert pack(history) == {"v": 2, "gpus": {
        "g1": {"span": [10.0, 20.0], "quiet": {"a": 5},
               "rings": {"b": [[10.0, 1], [20.0, 3]], "c": [[15.0, 7], [20.0, 7]]}},
        "g2": {"span": [30.0, 30.0], "quiet": {"x": 2}, "rings": {}},
        "g3": {"span": [], "quiet": {}, "rings": {"m": [[10.0, 1], [20.0, 2]]}},
    }}  # fmt: skip
    assert load(pack(history)) == history
    assert pack({}) == {"v": 2, "gpus": {}}


def test_a_sites_longer_window_is_kept_in_the_history() -> None:
    """min_window_s 900: the history reaches back 900 s, so a sustained rate fails at 900 s."""
    assert window_of({"nvlink_errors": {"min_window_s": 900}}) == 900.0
    rates = [n for n, spec in catalog().items() if "min_window_s" in spec.thresholds]
    assert window_of({n: {"min_window_s": 0} for n in rates}) == 0.0
    gpu = Node({"nvlink_errors": {"min_window_s": 900}})
    runs = [gpu.run(t, replays(2 * t // 60)) for t in range(0, 960, 300)]  # 2/min
    f = only(runs[-1], "nvlink_errors")
    assert f.failing and f.evidence["window_s"] == pytest.approx(900.0)


def test_a_gpu_without_counters_is_judged_without_them() -> None:
    bare = replace(healthy_gpu(3), nvlinks=None, pcie_replay_errors=None,
                   ecc_volatile_correctable=None)  # fmt: skip
    snap = node(bare, count=4)
    assert healthy_gpu(3).uuid not in counters_of(snap)
    assert run_checks(CheckContext(snap, counter_history=load(None))) == []


def test_the_window_starts_at_the_newest_read_old_enough() -> None:
    """Reads at 0, 300 and 600 s: the read exactly min_window_s old starts the window."""
    gpu = Node()
    gpu.run(0, replays(0))
    gpu.run(300, replays(10))
    f = only(gpu.run(600, replays(20)), "nvlink_errors")
    assert (f.evidence["window_s"], f.evidence["counts"]) == (pytest.approx(300.0), {"replay": 10})


def test_a_counter_no_longer_read_judges_nothing() -> None:
    gpu = Node()
    gpu.run(0, pcie(0))
    assert gpu.run(600, replace(pcie(0), pcie_replay_errors=None)) == []


def test_a_counters_ring_read_after_read() -> None:
    """Window 300 s (points closer than 37.5 s merge): what the history holds of one counter
    after each read: growth, a run of equal reads, the window's start, the clock going back,
    a second read of the same time, times kept to the millisecond."""
    history = load(None)
    steps = [
        (0, 0, [[0, 0]]),
        (10, 1, [[0, 0], [10, 1]]),
        (20, 2, [[0, 0], [20, 2]]),  # 20 s after the point before the last: merged into it
        (37.5, 3, [[0, 0], [20, 2], [37.5, 3]]),  # 37.5 s (window / 8) after it: a point
        (40, 4, [[0, 0], [20, 2], [40, 4]]),
        (80, 4, [[0, 0], [20, 2], [40, 4], [80, 4]]),
        (100, 4, [[0, 0], [20, 2], [40, 4], [100, 4]]),  # the run of 4s grows
        (380, 5, [[40, 4], [100, 4], [380, 5]]),  # points older than the window go
        (390, 6, [[40, 4], [100, 4], [380, 5], [390, 6]]),
        (395, 5, [[395, 5]]),  # the counter went back (a reset): a new window
        (400, 5, [[395, 5], [400, 5]]),
        (410, 7, [[395, 5], [410, 7]]),
        (420, 7, [[395, 5], [420, 7]]),
        (419, 7, [[419, 7]]),  # the clock went back
        (419, 8, [[419, 7], [419, 8]]),  # a second read of the same time
        (420.123456, 9, [[419, 7], [420.123, 9]]),  # times to the millisecond
        (421, 8, [[421, 8]]),
        (425, 9, [[421, 8], [425, 9]]),
        (500, 10, [[421, 8], [425, 9], [500, 10]]),
        (501, 9, [[501, 9]]),  # back to the middle point's value: still a reset
        (540, 10, [[501, 9], [540, 10]]),
        (600, 11, [[501, 9], [540, 10], [600, 11]]),
        (840, 12, [[540, 10], [600, 11], [840, 12]]),  # the next point exactly 300 s old
        (850, 12, [[540, 10], [600, 11], [840, 12], [850, 12]]),
        (845, 12, [[845, 12]]),  # the clock went back, the value unchanged
        (900, 12, [[845, 12], [900, 12]]),
        (900, 12, [[845, 12], [900, 12]]),  # the same read again
    ]
    for ts, value, ring in steps:
        snap = replace(node(count=0), ts=ts)
        remember(history, snap, 300.0, counters={"g": {"k": value}})
        assert history["gpus"]["g"]["k"] == ring, (ts, value)


def test_a_gpu_not_read_for_30_days_is_forgotten() -> None:
    now = TS + 100 * 86400
    history = load({"v": 2, "gpus": {
        "kept": {"span": [], "quiet": {}, "rings": {"k": [[now - FORGET_S, 1]]}},
        "gone": {"span": [], "quiet": {}, "rings": {"k": [[now - FORGET_S - 1, 1]]}},
        "empty": {"span": [], "quiet": {}, "rings": {}},
    }})  # fmt: skip
    remember(history, replace(node(count=0), ts=now), 300.0)
    assert sorted(history["gpus"]) == ["kept"]


def test_counters_only_of_readable_gpus_with_a_uuid_and_crc_only_when_read() -> None:
    no_uuid = replace(healthy_gpu(0), uuid=None)
    lost = replace(healthy_gpu(1), status=GpuStatus.LOST)
    no_crc = with_link(healthy_gpu(2), 4, crc_flit_errors=None, crc_data_errors=None)
    counters = counters_of(node(no_uuid, lost, no_crc, count=4))
    assert sorted(counters) == [healthy_gpu(2).uuid, healthy_gpu(3).uuid]
    mine = counters[healthy_gpu(2).uuid or ""]
    assert "nvlink.4.crc" not in mine and "nvlink.4.replay" in mine and "nvlink.3.crc" in mine


def test_growth_needs_time_between_reads() -> None:
    """Two reads of the same second judge nothing; half a second apart they warn."""
    gpu = Node()
    gpu.run(0, replays(0))
    assert gpu.run(0, replays(6)) == []
    gpu = Node()
    gpu.run(0, replays(0))
    f = only(gpu.run(0.5, replays(6)), "nvlink_errors")
    assert (f.severity, f.evidence["window_s"]) == (Severity.WARN, 0.5)
