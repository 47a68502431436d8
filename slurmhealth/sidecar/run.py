"""The sidecar process: one per job per node, started by the prolog, stopped by the epilog.

Every ``sidecar.interval_s`` it snapshots the job's GPUs, swaps a fresh
:class:`ExportState` in, publishes the job's series as a state file that the node's one
scrape target (``slurmhealth exporter``) serves (:mod:`slurmhealth.metrics.export_state`), feeds the
detectors, and batches samples and events into the node's history. It exits on SIGTERM
(final flush), or by itself once the job it saw running has no process left on the node, or
never showed one in ``sidecar.unseen_grace_s`` (:mod:`slurmhealth.sidecar.presence`;
slurmctld is never asked).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections import Counter
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any, Protocol

from slurmhealth.checks.mig import only_instances
from slurmhealth.config import Config
from slurmhealth.errors import StoreError
from slurmhealth.history import History, records, rows
from slurmhealth.model import XidEvent, normalize_pci_bus_id
from slurmhealth.model_records import ExportState, Job
from slurmhealth.sidecar.files import SidecarFiles, write_atomic
from slurmhealth.sidecar.hang import capture_in_background
from slurmhealth.sidecar.rdma import exports_rdma
from slurmhealth.sidecar.state import Event
from slurmhealth.sidecar.stopflag import StopFlag

if TYPE_CHECKING:  # not at import: the prolog imports this module to start the sidecar
    from slurmhealth.gpu import GpuBackend
    from slurmhealth.kernel_log import KernelLogReader
    from slurmhealth.model import NodeSnapshot
    from slurmhealth.model_records import TaskStats
    from slurmhealth.rdma.model import RdmaSnapshot
    from slurmhealth.sidecar.detectors import Detectors
    from slurmhealth.sidecar.rdma import RdmaWatch


class Presence(Protocol):
    """Whether the job still has a process on this node (``sidecar.presence.JobPresence``)."""

    def ended(self) -> bool: ...


log = logging.getLogger("slurmhealth.sidecar")


def lifecycle_log() -> logging.Logger:
    """The logger of the sidecar's start, stop and death: stderr (the hook's format, with
    the job and node) and, where there is one, syslog (the prolog sends stderr nowhere),
    unless the root logger already sends everything there (``slurmhealth sidecar`` does)."""
    from logging.handlers import SysLogHandler

    root_syslog = any(isinstance(h, SysLogHandler) for h in logging.getLogger().handlers)
    if not _life.handlers and not root_syslog and os.path.exists("/dev/log"):
        with contextlib.suppress(OSError):
            handler = SysLogHandler(address="/dev/log")
            handler.ident = "slurmhealth: "  # the identifier every slurmhealth line has
            handler.setFormatter(logging.Formatter("slurmhealth-sidecar: %(message)s"))
            _life.addHandler(handler)
    return _life


_life = logging.getLogger("slurmhealth.sidecar.lifecycle")


class Sidecar:
    """The sampling loop and its exporter. ``run()`` blocks until stopped."""

    def __init__(self, cfg: Config, labels: Job, gpus: tuple[int, ...]) -> None:
        self.cfg = cfg
        self.labels = labels
        self.gpus = gpus
        self.node = labels.node or cfg.node_name
        self.files = SidecarFiles.of(cfg, self.node, labels.job_id)
        self.interval = max(1.0, cfg.sidecar.interval_s)
        self._stop = StopFlag()  # set by a signal handler: no lock (stopflag.py)
        self._state = ExportState(labels=labels, started_ts=time.time())
        self._lock = threading.Lock()
        self._pending_samples: list[dict[str, Any]] = []
        self._pending_events: list[dict[str, Any]] = []
        self._event_counts: Counter[tuple[str, int | None]] = Counter()
        self._xid_counts: Counter[tuple[int, int]] = Counter()
        self._seen_xids: dict[tuple[str, int], float] = {}
        self._captured = False
        self._publish_failed = False
        self._history: History | None = None
        self._why_stopped = "job gone"
        self._sampling = False  # a SIGTERM before the first snapshot ends the process at once
        # the judged ports last read; False: reading failed
        self._rdma_state: RdmaSnapshot | bool | None = None
        self._rdma_series = exports_rdma(cfg.metrics.rdma_series, labels.nodes)
        from slurmhealth.metrics.job_series import SidecarCollector

        mc = cfg.metrics
        self._collector = SidecarCollector(self.state, mode=mc.mode,
                                           per_link_nvlink=mc.per_link_nvlink,
                                           per_counter_rdma=mc.per_counter_rdma,
                                           job_labels=mc.job_labels)  # fmt: skip

    # -- export ----------------------------------------------------------------------
    def state(self) -> ExportState:
        with self._lock:
            return self._state

    def _announce(self) -> None:
        write_atomic(self.files.pid, f"{os.getpid()}\n")
        mapping = self.cfg.sidecar.dcgm_job_mapping_dir
        if mapping:  # dcgm-exporter's HPC job mapping: a file per GPU index with the job id
            for gpu in self.gpus:
                write_atomic(os.path.join(self.cfg.expand(mapping, self.node), str(gpu)),
                              f"{self.labels.job_id}\n")  # fmt: skip

    def _publish(self) -> None:
        """The job's series, as the exporter will serve them; a failure is logged once and
        the sidecar carries on (its history and detectors do not depend on it)."""
        from slurmhealth.metrics.export_state import UnsafeDir, encode, write_state

        try:
            data = encode(self._collector.collect(), self.labels.job_id, os.getpid(), time.time())
            write_state(self.files.run_dir, self.labels.job_id, data)
        except (OSError, UnsafeDir, ValueError) as exc:
            if not self._publish_failed:
                log.warning("job %s: series not published: %s", self.labels.job_id, exc)
            self._publish_failed = True

    def cleanup(self) -> None:
        paths = [self.files.pid, self.files.export]
        mapping = self.cfg.sidecar.dcgm_job_mapping_dir
        if mapping:
            paths += [os.path.join(self.cfg.expand(mapping, self.node), str(g)) for g in self.gpus]
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    # -- history -------------------------------------------------------------------------
    def _flush(self, ingest: bool = True, busy_timeout_ms: int = 1000) -> None:
        """This interval's rows onto disk (one append and fsync to our buffer: a kill
        loses at most the interval in progress); with ``ingest``, the buffer into the
        database, or into the spool when the database is busy (never lost)."""
        if self._history is None:
            self._history = History.for_node(self.cfg, self.node, busy_timeout_ms)
        history = self._history
        history.busy_timeout_ms = busy_timeout_ms
        if self._pending_samples or self._pending_events:
            batch = records.batch(
                [records.sample(r) for r in self._pending_samples]
                + [records.event(r) for r in self._pending_events]
            )
            self._pending_samples, self._pending_events = [], []
            if not history.buffer(batch):  # no room for the buffer: straight to the db
                history.write(batch)
        if ingest:
            history.ingest_spool()
            history.close()

    def _record_events(self, events: list[Event]) -> None:
        for e in events:
            log.warning("job %s event %s gpu %s: %s", self.labels.job_id, e.kind, e.gpu, e.message)
            self._event_counts[(e.kind, e.gpu)] += 1
            self._pending_events.append(rows.event_row(e, self.node, self.labels.job_id))

    def _new_xids(self, xids: list[XidEvent]) -> list[XidEvent]:
        """The event API and the kernel log report the same Xid: count it once."""
        fresh = []
        for x in xids:
            key = (x.pci_bus_id, x.xid)
            ts = x.ts or time.time()
            if ts - self._seen_xids.get(key, -1e18) > 30:
                fresh.append(x)
            self._seen_xids[key] = ts
        return fresh

    # -- loop --------------------------------------------------------------------------
    def run(self) -> int:
        """Sample until SIGTERM/SIGINT/SIGHUP or the job is gone; 0, or 1 when it could not
        run. Start, stop and death are logged with the job id and node (stderr and
        syslog): only SIGKILL goes unlogged, and the epilog notices that."""
        who = f"job {self.labels.job_id} node {self.node}: sidecar {os.getpid()}"

        def stop(signum: int, _frame: object) -> None:
            self._why_stopped = signal.Signals(signum).name
            self._stop.set()
            if not self._sampling:  # still starting: nothing to flush, end at once
                with contextlib.suppress(Exception):
                    self.cleanup()
                    os.write(2, f"{who} stopped while starting ({self._why_stopped})\n".encode())
                os._exit(0)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, stop)
        lifecycle_log().info("%s started for GPUs %s", who, ",".join(map(str, self.gpus)))
        try:
            self._loop()
        except Exception as exc:
            lifecycle_log().error("%s died: %s: %s", who, type(exc).__name__, exc, exc_info=True)
            return 1
        except BaseException as exc:
            lifecycle_log().error("%s died: %s", who, type(exc).__name__)
            raise
        finally:
            self._stop.close()
        lifecycle_log().info("%s stopped (%s)", who, self._why_stopped)
        return 0

    def _loop(self) -> None:
        from slurmhealth.sidecar.detectors import Detectors
        from slurmhealth.sidecar.nccl import NcclWatch
        from slurmhealth.sidecar.presence import JobPresence
        from slurmhealth.sidecar.task import TaskReader, peak_flops

        backend = self._open_and_announce()  # (a SIGTERM until the first snapshot: exit)
        log.info("job %s: sidecar for GPUs %s", self.labels.job_id, self.gpus)
        detectors = Detectors(self.cfg, self.gpus)
        rdma = self._rdma_watch()
        nccl = NcclWatch(self.cfg, self.labels, time.time())
        presence = JobPresence(self.labels.job_id, unseen_grace_s=self.cfg.sidecar.unseen_grace_s)
        klog, cursor = self._kernel_log(backend)
        xid_queue: list[XidEvent] = []
        threading.Thread(
            target=self._watch_xids, args=(backend, xid_queue), daemon=True, name="xid-watch"
        ).start()
        task: TaskReader | None = None
        next_job_check = time.monotonic() + self.cfg.sidecar.job_check_interval_s
        intervals = 0
        last_steps = -1
        try:
            while not self._stop.is_set():
                t0 = time.monotonic()
                snapshot = only_instances(backend.snapshot(self.gpus), self.labels.mig)
                self._sampling = True  # from here a SIGTERM waits for the final flush
                events = detectors.observe(snapshot) + self._rdma_step(rdma, snapshot)
                events += nccl.observe(time.time())
                klog_read = klog.read_new(cursor, time.time())
                cursor = klog_read.cursor
                with self._lock:
                    xids = self._new_xids([*xid_queue, *klog_read.events])
                    xid_queue.clear()
                if xids:
                    events += self._xid_events(detectors, snapshot, xids)
                events += detectors.observe_kernel(klog_read.kernel_events, klog_read.events)
                if task is None and os.path.isdir(self.files.job_dir):
                    model = next((g.name for g in snapshot.gpus if g.name), None)
                    task = TaskReader(
                        self.files.job_dir,
                        peak_flops(model),
                        len(self.gpus),
                        max_dir_bytes=self.cfg.sidecar.job_dir_max_bytes,
                    )
                stats = task.read(time.time()) if task else None
                if stats is not None and task is not None:
                    events += detectors.observe_task(stats, time.time())
                    events += detectors.observe_ranks(task.rank_steps(), time.time())
                self._record_events(events)
                if any(e.kind in ("hang", "step_stall") for e in events):
                    self._capture_now(events)
                last_steps = self._keep(snapshot, stats, last_steps)
                intervals += 1
                every = max(1, self.cfg.sidecar.flush_every)
                self._flush(ingest=bool(events) or intervals % every == 0)
                if time.monotonic() >= next_job_check:
                    next_job_check = time.monotonic() + self.cfg.sidecar.job_check_interval_s
                    if self._job_ended(presence):
                        break
                self._stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))
        finally:
            # within the epilog's grace: a busy database leaves the rows in the spool (a
            # sidecar stopped before its first sample has nothing to flush)
            if intervals or self._pending_samples or self._pending_events:
                self._flush(busy_timeout_ms=int(min(1000, self.cfg.sidecar.stop_grace_s * 250)))
            self.cleanup()
            backend.close()

    def _rdma_watch(self) -> RdmaWatch | None:
        """The RDMA ports' sampler and detector; None (nothing of it loaded) unless
        ``[rdma]`` is enabled and the node shows RDMA devices."""
        from slurmhealth.sidecar import rdma

        return rdma.RdmaWatch(self.cfg, self.node) if rdma.configured(self.cfg, self.node) else None

    def _rdma_step(self, watch: RdmaWatch | None, snapshot: NodeSnapshot) -> list[Event]:
        """One read of the RDMA ports (once per interval): their series for the next
        publish, their events now. A failed read is logged once and judged nothing."""
        if watch is None:
            return []
        from slurmhealth.sidecar.rdma import job_ports

        try:
            read = watch.read(snapshot)
            events: list[Event] = watch.observe(read, snapshot)
        except Exception as exc:  # fail open, loudly: the GPUs are still sampled
            if self._rdma_state is not False:
                log.warning("job %s: RDMA ports not read: %s", self.labels.job_id, exc)
            self._rdma_state = False
            return []
        self._rdma_state = job_ports(read, watch.expect)
        return events

    def _open_and_announce(self) -> GpuBackend:
        """The GPU backend, once the sidecar's files say it runs; on a failure (a full disk)
        nothing is left behind."""
        from slurmhealth.gpu import open_backend

        backend = open_backend(self.cfg)
        try:
            self._announce()
        except BaseException:
            self.cleanup()
            backend.close()
            raise
        return backend

    def _kernel_log(self, backend: GpuBackend) -> tuple[KernelLogReader, Any]:
        """The kernel-log reader of the sidecar and where to start: the epilog's cursor
        (read-only here: the epilog owns it)."""
        from slurmhealth.kernel_log import KernelLogReader

        source = self.cfg.kernel_log.source
        if source == "auto":
            source = backend.kernel_log_hint or "kmsg"
        klog = KernelLogReader(source, lookback_s=self.interval * 2, budget_s=0.5,
                               net=self.cfg.has_rdma(self.node))  # fmt: skip
        if source == "none":  # no kernel log: no position to read
            return klog, None
        try:
            with History.for_node(self.cfg, self.node) as history:
                return klog, history.kv_get("kernel_log_cursor")
        except StoreError as exc:  # a full or broken disk: the sidecar samples all the same
            log.warning("job %s: no kernel-log cursor (%s): reading the last %g s",
                        self.labels.job_id, exc, self.interval * 2)  # fmt: skip
            return klog, None

    def _job_ended(self, presence: Presence) -> bool:
        if not presence.ended():
            return False
        log.info("job %s has no process left here: sidecar exits", self.labels.job_id)
        return True

    def _xid_events(
        self, detectors: Detectors, snapshot: NodeSnapshot, xids: list[XidEvent]
    ) -> list[Event]:
        """The new Xids counted per GPU (matched by PCI bus id) and judged as events."""
        by_bus: dict[str, int] = {}
        uuids: dict[int, str | None] = {}
        for g in snapshot.gpus:
            uuids[g.index] = g.uuid
            if g.pci_bus_id:
                by_bus[normalize_pci_bus_id(g.pci_bus_id)] = g.index
        for x in xids:
            if x.pci_bus_id in by_bus:
                self._xid_counts[(by_bus[x.pci_bus_id], x.xid)] += 1
        return detectors.observe_xids(xids, by_bus, uuids)

    def _keep(self, snapshot: NodeSnapshot, stats: TaskStats | None, last_steps: int) -> int:
        """Queue the interval's samples (and the task's facts when a step came), update the
        state the exporter serves and publish it; returns the steps counted so far."""
        self._pending_samples += rows.sample_rows(snapshot, self.labels.job_id)
        if stats is not None and stats.steps_total != last_steps:
            last_steps = stats.steps_total  # the report's task facts (gpu = NULL)
            self._pending_samples.append(rows.task_row(asdict(stats), snapshot, self.labels.job_id))
        with self._lock:
            self._state = replace(
                self._state,
                snapshot=snapshot,
                xid_counts=dict(self._xid_counts),
                event_counts=dict(self._event_counts),
                task=stats,
                rdma=(self._rdma_state or None) if self._rdma_series else None,
                samples_total=self._state.samples_total + len(snapshot.gpus),
            )
        self._publish()
        return last_steps

    def _capture_now(self, events: list[Event]) -> None:
        """A hang: take the evidence (py-spy stacks!) while the processes are still alive,
        before anyone cancels the job. Once per job, in the background."""
        if self._captured:
            return
        self._captured = True
        kinds = ", ".join(sorted({e.kind for e in events if e.kind in ("hang", "step_stall")}))

        capture_in_background(self.cfg, self.labels, self.node, self.gpus, kinds)

    def _watch_xids(self, backend: GpuBackend, queue: list[XidEvent]) -> None:
        while not self._stop.is_set():
            try:
                xids = backend.wait_xid(1.0)
            except Exception as exc:  # the event API is optional: the kernel log remains
                log.info("NVML event API unavailable: %s", exc)
                return
            if xids:
                with self._lock:
                    queue.extend(xids)
