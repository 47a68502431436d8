"""The straggler rule: one GPU of a job well below its peers while the peers are busy.

One pure function for every judgement of it (the sidecar's detector over its window, the
job report, the diagnosis rules), so they cannot disagree about what a straggler is.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from slurmhealth.config import SidecarConfig

K = TypeVar("K", bound=Hashable)  # a GPU: its index, or (node, index) across a job

RATIO = SidecarConfig.straggler_ratio  # default: below this share of the peers' median
PEERS_BUSY_PCT = 50.0  # the peers' median utilisation at least this: the job is running


@dataclass(frozen=True)
class Straggler(Generic[K]):
    gpu: K
    value: float  # the GPU's own value (mean utilisation %, power W, ...)
    peers_median: float  # the median of the other GPUs' values


def stragglers(
    values: Mapping[K, float], ratio: float = RATIO, min_peers: float = 0.0
) -> list[Straggler[K]]:
    """The GPUs whose value is below ``ratio`` x the median of the *other* GPUs' values,
    judged only where that median is at least ``min_peers`` (e.g. ``PEERS_BUSY_PCT`` for
    utilisation: an idle job has no stragglers). Needs two GPUs; in the order of ``values``."""
    medians = peer_medians(values)
    return [
        Straggler(gpu, values[gpu], median)
        for gpu, median in medians.items()
        if median >= min_peers and values[gpu] < ratio * median
    ]


def peer_medians(values: Mapping[K, float]) -> dict[K, float]:
    """Each GPU's peers' median (the median of the other GPUs' values); needs two GPUs."""
    out = {}
    for gpu in values:
        peers = [v for other, v in values.items() if other != gpu]
        if peers:
            out[gpu] = float(statistics.median(peers))
    return out
