"""What the node agent keeps open between hooks: the GPU library with the node's latest
snapshot (:class:`SharedGpu`) and the node's jobs as Slurm lists them (:class:`NodeJobs`)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from slurmhealth.config import Config
from slurmhealth.model import NodeSnapshot
from slurmhealth.slurm import SlurmError
from slurmhealth.slurm.base import Job, NodeInfo

if TYPE_CHECKING:
    from slurmhealth.gpu import GpuBackend
    from slurmhealth.slurm import SlurmBackend

log = logging.getLogger("slurmhealth.agent")
MAX_AGE_S = 2.0  # a snapshot this recent stands for "now" in a prolog (hooks/snapshot_cache)


def _subset(snapshot: NodeSnapshot, indices: Sequence[int] | None) -> NodeSnapshot:
    if indices is None:
        return snapshot
    wanted = set(indices)
    return dataclasses.replace(snapshot, gpus=tuple(g for g in snapshot.gpus if g.index in wanted))


def _gpu_key(cfg: Config) -> tuple[Any, ...]:
    """What the open backend depends on: a change re-opens it."""
    mtime = 0.0
    if cfg.gpu.backend == "sim" and cfg.gpu.sim_scenario:
        with contextlib.suppress(OSError):
            mtime = os.stat(cfg.gpu.sim_scenario).st_mtime
    # by value: every config load makes new (identity-compared) section objects
    return (cfg.node_name, repr(sorted(dataclasses.asdict(cfg.gpu).items())),
            cfg.paths.run_dir, mtime)  # fmt: skip


class SharedGpu:
    """One open GPU backend and the node's last snapshot of all its GPUs. ``taken`` counts
    the NVML reads; each is logged with the jobs it served."""

    def __init__(
        self, opener: Callable[[Config], GpuBackend] | None = None, max_age_s: float = MAX_AGE_S
    ) -> None:
        self._opener = opener
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._backend: GpuBackend | None = None
        self._key: tuple[Any, ...] = ()
        self._last: NodeSnapshot | None = None
        self._at = -1e18
        self.taken = 0
        self._bad: set[int] = set()  # GPUs that did not answer in the last read

    def _to_read(self, indices: Sequence[int] | None) -> Sequence[int] | None:
        """Every GPU (one read serves a burst's prologs), but those that did not answer last
        time unless asked for: a hung GPU delays only the jobs that have it."""
        if indices is None or not self._bad or self._last is None:
            return None
        known = {g.index for g in self._last.gpus}
        return sorted((known - self._bad) | set(indices))

    def _open(self, cfg: Config) -> GpuBackend:
        key = _gpu_key(cfg)
        if self._backend is None or key != self._key:
            if self._backend is not None:
                self._backend.close()
            from slurmhealth.gpu import open_backend

            self._backend = None
            self._backend = (self._opener or open_backend)(cfg)
            self._key, self._last = key, None
            log.info("GPU library opened for %s (%s)", cfg.node_name, cfg.gpu.backend)
        return self._backend

    def snapshot(self, cfg: Config, job_id: str, indices: Sequence[int] | None,
                 fresh: bool) -> tuple[NodeSnapshot, str | None]:  # fmt: skip
        """The GPUs ``indices`` now: the shared snapshot when it is recent and they all
        answered in it (never for ``fresh``: the epilog looks at what the job left)."""
        with self._lock:
            backend = self._open(cfg)
            last = self._last
            if not fresh and last is not None and time.monotonic() - self._at <= self.max_age_s:
                got = _subset(last, indices)
                want = set(indices) if indices is not None else {g.index for g in last.gpus}
                if {g.index for g in got.gpus if g.readable} >= want:
                    log.info("job %s judged on NVML snapshot #%d (%.2f s old, shared)",
                             job_id, self.taken, time.monotonic() - self._at)  # fmt: skip
                    return got, backend.kernel_log_hint
            snap = backend.snapshot(self._to_read(indices))
            self.taken += 1
            if snap.error is None:
                self._last, self._at = snap, time.monotonic()
                self._bad = {g.index for g in snap.gpus if not g.readable}
            log.info("job %s judged on NVML snapshot #%d (new, %d GPUs read)", job_id,
                     self.taken, len(snap.gpus))  # fmt: skip
            return _subset(snap, indices), backend.kernel_log_hint

    def view(self, cfg: Config, job_id: str, fresh: bool) -> Callable[[float], GpuBackend]:
        """An ``open_gpu`` for :class:`~slurmhealth.hooks.prolog.Adapters`."""

        def open_gpu(_timeout_s: float) -> GpuBackend:
            return _View(self, cfg, job_id, fresh)

        return open_gpu

    def close(self) -> None:
        with self._lock:
            if self._backend is not None:
                self._backend.close()
            self._backend = None


class _View:
    """One hook's GpuBackend over the shared one; closing it keeps the library open."""

    def __init__(self, shared: SharedGpu, cfg: Config, job_id: str, fresh: bool) -> None:
        self._shared, self._cfg, self._job, self._fresh = shared, cfg, job_id, fresh
        self._hint: str | None = None

    def devices(self) -> list[int]:
        return [g.index for g in self.snapshot(None).gpus]

    def snapshot(self, indices: Sequence[int] | None = None) -> NodeSnapshot:
        snap, self._hint = self._shared.snapshot(self._cfg, self._job, indices, self._fresh)
        return snap

    def wait_xid(self, timeout_s: float) -> list[Any]:
        return []

    @property
    def kernel_log_hint(self) -> str | None:
        if self._hint is None:
            with self._shared._lock:
                self._hint = self._shared._open(self._cfg).kernel_log_hint
        return self._hint

    def close(self) -> None:
        pass


class NodeJobs:
    """The node's jobs from one ``squeue -w NODE``, shared by the prologs of a burst: a
    prolog uses a listing begun after it arrived (so its own job is in it), joining one in
    flight or starting the next; a job not in it (or listed twice) is asked for alone."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._listing: dict[str, Job] = {}
        self._began = -1e18  # when the current listing's call began (monotonic)
        self._busy = False
        self.calls = 0

    def lookup(self, slurm: SlurmBackend, node: str, job_id: str, arrived: float) -> Job | None:
        with self._cond:
            while self._busy:
                self._cond.wait(30.0)
            if self._began >= arrived:
                return self._listing.get(job_id)
            self._busy = True
            began = time.monotonic()
        listing: dict[str, Job] = {}
        try:
            self.calls += 1
            listing = slurm.jobs_on_node(node)  # type: ignore[attr-defined]
        except (SlurmError, AttributeError) as exc:
            log.warning("the node's jobs not listed: %s", exc)
        finally:
            with self._cond:
                self._listing, self._began, self._busy = listing, began, False
                self._cond.notify_all()
        return listing.get(job_id)

    def view(self, slurm: SlurmBackend, node: str, arrived: float) -> SlurmBackend:
        return _JobsView(self, slurm, node, arrived)


class _JobsView:
    """A SlurmBackend whose ``job()`` reads the node's shared listing first."""

    def __init__(self, jobs: NodeJobs, inner: SlurmBackend, node: str, arrived: float) -> None:
        self._jobs, self._inner, self._node, self._arrived = jobs, inner, node, arrived

    def job(self, job_id: str) -> Job | None:
        info = self._jobs.lookup(self._inner, self._node, job_id, self._arrived)
        return info if info is not None else self._inner.job(job_id)

    def with_timeout(self, timeout_s: float) -> SlurmBackend:
        return _JobsView(self._jobs, self._inner.with_timeout(timeout_s), self._node,
                         self._arrived)  # fmt: skip

    def nodes(self) -> list[NodeInfo]:
        return self._inner.nodes()

    def drain(self, node: str, reason: str) -> None:
        self._inner.drain(node, reason)

    def resume(self, node: str) -> None:
        self._inner.resume(node)

    def show_job(self, job_id: str) -> dict[str, str]:
        return self._inner.show_job(job_id)
