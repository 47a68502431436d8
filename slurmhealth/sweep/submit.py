"""The sweep's jobs in Slurm: submitted with ``sbatch`` at most ``max_jobs`` at a time,
waited for with one ``squeue`` call per poll, cancelled when they outstay their deadline,
their output files read back (no symlinks, regular files only, size-capped).

Slurm's command formats stay in ``slurm/`` (``slurm/batch.py``); this module only says when
to call them. Clocks are passed in, so the waiting is tested without sleeping.
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from slurmhealth.errors import UsageError
from slurmhealth.slurm import BatchJob, SlurmError

log = logging.getLogger("slurmhealth.sweep")

MAX_OUTPUT_BYTES = 4 << 20
# squeue states of a job that has not finished its batch script yet
ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "REQUEUED",
                    "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT",
                    "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT"})  # fmt: skip


class BatchSlurm(Protocol):
    """What the sweep needs of Slurm (``slurm.SlurmCli`` has it)."""

    def submit(self, job: BatchJob) -> str: ...

    def job_states(self, job_ids: Sequence[str]) -> dict[str, str]: ...

    def cancel(self, job_ids: Sequence[str]) -> None: ...


@dataclass(frozen=True)
class Outcome:
    """A finished job: its final state as last seen (``GONE`` once squeue forgot it) and its
    output; ``error`` when it never ran to the end (submission refused, cancelled)."""

    job: BatchJob
    job_id: str
    state: str
    text: str
    error: str = ""


@dataclass
class Waiter:
    """How long to wait: each job at most its time limit plus ``max_pending_s`` in the
    queue; ``poll_s`` between squeue calls."""

    poll_s: float = 2.0
    max_pending_s: float = 600.0
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def run_jobs(
    slurm: BatchSlurm, jobs: Sequence[BatchJob], max_jobs: int, waiter: Waiter
) -> list[Outcome]:
    """Run ``jobs``, at most ``max_jobs`` in Slurm at once; one outcome per job, in order."""
    queue = list(enumerate(jobs))
    running: dict[str, tuple[int, float]] = {}  # job id -> (index, deadline)
    done: dict[int, Outcome] = {}
    try:
        while queue or running:
            while queue and len(running) < max(1, max_jobs):
                i, job = queue.pop(0)
                _submit(slurm, i, job, running, done, waiter)
            if running:
                waiter.sleep(waiter.poll_s)
                _collect(slurm, jobs, running, done, waiter)
    except BaseException:
        _cancel(slurm, list(running))  # Ctrl-C or a crash: leave no test job behind
        raise
    return [done[i] for i in range(len(jobs))]


def _submit(
    slurm: BatchSlurm,
    i: int,
    job: BatchJob,
    running: dict[str, tuple[int, float]],
    done: dict[int, Outcome],
    waiter: Waiter,
) -> None:
    try:
        job_id = slurm.submit(job)
    except SlurmError as exc:
        done[i] = Outcome(job, "", "NOT_SUBMITTED", "", f"sbatch: {exc}")
        return
    running[job_id] = (i, waiter.clock() + job.time_min * 60 + waiter.max_pending_s)
    log.info("submitted %s on %s", job_id, ",".join(job.nodes))


def _collect(
    slurm: BatchSlurm,
    jobs: Sequence[BatchJob],
    running: dict[str, tuple[int, float]],
    done: dict[int, Outcome],
    waiter: Waiter,
) -> None:
    try:
        states = slurm.job_states(list(running))
    except SlurmError as exc:
        log.warning("squeue: %s (asking again)", exc)
        return
    now = waiter.clock()
    for job_id, (i, deadline) in list(running.items()):
        state = states.get(job_id, "GONE")
        job = jobs[i]
        if state in ACTIVE and now < deadline:
            continue
        del running[job_id]
        error = ""
        if state in ACTIVE:
            _cancel(slurm, [job_id])
            error = f"job {job_id} still {state} at its deadline: cancelled"
        text = read_output(job.output.replace("%j", job_id))  # sbatch's %j: the job id
        done[i] = Outcome(job, job_id, state, text, error)


def _cancel(slurm: BatchSlurm, job_ids: list[str]) -> None:
    try:
        slurm.cancel(job_ids)
    except SlurmError as exc:
        log.error("could not cancel %s: %s", ",".join(job_ids), exc)


def read_output(path: str, cap: int = MAX_OUTPUT_BYTES) -> str:
    """A job's output file: a regular file, opened without following a symlink, at most
    ``cap`` bytes; "" when there is none."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(cap)
    finally:
        os.close(fd)
    return data.decode("utf-8", errors="replace")


def make_output_dir(path: str) -> str:
    """The sweep's folder for its jobs' outputs (0750; it must be where the compute nodes
    write and this host reads: a shared filesystem on a real cluster)."""
    try:
        os.makedirs(path, mode=0o750, exist_ok=False)
    except FileExistsError:
        raise UsageError(f"{path} exists already: a sweep never reuses a folder") from None
    except OSError as exc:
        raise UsageError(f"cannot create {path}: {exc.strerror or exc}") from None
    return path
