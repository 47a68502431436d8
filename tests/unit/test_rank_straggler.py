"""The task-level straggler: the rank its peers wait for in the all-reduce."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from slurmhealth.checks.rank_straggler import rank_stragglers
from slurmhealth.sidecar.task import StepRecord, TaskReader


def ddp_steps(
    own: float,
    step: float,
    n: int = 20,
    data: float = 0.0,
    jitter: float = 0.0,
    rank: int = 0,
    seed: int = 0,
) -> list[StepRecord]:
    """Synchronised steps: every rank's step takes ``step``; what is not its own work it
    spends waiting in the all-reduce."""
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        mine = own * (1 + rnd.uniform(-jitter, jitter))
        out.append(
            StepRecord(
                ts=1e9 + i,
                rank=rank,
                step=i + 1,
                step_seconds=step,
                comm_seconds=step - mine,
                data_wait_seconds=data,
            )
        )
    return out


def test_the_rank_the_others_wait_for_is_named() -> None:
    # rank 2 computes 0.35 s, the others 0.2 s; all steps take 0.37 s
    steps = {
        r: ddp_steps(0.35 if r == 2 else 0.2, 0.37, jitter=0.05, rank=r, seed=r) for r in range(4)
    }
    got = rank_stragglers(steps)
    assert [s.rank for s in got] == [2]
    assert got[0].cause == "compute"
    assert 1.5 < got[0].own_seconds / got[0].peers_median < 2.0
    assert "rank 2" in got[0].text


def test_two_ranks_on_a_busy_node_30_percent_apart_name_nobody() -> None:
    steps = {0: ddp_steps(0.069, 0.18, rank=0), 1: ddp_steps(0.089, 0.18, rank=1)}
    assert rank_stragglers(steps) == []


def test_equal_step_times_alone_never_name_anyone() -> None:
    steps = {r: ddp_steps(0.2, 0.32, jitter=0.1, rank=r, seed=r) for r in range(8)}
    assert rank_stragglers(steps) == []


def test_a_slow_data_loader_is_the_cause() -> None:
    steps = {0: ddp_steps(0.2, 0.4, data=0.01), 1: ddp_steps(0.35, 0.4, data=0.16)}
    got = rank_stragglers(steps)
    assert [(s.rank, s.cause) for s in got] == [(1, "data")]


def test_a_few_slow_steps_are_not_persistent() -> None:
    slow = ddp_steps(0.2, 0.32)
    slow[:5] = ddp_steps(0.31, 0.32, n=5)  # 5 of 20 steps slow: the median stays 0.2
    assert rank_stragglers({0: slow, 1: ddp_steps(0.2, 0.32)}) == []


def test_too_few_steps_or_ranks_are_not_judged() -> None:
    assert rank_stragglers({0: ddp_steps(0.2, 0.3, n=9), 1: ddp_steps(0.1, 0.3, n=9)}) == []
    assert rank_stragglers({0: ddp_steps(0.2, 0.3)}) == []


def test_without_comm_times_step_time_is_compared() -> None:
    def plain(step: float) -> list[StepRecord]:
        return [StepRecord(ts=1e9 + i, rank=0, step=i + 1, step_seconds=step) for i in range(12)]

    got = rank_stragglers({("n1", 0): plain(0.1), ("n1", 1): plain(0.1), ("n2", 0): plain(0.2)})
    assert [s.rank for s in got] == [("n2", 0)]


def test_timer_noise_on_tiny_steps_is_ignored() -> None:
    steps = {0: ddp_steps(0.0004, 0.001), 1: ddp_steps(0.0008, 0.001)}
    assert rank_stragglers(steps) == []
    assert [s.rank for s in rank_stragglers(steps, min_excess_s=0.0001)] == [1]


def test_from_the_task_channel_files(tmp_path: Path) -> None:
    """What the sidecar reads from the ranks' step files is what the rule judges."""
    for rank in range(3):
        own = 0.3 if rank == 1 else 0.1
        lines = [
            json.dumps(
                {
                    "ts": 1e9 + i,
                    "rank": rank,
                    "step": i + 1,
                    "step_seconds": 0.35,
                    "comm_seconds": 0.35 - own,
                    "data_wait_seconds": 0.001,
                }
            )
            for i in range(15)
        ]
        (tmp_path / f"steps-{rank}.jsonl").write_text("\n".join(lines) + "\n")
    reader = TaskReader(str(tmp_path), None, 3, uid=os.getuid())
    assert reader.read(now=1e9 + 20) is not None
    assert sorted(reader.rank_steps()) == [0, 1, 2]
    assert [s.rank for s in rank_stragglers(reader.rank_steps())] == [1]
