"""The task-level straggler: the rank the others wait for.

In data-parallel training every rank finishes a step together (the gradient all-reduce
waits for the last one), so the time between two ``job.step()`` calls is the same on every
rank and says nothing about who is slow. What differs is where the time went: the slow rank
computes (or waits for its data) longer and then finds its peers already in the all-reduce,
so its measured communication time is short, while the fast ranks sit in the all-reduce
waiting for it. A rank's *own* time per step is therefore its step time minus its
communication time (data waiting counts as its own: a slow loader on one node is a
straggler too). Without communication times (a job that reports none) the own time is the
step time, which is right for ranks that do not synchronise.

A rank is a straggler when the median of its own time over at least ``min_steps`` steps is
above ``factor`` x the median of the other ranks' medians (so most of its steps were slow,
not one), by at least ``min_excess_s``. Pure: per-rank step records in, stragglers out; the
sidecar judges the ranks of its node, the report may judge all ranks of a job keyed by
``(node, rank)``.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from slurmhealth.checks.straggler import peer_medians

K = TypeVar("K", bound=Hashable)  # a rank, or (node, rank) across a job

# own time above this x the peers' median: two ranks sharing a busy node's cores differ by
# 30% without either being a straggler (seen on the local cluster's CPU DDP runs)
FACTOR = 1.5
MIN_STEPS = 10  # steps with a step time a rank needs before it is judged
MIN_EXCESS_S = 0.001  # and at least this much slower (timer noise on millisecond steps)


class StepLike(Protocol):
    """What is read of a step record (``slurmhealth.sidecar.task.StepRecord`` fits)."""

    @property
    def step_seconds(self) -> float | None: ...
    @property
    def comm_seconds(self) -> float | None: ...
    @property
    def data_wait_seconds(self) -> float | None: ...


@dataclass(frozen=True)
class RankStraggler(Generic[K]):
    rank: K
    own_seconds: float  # median own time per step (step time - communication)
    peers_median: float  # median of the other ranks' median own times
    steps: int  # steps judged
    cause: str  # "data" when its extra time was mostly waiting for data, else "compute"

    @property
    def text(self) -> str:
        return (
            f"rank {self.rank} is the straggler: {self.own_seconds:.3g} s of its own work per "
            f"step against {self.peers_median:.3g} s on the other ranks "
            f"({self.own_seconds / self.peers_median:.2g}x, over {self.steps} steps; "
            f"{'waiting for data' if self.cause == 'data' else 'compute'}), "
            "the others wait for it in the all-reduce"
        )


def own_seconds(record: StepLike) -> float | None:
    """Step time minus communication time (never below 0); ``None`` without a step time."""
    if record.step_seconds is None:
        return None
    return max(record.step_seconds - (record.comm_seconds or 0.0), 0.0)


def rank_stragglers(
    steps: Mapping[K, Sequence[StepLike]],
    factor: float = FACTOR,
    min_steps: int = MIN_STEPS,
    min_excess_s: float = MIN_EXCESS_S,
) -> list[RankStraggler[K]]:
    """The ranks whose median own time is above ``factor`` x their peers' (see the module
    docstring). Needs two ranks with ``min_steps`` timed steps each; in the order of
    ``steps``."""
    medians: dict[K, float] = {}
    waits: dict[K, float] = {}
    counts: dict[K, int] = {}
    for rank, records in steps.items():
        own = [s for r in records if (s := own_seconds(r)) is not None]
        if len(own) >= min_steps:
            medians[rank] = float(statistics.median(own))
            counts[rank] = len(own)
            waits[rank] = float(statistics.median(r.data_wait_seconds or 0.0 for r in records))
    out = []
    for rank, peers in peer_medians(medians).items():
        mine = medians[rank]
        if peers > 0 and mine > factor * peers and mine - peers >= min_excess_s:
            extra_wait = waits[rank] - _peer_wait(waits, rank)
            cause = "data" if extra_wait > (mine - peers) / 2 else "compute"
            out.append(RankStraggler(rank, mine, peers, counts[rank], cause))
    return out


def _peer_wait(waits: Mapping[K, float], rank: K) -> float:
    return float(statistics.median(v for k, v in waits.items() if k != rank))
