"""Measure a step's communication and data waiting, and report it with :func:`job.step`.

    timer = StepTimer(flops_per_token=6 * n_params)
    for batch in timer.data(loader):            # times each next(): data wait
        loss = model(batch).backward()           # a hook adds communication intervals
        opt.step()
        timer.step(samples=len(batch), tokens=batch.numel())

Communication is a set of intervals (call of a collective to its completion, on one or more
threads); a step's communication time is the length of their union, so overlapping buckets
and a collective timed twice (a DDP hook and the collective patch) count once. The intervals
include the time the collective overlapped with other work (DDP starts a bucket's all-reduce
while backward still computes the next bucket): the share says how long communication was in
flight, and in synchronous training it holds the time spent waiting for the slowest rank.

Standard library only. Never raises into the training loop: an internal error turns the
timer off after one line on stderr (the reports then carry no measured parts).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from slurmhealth import job

T = TypeVar("T")
Report = Callable[..., None]  # job.step's signature
Resolver = Callable[[], tuple[float, float] | None]  # an interval not known yet (CUDA events)


def union_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by ``(start, end)`` intervals (overlaps counted once)."""
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


class StepTimer:
    """Accumulates one step's communication intervals and data waits; :meth:`step` reports
    them through ``report`` (default :func:`slurmhealth.job.step`) and starts the next step.

    ``flops_per_token`` (the model's training FLOPs per token, ~6 x parameters) turns
    reported tokens into FLOPs, from which the sidecar computes MFU. Thread-safe: completion
    callbacks of collectives run on the backend's threads.
    """

    def __init__(
        self,
        flops_per_token: float | None = None,
        report: Report | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.flops_per_token = flops_per_token
        self.clock = clock
        self.enabled = True
        self._report = report or job.step
        self._lock = threading.Lock()
        self._intervals: list[tuple[float, float]] = []
        self._pending: list[Resolver] = []  # resolved at the next step they are ready
        self._data_wait = 0.0
        self.steps = 0

    # -- what hooks and wrappers call ------------------------------------------------
    def add_comm(self, start: float, end: float) -> None:
        """One collective's interval in ``clock`` seconds."""
        with self._lock:
            self._intervals.append((start, end))

    def add_pending(self, resolve: Resolver) -> None:
        """An interval known later (GPU events): ``resolve()`` gives it once it is
        complete, ``None`` before; it is counted in the first step it is ready."""
        with self._lock:
            self._pending.append(resolve)

    def add_data_wait(self, seconds: float) -> None:
        with self._lock:
            self._data_wait += seconds

    def data(self, iterable: Iterable[T]) -> Iterator[T]:
        """Iterate over ``iterable`` (a data loader), timing each ``next()`` as data wait."""
        it = iter(iterable)
        clock = self.clock
        while True:
            start = clock()
            try:
                item = next(it)
            except StopIteration:
                return
            self.add_data_wait(clock() - start)
            yield item

    # -- once per step ---------------------------------------------------------------
    def step(
        self, samples: Any = None, tokens: Any = None, flops: Any = None, step: int | None = None
    ) -> None:
        """Report the step that just ended (measured communication and data wait) and
        start the next. ``flops`` defaults to ``tokens x flops_per_token``."""
        comm, wait = self.take()
        if flops is None and tokens is not None and self.flops_per_token:
            try:
                flops = float(tokens) * self.flops_per_token
            except (TypeError, ValueError):
                flops = None
        self.steps += 1
        self._report(
            samples=samples,
            tokens=tokens,
            flops=flops,
            comm_seconds=comm,
            data_wait_seconds=wait,
            step=step,
        )

    def take(self) -> tuple[float | None, float | None]:
        """(communication seconds, data-wait seconds) since the last call, and reset.
        ``None`` when the timer is off."""
        if not self.enabled:
            return None, None
        try:
            with self._lock:
                intervals, self._intervals = self._intervals, []
                pending, self._pending = self._pending, []
                wait, self._data_wait = self._data_wait, 0.0
            later = []
            for resolve in pending:
                got = resolve()
                if got is None:
                    later.append(resolve)
                else:
                    intervals.append(got)
            if later:
                with self._lock:
                    self._pending[:0] = later
            return union_seconds(intervals), wait
        except Exception as exc:
            self.disable(f"timing failed: {exc!r}")
            return None, None

    def disable(self, why: str) -> None:
        if self.enabled:
            self.enabled = False
            with contextlib.suppress(Exception):
                sys.stderr.write(f"slurmhealth.train: communication timing off: {why}\n")


def timer_for(timer: StepTimer | None, flops_per_token: float | None) -> StepTimer:
    """The callbacks' timer: ``timer`` (with ``flops_per_token`` when given) or a new one."""
    if timer is None:
        return StepTimer(flops_per_token=flops_per_token)
    if flops_per_token is not None:
        timer.flops_per_token = flops_per_token
    return timer


def tokens_from(tokens: int | None, samples: int | None, per_sample: int | None) -> int | None:
    """``tokens`` when known, else ``samples x per_sample`` when both are."""
    if tokens is None and samples is not None and per_sample:
        return samples * per_sample
    return tokens


def batch_size_of(batch: Any) -> int | None:
    """Samples in a batch as data loaders yield it: a tensor or array (its first dimension),
    a list/tuple (of its first element, or its length when the items are scalars), a
    mapping (its ``input_ids`` or first value). ``None`` when it cannot tell."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        try:
            return int(shape[0]) if len(shape) else None
        except (TypeError, ValueError, IndexError):
            return None
    if isinstance(batch, dict):
        values = [batch["input_ids"]] if "input_ids" in batch else list(batch.values())
        return batch_size_of(values[0]) if values else None
    if isinstance(batch, list | tuple) and batch:
        first = batch_size_of(batch[0])
        return first if first is not None else len(batch)
    return None


def tokens_of(batch: Any) -> int | None:
    """Tokens in a batch that carries ``input_ids`` (a mapping, as tokenizers give it):
    its element count. ``None`` otherwise."""
    ids = batch.get("input_ids") if isinstance(batch, dict) else None
    numel = getattr(ids, "numel", None)
    try:
        return int(numel()) if callable(numel) else None
    except (TypeError, ValueError):
        return None
