"""Time PyTorch's communication without touching the training loop (needs PyTorch).

DDP::

    timer = StepTimer(flops_per_token=6 * n_params)
    ddp = DistributedDataParallel(model)
    register_ddp_hook(ddp, timer)          # the default all-reduce, timed
    for batch in timer.data(loader): ...; timer.step(samples=len(batch))

FSDP and anything without DDP's hook: ``with time_collectives(timer): ...`` replaces the
collectives of ``torch.distributed`` (all_reduce, all_gather_into_tensor,
reduce_scatter_tensor, ...) by timed wrappers while the block runs.

A collective's time runs from the call to the completion of its future. On a GPU the two
ends are CUDA events on the stream (the call returns long before the GPU is done), read
without a host sync: an interval still running at ``timer.step()`` counts in the next step.
On the CPU (gloo) they are the wall clock. Timing never changes what the collective does,
and an error in the timing turns the timing off (one line on stderr), never the training.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from slurmhealth.train.timing import StepTimer

Hook = Callable[[Any, Any], Any]  # (state, GradBucket) -> torch.futures.Future[Tensor]

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
)


class _Interval:
    """One collective: started now; :meth:`done` marks its end (any thread)."""

    def __init__(self, timer: StepTimer, cuda: bool) -> None:
        self.timer = timer
        self.t0 = timer.clock()
        self.events: tuple[Any, Any] | None = None
        if cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            self.events = (start, torch.cuda.Event(enable_timing=True))

    def done(self) -> None:
        if self.events is None:
            self.timer.add_comm(self.t0, self.timer.clock())
            return
        self.events[1].record()  # on the current stream, ordered after the collective
        self.timer.add_pending(self._resolve)

    def _resolve(self) -> tuple[float, float] | None:
        assert self.events is not None
        start, end = self.events
        if not end.query():
            return None
        return self.t0, self.t0 + float(start.elapsed_time(end)) / 1000.0


def _is_cuda(tensor: Any) -> bool:
    return bool(getattr(tensor, "is_cuda", False))


def _timed_future(timer: StepTimer, fut: Any, interval: _Interval) -> Any:
    """``fut`` chained with a callback that ends ``interval``; the value passes through."""

    def finish(f: Any) -> Any:
        with contextlib.suppress(Exception):
            interval.done()
        return f.value()

    return fut.then(finish)


def timed_hook(timer: StepTimer, inner: Hook = default_hooks.allreduce_hook) -> Hook:
    """A DDP communication hook: ``inner`` (default: DDP's own all-reduce, the same
    result as no hook) with its time from call to completion added to ``timer``."""

    def hook(state: Any, bucket: Any) -> Any:
        if not timer.enabled:
            return inner(state, bucket)
        try:
            interval = _Interval(timer, _is_cuda(bucket.buffer()))
        except Exception as exc:
            timer.disable(f"DDP hook: {exc!r}")
            return inner(state, bucket)
        fut = inner(state, bucket)
        try:
            return _timed_future(timer, fut, interval)
        except Exception as exc:
            timer.disable(f"DDP hook: {exc!r}")
            return fut

    # DDP accepts a hook whose annotations are GradBucket/Future or none at all
    hook.__annotations__ = {}
    hook.__name__ = f"timed_{getattr(inner, '__name__', 'hook')}"
    return hook


def register_ddp_hook(
    ddp_model: Any, timer: StepTimer, state: Any = None, inner: Hook | None = None
) -> None:
    """``ddp_model.register_comm_hook(state, timed_hook(timer, inner))``; ``state`` is the
    process group for the default all-reduce (``None``: the default group)."""
    ddp_model.register_comm_hook(state, timed_hook(timer, inner or default_hooks.allreduce_hook))


def _first_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, list | tuple) and value and isinstance(value[0], torch.Tensor):
            return value[0]
    return None


def timed_collective(timer: StepTimer, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (a ``torch.distributed`` collective) timed: an ``async_op=True`` call until
    its work's future completes, a blocking call until it returns (on a GPU: until the
    stream has run it)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not timer.enabled:
            return fn(*args, **kwargs)
        try:
            interval = _Interval(timer, _is_cuda(_first_tensor(args, kwargs)))
        except Exception as exc:
            timer.disable(f"{fn.__name__}: {exc!r}")
            return fn(*args, **kwargs)
        work = fn(*args, **kwargs)
        try:
            if kwargs.get("async_op") and work is not None:
                _timed_future(timer, work.get_future(), interval)
            else:
                interval.done()
        except Exception as exc:
            timer.disable(f"{fn.__name__}: {exc!r}")
        return work

    return wrapper


@contextlib.contextmanager
def time_collectives(timer: StepTimer, names: tuple[str, ...] = COLLECTIVES) -> Iterator[None]:
    """Within the block, ``torch.distributed.<name>`` are timed (FSDP and others call them
    through the module). Restored on exit."""
    saved = {n: getattr(dist, n) for n in names if hasattr(dist, n)}
    try:
        for name, fn in saved.items():
            setattr(dist, name, timed_collective(timer, fn))
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
