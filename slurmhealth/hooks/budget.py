"""The prolog's own time budget, inside the wrapper's timeout.

The wrapper (prolog/slurmhealth-prolog) kills ``slurmhealth prolog`` after
``SLURMHEALTH_PROLOG_TIMEOUT`` seconds and fails open. A kill loses what the prolog knew:
a node found bad would run the job, and the drain row would be gone. So the prolog keeps a
budget of its own, counted from the wrapper's start (``SLURMHEALTH_PROLOG_STARTED``):
every slow step (squeue, sinfo, scontrol, the GPU snapshot, the kernel log, db waits) gets
at most what is left of it, the decision comes first and the record after, and a budget
spent before the decision is a recorded fail-open, never a wrapper kill.

Each stage is also reported to the wrapper (one line on ``SLURMHEALTH_STAGE_FD``) so a
wrapper timeout can still say how far the prolog got.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from slurmhealth.errors import SlurmhealthError
from slurmhealth.hooks.wrapper_log import STAGE_FD_ENV  # where the wrapper reads the stage
from slurmhealth.slurm import Job, NodeInfo, SlurmBackend, SlurmError

if TYPE_CHECKING:
    from slurmhealth.history import History

log = logging.getLogger("slurmhealth.hooks")

WRAPPER_TIMEOUT_ENV = "SLURMHEALTH_PROLOG_TIMEOUT"
STARTED_ENV = "SLURMHEALTH_PROLOG_STARTED"  # wrapper start, UTC seconds (date +%s.%N)
WRAPPER_MARGIN_S = 1.0  # the budget ends at least this long before the wrapper's kill
DECISION_RESERVE_S = 0.75  # inputs (squeue, snapshot, log) leave this for drain + record


class BudgetSpent(SlurmhealthError):
    """The budget ran out before the prolog could decide: it fails open and says where."""

    def __init__(self, stage: str, why: str) -> None:
        self.stage = stage
        self.why = why
        super().__init__(f"time budget spent in stage {stage!r}: {why}")


class Budget:
    """Seconds left until ``total_s`` after ``start`` on ``clock`` (monotonic seconds).

    ``report`` receives each stage name with the seconds spent so far (the wrapper's fd).
    """

    def __init__(
        self,
        total_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        start: float | None = None,
        report: Callable[[str, float], None] | None = None,
    ) -> None:
        self.total_s = total_s
        self.clock = clock
        self.start = clock() if start is None else start
        self.stage = "start"
        self._report = report

    @classmethod
    def unlimited(cls) -> Budget:
        return cls(math.inf)

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return self.total_s - self.elapsed()

    def enter(self, stage: str) -> None:
        self.stage = stage
        if self._report is not None:
            self._report(stage, self.elapsed())

    def bound(self, wanted: float, reserve: float = 0.0) -> float:
        """``wanted`` seconds, or less when the budget (keeping ``reserve``) has less."""
        return max(0.0, min(wanted, self.left() - reserve))

    def require(self, reserve: float = 0.0) -> None:
        """Raise :class:`BudgetSpent` unless more than ``reserve`` seconds are left."""
        if self.left() <= reserve:
            raise BudgetSpent(self.stage, f"{self.elapsed():.2f} s of {self.total_s:g} s used")


def _stage_writer(
    env: Mapping[str, str], also: Callable[[str, float], None] | None
) -> Callable[[str, float], None] | None:
    fd_text = env.get(STAGE_FD_ENV, "")
    if not fd_text.isdigit():
        return also
    fd = int(fd_text)

    def write(stage: str, elapsed: float) -> None:
        with contextlib.suppress(OSError):  # the wrapper's file is a courtesy, never a failure
            os.write(fd, f"{stage} {elapsed:.2f}\n".encode())
        if also is not None:
            also(stage, elapsed)

    return write


def _float(env: Mapping[str, str], key: str) -> float | None:
    try:
        value = float(env.get(key, ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def prolog_budget(
    budget_s: float,
    env: Mapping[str, str],
    also_report: Callable[[str, float], None] | None = None,
) -> Budget:
    """The prolog's budget: ``budget_s`` from the wrapper's start (or from now when run by
    hand), and never closer than :data:`WRAPPER_MARGIN_S` to the wrapper's own timeout.
    Stages go to the wrapper's fd and to ``also_report``."""
    total = budget_s
    wrapper = _float(env, WRAPPER_TIMEOUT_ENV)
    if wrapper is not None and wrapper > 0 and total > wrapper - WRAPPER_MARGIN_S:
        log.warning(
            "slurm.prolog_budget_s = %g is not under the wrapper's %s = %g: using %g",
            budget_s, WRAPPER_TIMEOUT_ENV, wrapper, max(0.5, wrapper - WRAPPER_MARGIN_S),
        )  # fmt: skip
        total = max(0.5, wrapper - WRAPPER_MARGIN_S)
    now = time.monotonic()
    started = _float(env, STARTED_ENV)
    before = min(max(0.0, time.time() - started), total) if started is not None else 0.0
    return Budget(total, start=now - before, report=_stage_writer(env, also_report))


class BoundedSlurm:
    """A Slurm backend whose every call gets at most what is left of ``budget`` (less
    ``reserve``); with nothing left the call is not made and raises :class:`SlurmError`,
    which the callers already treat as "Slurm did not answer"."""

    def __init__(self, inner: SlurmBackend, budget: Budget, reserve: float = 0.0) -> None:
        self.inner = inner
        self.budget = budget
        self.reserve = reserve

    def _slurm(self, what: str) -> SlurmBackend:
        left = self.budget.left() - self.reserve
        if left <= 0.05:
            raise SlurmError(f"{what} not run: prolog time budget spent ({self.budget.stage})")
        return self.inner.with_timeout(left)

    def with_timeout(self, timeout_s: float) -> SlurmBackend:
        return BoundedSlurm(self.inner.with_timeout(timeout_s), self.budget, self.reserve)

    def nodes(self) -> list[NodeInfo]:
        return self._slurm("sinfo").nodes()

    def drain(self, node: str, reason: str) -> None:
        self._slurm("scontrol drain").drain(node, reason)

    def resume(self, node: str) -> None:
        self._slurm("scontrol resume").resume(node)

    def job(self, job_id: str) -> Job | None:
        return self._slurm("squeue").job(job_id)

    def show_job(self, job_id: str) -> dict[str, str]:
        return self._slurm("scontrol show job").show_job(job_id)


def bound_db_wait(history: History, wait_s: float) -> None:
    """Waits on a locked history at most ``wait_s`` from now on (sqlite takes its busy
    timeout when it connects, so the connection is reopened). A write that cannot get the
    lock in time goes to the spool, which the next run ingests."""
    history.busy_timeout_ms = int(wait_s * 1000)
    history.close()
