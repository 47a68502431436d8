"""A recording Slurm backend: the project's SlurmBackend interface over an in-memory cluster.

Used by the hook decision tests (tests/unit/test_hooks_decisions.py) and the
detection-quality benchmark (benchmarks/detection_quality.py): it answers node lists and
reasons from data, records every drain and resume, and fails on demand.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from slurmhealth.slurm import Job, NodeInfo, SlurmError

JOB = "4242"
CTLD_DOWN = "Unable to contact slurm controller (connect failure)"


class RecordingSlurm:
    """Answers ``nodes()``/``job()`` from data, records ``drain``/``resume`` calls (and
    applies them to its table), and raises :class:`SlurmError` for the method names in
    ``fail``. ``clock`` stamps a drain's reason time (a simulated clock in the benchmark)."""

    def __init__(
        self,
        nodes: Iterable[NodeInfo],
        *,
        fail: Iterable[str] = (),
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.table = {n.name: n for n in nodes}
        self.fail = set(fail)  # method names that raise SlurmError
        self.drains: list[tuple[str, str]] = []
        self.resumes: list[str] = []
        self.jobs = {JOB: Job(JOB, user="alice", account="physics", qos="normal")}
        self.clock = clock

    def _maybe_fail(self, call: str) -> None:
        if call in self.fail:
            raise SlurmError(f"{call}: {CTLD_DOWN}")

    def nodes(self) -> list[NodeInfo]:
        self._maybe_fail("nodes")
        return list(self.table.values())

    def drain(self, node: str, reason: str) -> None:
        self.drains.append((node, reason))
        self._maybe_fail("drain")
        self.table[node] = NodeInfo(node, "drained", reason, "root", self.clock())

    def resume(self, node: str) -> None:
        self.resumes.append(node)
        self._maybe_fail("resume")
        self.table[node] = NodeInfo(node, "idle")

    def job(self, job_id: str) -> Job | None:
        self._maybe_fail("job")
        return self.jobs.get(job_id)

    def with_timeout(self, timeout_s: float) -> RecordingSlurm:
        return self

    def show_job(self, job_id: str) -> dict[str, str]:
        return {}
