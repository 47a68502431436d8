"""A simulated fabric for the pairwise sweep, and a fake Slurm that runs sweep jobs on it.

``Fabric`` gives each test a bandwidth: a base (nccl-tests all_reduce busbw of H100 nodes,
as the recorded outputs in tests/fixtures/baseline: 480 GB/s alone, 370 GB/s across two
nodes) times each node's own spread, times the faults the test meets, times run-to-run
noise, with now and then a transient dip (congestion from other jobs). Used by the unit
tests and benchmarks/sweep_sim.py.

``FakeBatchSlurm`` is the recording Slurm backend plus ``submit``/``job_states``/``cancel``:
a submitted job "runs" for ``polls`` state queries, then its output file holds what the
job script would have printed (the recorded nccl-tests output with its bandwidths scaled
to the fabric's value), marker lines included.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from slurmhealth.slurm import BatchJob, NodeInfo, SlurmError
from slurmhealth.sweep.model import Planned, Result, unit_key
from tests.support.recording_slurm import RecordingSlurm

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "baseline"
INTRA_BASE = 480.0
PAIR_BASE = 370.0


@dataclass
class Fabric:
    nodes: list[str]
    rng: random.Random = field(default_factory=lambda: random.Random(1))
    noise: float = 0.03  # run-to-run spread (sd, as a share)
    node_spread: float = 0.01  # node-to-node spread of healthy nodes
    glitch: float = 0.01  # chance of a transient dip to 50-80 %
    node_fault: dict[str, float] = field(default_factory=dict)  # NIC side: pairs only
    intra_fault: dict[str, float] = field(default_factory=dict)  # NVLink: alone (and pairs)
    link_fault: dict[tuple[str, ...], float] = field(default_factory=dict)
    own: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.own = {n: self.rng.gauss(1.0, self.node_spread) for n in self.nodes}

    def factor(self, nodes: tuple[str, ...]) -> float:
        """The faults and node spread a test on ``nodes`` meets (no noise)."""
        f = min(self.own[n] for n in nodes)
        for n in nodes:
            f *= self.intra_fault.get(n, 1.0) if len(nodes) == 1 else 1.0
            f *= self.node_fault.get(n, 1.0) if len(nodes) == 2 else 1.0
        return f * self.link_fault.get(unit_key(nodes), 1.0)

    def value(self, nodes: tuple[str, ...]) -> float:
        base = INTRA_BASE if len(nodes) == 1 else PAIR_BASE
        v = base * self.factor(nodes) * self.rng.gauss(1.0, self.noise)
        if self.rng.random() < self.glitch:
            v *= self.rng.uniform(0.5, 0.8)
        return max(v, 0.01)

    def measure(self, batch: list[Planned]) -> list[Result]:
        return [
            Result("nccl", t.nodes, t.round, t.attempt, round(self.value(t.nodes), 2),
                   "all_reduce_perf.busbw@8589934592", f"{t.round}.{i}")
            for i, t in enumerate(batch)
        ]  # fmt: skip


def nccl_output(nodes: tuple[str, ...], factor: float) -> str:
    """The recorded nccl-tests output (1x8 alone, 2x8 for two nodes), bandwidths scaled."""
    name = "nccl_all_reduce_1x8.txt" if len(nodes) == 1 else "nccl_all_reduce_2x8.txt"
    out = []
    for line in (FIXTURES / name).read_text().splitlines():
        cells = line.split()
        if len(cells) == 13 and cells[0].isdigit():
            for i in (6, 7, 10, 11):
                cells[i] = f"{float(cells[i]) * factor:.2f}"
            line = "  ".join(cells)
        elif "Avg bus bandwidth" in line:
            line = f"# Avg bus bandwidth    : {float(line.split()[-1]) * factor:.4f}"
        out.append(line)
    return "\n".join(out) + "\n"


class FakeBatchSlurm(RecordingSlurm):
    """Sweep jobs on a :class:`Fabric` (factors only, no noise): see the module doc.
    ``refuse``: node sets whose submission fails; ``hang``: node sets that never leave
    PENDING; ``broken``: node sets whose job prints an NCCL failure instead."""

    def __init__(
        self,
        fabric: Fabric,
        *,
        polls: int = 1,
        refuse: Iterable[tuple[str, ...]] = (),
        hang: Iterable[tuple[str, ...]] = (),
        broken: Iterable[tuple[str, ...]] = (),
        switches: dict[str, str] | None = None,
    ) -> None:
        super().__init__(NodeInfo(n, "idle") for n in fabric.nodes)
        self.fabric = fabric
        self.polls = polls
        self.refuse, self.hang, self.broken = set(refuse), set(hang), set(broken)
        self.switches = switches or {}
        self.submitted: list[BatchJob] = []
        self.left: dict[str, int] = {}
        self.jobs_of: dict[str, BatchJob] = {}
        self.cancelled: list[str] = []
        self.most_at_once = 0

    def submit(self, job: BatchJob) -> str:
        key = unit_key(job.nodes)
        if key in self.refuse:
            raise SlurmError("sbatch: error: Batch job submission failed: Invalid node name")
        job_id = str(1000 + len(self.submitted))
        self.submitted.append(job)
        self.jobs_of[job_id] = job
        self.left[job_id] = 10**9 if key in self.hang else self.polls
        self.most_at_once = max(self.most_at_once, len(self.left))
        return job_id

    def job_states(self, job_ids: list[str]) -> dict[str, str]:
        out = {}
        for job_id in job_ids:
            if job_id not in self.left:
                continue
            self.left[job_id] -= 1
            if self.left[job_id] > 0:
                out[job_id] = "PENDING" if self.left[job_id] > 10**8 else "RUNNING"
                continue
            del self.left[job_id]
            self._write(job_id, self.jobs_of[job_id])
            out[job_id] = "COMPLETED"
        return out

    def cancel(self, job_ids: list[str]) -> None:
        self.cancelled += job_ids
        for job_id in job_ids:
            self.left.pop(job_id, None)

    def leaf_switches(self) -> dict[str, str]:
        return dict(self.switches)

    def _write(self, job_id: str, job: BatchJob) -> None:
        key = unit_key(job.nodes)
        body = nccl_output(key, self.fabric.factor(key))
        if key in self.broken:
            body = "NCCL failure common.cu:1067 'unhandled system error'\n"
        text = (f"### slurmhealth-sweep test=nccl nodes={' '.join(key)}\n{body}"
                "### slurmhealth-sweep end test=nccl rc=0\n")  # fmt: skip
        Path(re.sub("%j", job_id, job.output)).write_text(text)
