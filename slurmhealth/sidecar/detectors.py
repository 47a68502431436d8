"""In-job fault detectors: snapshots, Xids and task stats in, :class:`Event` s out.

The judgement is the check catalog's (:mod:`slurmhealth.checks`): every snapshot runs the
checks of phase ``sidecar`` with the site's thresholds and ``[checks] disabled`` list, and
their failing findings become events (``FROM_CHECKS``). The detectors add only time:

- Edges: an event is emitted once, when its condition starts, and the same condition on the
  same GPU (link) fires again only after it has cleared. A condition whose data is unknown
  (``None``, or the GPU unreadable) neither starts nor clears.
- Sustain: ``throttle`` fires once the clock-event finding held ``throttle_sustain_s``.
- Growth: ``ecc`` fires when the volatile uncorrectable count fails the check *and* grew since
  the previous snapshot (counts from before the job are the prolog's business); continuous
  growth is one event until an interval passes without growth. ``nvlink_errors`` gets the
  counters read since the job started: its rate needs the check's minimum window and count.
- ``hang`` counts idle time from the job start (the first snapshot), not only after the GPUs
  were busy once: a job stuck in NCCL init or deadlocked before its first kernel hangs too.
  ``hang_after_s`` (default 15 min) leaves room for slow model loading.
- ``straggler`` judges each GPU's mean over ``straggler_window_s`` by
  :func:`slurmhealth.checks.straggler.stragglers`; ``throughput_drop`` and ``step_stall``
  judge what the training loop reported.
- ``xid`` and ``kernel`` (kernel-log faults without an Xid) are judged per fault as the
  ``xid`` and ``kernel_log`` checks judge them (:mod:`slurmhealth.sidecar.faults`).

Pure and deterministic: no I/O, no clock reads; time comes from ``snapshot.ts``, the Xid's own
``ts`` or an explicit ``now``.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from slurmhealth.checks import CheckContext, run_checks, window_of
from slurmhealth.checks.counters import History, remember
from slurmhealth.checks.straggler import PEERS_BUSY_PCT, peer_medians, stragglers
from slurmhealth.config import Config
from slurmhealth.model import Finding, GpuState, NodeSnapshot, Severity, XidEvent
from slurmhealth.model_records import KernelEvent, TaskStats
from slurmhealth.sidecar.faults import KernelFaults
from slurmhealth.sidecar.state import Event
from slurmhealth.sidecar.topology import node_topology

KINDS: Mapping[str, Severity] = {
    "xid": Severity.INFO,  # per Xid from the catalog and the line (judge): INFO to CRITICAL
    "kernel": Severity.WARN,  # per fault by the kernel_log check: WARN to CRITICAL
    "gpu_lost": Severity.CRITICAL,
    "nvlink_down": Severity.CRITICAL,
    "nvlink_errors": Severity.FAIL,
    "throttle": Severity.FAIL,
    "thermal": Severity.FAIL,
    "ecc": Severity.FAIL,
    "row_remap": Severity.FAIL,
    "hang": Severity.CRITICAL,
    "straggler": Severity.WARN,
    "rank_straggler": Severity.WARN,  # a training rank the others wait for (task level)
    "throughput_drop": Severity.WARN,
    "step_stall": Severity.FAIL,
    "ib_errors": Severity.FAIL,  # per port, by the RDMA watch (sidecar/rdma.py)
    "ib_port_down": Severity.FAIL,
    "nccl_socket": Severity.WARN,  # sockets between nodes, by the NCCL watch (sidecar/nccl.py)
}
"""Every event kind and its severity (``xid``, ``kernel``: decided per fault)."""

FROM_CHECKS: Mapping[str, str] = {
    "gpu_lost": "gpu_lost",
    "gpu_reset_required": "gpu_lost",
    "gpu_unresponsive": "gpu_lost",
    "nvlink_inactive": "nvlink_down",
    "nvlink_errors": "nvlink_errors",
    "ecc_uncorrectable": "ecc",
    "row_remap": "row_remap",
    "clock_events": "throttle",
    "thermal_margin": "thermal",
}
"""The event kind a failing finding of each ``sidecar``-phase check becomes."""

# what a condition on (GPU, link) rests on: while that reads None it neither starts nor clears
_KNOWN: Mapping[str, Callable[[GpuState, int | None], bool]] = {
    "nvlink_down": lambda g, n: (
        g.nvlinks is not None and all(lk.active is not None for lk in g.nvlinks if lk.link == n)
    ),
    "throttle": lambda g, n: g.clock_event_reasons is not None,
    "thermal": lambda g, n: g.margin_temperature_c is not None,
    "ecc": lambda g, n: g.ecc_volatile_uncorrectable is not None,
    "row_remap": lambda g, n: (
        (g.remap_pending, g.remap_failure, g.retired_pages_pending) != (None, None, None)
    ),
}
Key = tuple[int, int | None]  # (GPU, NVLink or None)

THROUGHPUT_HISTORY = 100  # task throughput values kept for the rolling median
MIN_THROUGHPUT_VALUES = 5
MIN_STALL_STEPS = 3


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return math.fsum(known) / len(known) if known else None


class Detectors:
    """Per-job detectors: one :meth:`observe` per sampling interval, Xids and task stats as
    they come. Memory is bounded by the job's GPUs, links and the straggler window.

    ``cfg`` gives the sidecar's timing (``cfg.sidecar``) and the checks' thresholds and
    disabled list (``cfg.checks``, the same as the prolog's); ``gpus`` are the job's GPU
    indices (empty: every GPU of the snapshot).
    """

    def __init__(self, cfg: Config, gpus: Sequence[int]) -> None:
        self.cfg = cfg.sidecar
        self._checks = cfg.checks
        self._links_configured = cfg.gpu.nvlinks_per_model
        self._links_per_model = dict(self._links_configured)  # + links seen active per model
        self._topology = node_topology(cfg, strict=False)  # the node set's design override
        self.gpus = tuple(sorted(set(gpus)))
        sc = self.cfg
        self._window_n = max(2, round(sc.straggler_window_s / max(sc.interval_s, 1e-3)))
        self._out: list[Event] = []
        self._active: set[tuple[str, Hashable]] = set()  # (kind, key) of conditions that fired
        self._since: dict[tuple[str, Hashable], float] = {}  # when a sustained condition began
        self._last: NodeSnapshot | None = None
        self._counters: History = {}  # earlier reads of the error counters, for rates
        self._counter_window = window_of(cfg.checks.settings)
        self._ecc_last: dict[int, int] = {}
        self._samples: dict[int, deque[tuple[float, float, float | None]]] = {}
        self._faults = KernelFaults(cfg.checks, self.gpus)
        self._throughput: deque[float] = deque(maxlen=THROUGHPUT_HISTORY)
        self._throughput_metric = ""
        self._task_steps = -1

    def _edge(self, kind: str, key: Hashable, condition: bool) -> bool:
        """True exactly when ``condition`` starts for ``(kind, key)``; clears when it ends."""
        k = (kind, key)
        if not condition:
            self._active.discard(k)
            return False
        if k in self._active:
            return False
        self._active.add(k)
        return True

    def _sustained(
        self, kind: str, key: Hashable, ts: float, on: bool, hold: float
    ) -> float | None:
        """The time ``on`` became sustained for ``hold`` seconds, once; None otherwise."""
        k = (kind, key)
        if not on:
            self._since.pop(k, None)
            self._edge(kind, key, False)
            return None
        since = self._since.setdefault(k, ts)
        return since + hold if self._edge(kind, key, ts - since >= hold) else None

    def _emit(self, ts: float, kind: str, msg: str, g: GpuState | None, **evidence: Any) -> None:
        gpu, uuid = (None, None) if g is None else (g.index, g.uuid)
        self._out.append(Event(ts, kind, KINDS[kind], msg, gpu, uuid, evidence))

    def _take(self) -> list[Event]:
        out, self._out = self._out, []
        return out

    # -- GPU snapshots -----------------------------------------------------------------------

    def observe(self, snapshot: NodeSnapshot) -> list[Event]:
        """Judge one snapshot with the checks; return the events that start now."""
        ts = snapshot.ts
        if self.gpus:
            gpus = [g for i in self.gpus if (g := snapshot.gpu(i)) is not None]
        else:
            gpus = sorted(snapshot.gpus, key=lambda g: g.index)
        self._learn_links(gpus)
        ctx = CheckContext(
            snapshot=snapshot,
            phase="sidecar",
            gpus=self.gpus or None,
            nvlinks_per_model=self._links_per_model,
            counter_history=self._counters,
            topology=self._topology,
        )
        mine = {g.index for g in gpus}
        findings = run_checks(ctx, self._checks.settings, self._checks.disabled)
        remember(self._counters, snapshot, self._counter_window, ctx.counters)
        self._conditions(ts, {g.index: g for g in gpus}, [f for f in findings if f.gpu in mine])
        self._hang(ts, gpus)
        self._straggler(ts, gpus)
        self._last = snapshot
        return self._take()

    def _learn_links(self, gpus: list[GpuState]) -> None:
        """A model the config does not list must keep the links it had active earlier in the
        job: a link that goes down (even all at once, an NVSwitch tray) is down."""
        for g in gpus:
            if g.name and g.nvlinks and g.name not in self._links_configured:
                active = sum(1 for link in g.nvlinks if link.active)
                self._links_per_model[g.name] = max(self._links_per_model.get(g.name, 0), active)

    def _conditions(self, ts: float, gpus: Mapping[int, GpuState], findings: list[Finding]) -> None:
        """Failing findings -> conditions per (kind, GPU, link); edges and sustain on them."""
        found: dict[tuple[str, Key], list[Finding]] = {}
        for f in findings:
            kind = FROM_CHECKS.get(f.check)
            if kind is None or not f.failing or f.gpu is None:
                continue
            link = f.evidence.get("link") if kind.startswith("nvlink") else None
            found.setdefault((kind, (f.gpu, link)), []).append(f)
        for kind, key in sorted(found, key=lambda k: (k[1][0], k[0], k[1][1] or 0)):
            self._start(ts, kind, key, gpus[key[0]], found[kind, key])
        kinds = set(FROM_CHECKS.values())
        for was, where in self._active | set(self._since):
            if was not in kinds or (was, where) in found or not isinstance(where, tuple):
                continue
            g, known = gpus.get(where[0]), _KNOWN.get(was)
            if g is None or not (was == "gpu_lost" or g.readable):
                continue
            if known is None or known(g, where[1]):
                self._since.pop((was, where), None)
                self._edge(was, where, False)
        for g in gpus.values():
            if g.readable and g.ecc_volatile_uncorrectable is not None:
                self._ecc_last[g.index] = g.ecc_volatile_uncorrectable

    def _start(self, ts: float, kind: str, key: Key, g: GpuState, fs: list[Finding]) -> None:
        f = fs[0]
        if kind == "throttle":
            hold = self.cfg.throttle_sustain_s
            at = self._sustained(kind, key, ts, True, hold)
            if at is not None:
                reasons = [str(x.evidence.get("reason")) for x in fs]
                text = ", ".join(r.replace("_", " ") for r in reasons)
                msg = f"GPU {g.index} clocks cut by {text} for {hold:.0f} s"
                ev = {"sm_clock_mhz": g.sm_clock_mhz, "temperature_c": g.temperature_c}
                self._emit(at, kind, msg, g, reason=",".join(reasons), since=at - hold, **ev)
        elif kind == "ecc":
            before, count = self._ecc_last.get(g.index), g.ecc_volatile_uncorrectable
            grew = before is not None and count is not None and count > before
            if self._edge(kind, key, grew):
                msg = f"GPU {g.index} volatile uncorrectable ECC errors {before} -> {count}"
                self._emit(ts, kind, msg, g, before=before, after=count)
        elif self._edge(kind, key, True):
            detail: dict[str, Any] = {**f.evidence, "check": f.check}
            if kind == "gpu_lost":
                detail["status"] = g.status.value
            self._emit(ts, kind, f"GPU {g.index}: {f.message}", g, **detail)

    def _hang(self, ts: float, gpus: list[GpuState]) -> None:
        util = {g.index: g.utilization_gpu_pct for g in gpus}
        limit = self.cfg.hang_idle_pct
        idle = bool(util) and all(u is not None and u <= limit for u in util.values())
        hold = self.cfg.hang_after_s
        at = self._sustained("hang", None, ts, idle, hold)
        if at is not None:
            msg = f"all {len(util)} GPUs of the job idle (<= {limit:g}%) for {hold:.0f} s"
            per_gpu = {str(i): u for i, u in util.items()}
            self._emit(at, "hang", msg, None, idle_since=at - hold, utilization_pct=per_gpu)

    def _straggler(self, ts: float, gpus: list[GpuState]) -> None:
        """A GPU whose mean utilisation (else power) over the window is a straggler by
        :func:`~slurmhealth.checks.straggler.stragglers` while its peers are busy."""
        horizon, window = ts - self.cfg.straggler_window_s, self.cfg.straggler_window_s
        for g in gpus:
            buf = self._samples.setdefault(g.index, deque(maxlen=self._window_n))
            if g.readable and g.utilization_gpu_pct is not None:
                buf.append((ts, float(g.utilization_gpu_pct), g.power_w))
            while buf and buf[0][0] <= horizon:
                buf.popleft()
        full = {g.index: self._samples[g.index] for g in gpus}
        full = {i: buf for i, buf in full.items() if len(buf) >= self._window_n}
        util = {i: math.fsum(s[1] for s in buf) / len(buf) for i, buf in full.items()}
        power = {i: p for i, buf in full.items() if (p := _mean([s[2] for s in buf])) is not None}
        ratio = self.cfg.straggler_ratio
        busy = {i for i, m in peer_medians(util).items() if m >= PEERS_BUSY_PCT}
        slow = {s.gpu: ("utilization", s) for s in stragglers(util, ratio, PEERS_BUSY_PCT)}
        for s in stragglers(power, ratio):
            if s.gpu in busy and s.gpu not in slow:
                slow[s.gpu] = ("power", s)
        judged = set(peer_medians(util))  # a full window, and peers with one
        for g in gpus:  # too few samples in the window (a late sampler): unknown, kept as is
            if g.index not in judged or not self._edge("straggler", g.index, g.index in slow):
                continue
            metric, lag = slow[g.index]
            unit = "%" if metric == "utilization" else " W"
            msg = (
                f"GPU {g.index} lags its peers: mean {metric} {lag.value:.0f}{unit} vs the "
                f"peers' median {lag.peers_median:.0f}{unit} over {window:.0f} s"
            )
            ev = {"mean": round(lag.value, 3), "peers_median": round(lag.peers_median, 3)}
            self._emit(ts, "straggler", msg, g, metric=metric, **ev, window_s=window)

    # -- Xids --------------------------------------------------------------------------------

    def observe_xids(
        self,
        xids: Sequence[XidEvent],
        gpu_by_bus: Mapping[str, int],
        uuid_by_gpu: Mapping[int, str | None] | None = None,
        now: float | None = None,
    ) -> list[Event]:
        """One ``xid`` event per Xid, judged by the Xid catalog and the line's own verdict
        (:func:`~slurmhealth.checks.xid_table.judge`: application Xids INFO, node Xids
        FAIL/CRITICAL, a contained one WARN: every Xid is recorded, the severity says what
        matters).

        ``gpu_by_bus`` maps PCI bus ids (any spelling) to GPU indices (the job's or the whole
        node's). An Xid on a GPU that is not the job's is skipped; so is one on an unmapped
        bus id when every job GPU's bus id is known, else it is kept with ``gpu=None``.
        The same Xid on the same bus within ``XID_DEDUPE_S`` (NVML's event API and the kernel
        log both delivered it) is one event. ``ts`` is the Xid's own time, else ``now``, else
        the last snapshot's.
        """
        ts = self._default_ts(now)
        return self._faults.xids(xids, gpu_by_bus, uuid_by_gpu or {}, ts, self._last)

    def observe_kernel(
        self, events: Sequence[KernelEvent], xids: Sequence[XidEvent] = (), now: float | None = None
    ) -> list[Event]:
        """One ``kernel`` event per kernel-log fault without an Xid (fallen off the bus, GSP
        timeout, init failure, SXid, PCIe AER) on the job's GPUs or the node, judged by the
        ``kernel_log`` check; ``xids`` are those of the same read (an acting Xid covers the
        other faults of its GPU). Needs a snapshot first (which GPUs are the job's)."""
        if self._last is None:
            return []
        return self._faults.kernel(events, xids, self._last, self._default_ts(now))

    def _default_ts(self, now: float | None) -> float:
        return now if now is not None else 0.0 if self._last is None else self._last.ts

    # -- task metrics ------------------------------------------------------------------------

    def observe_task(self, stats: TaskStats, now: float) -> list[Event]:
        """``throughput_drop`` and ``step_stall`` from what the training loop reported.

        Throughput is judged once per new data (``steps_total`` grew) against the rolling
        median of the previous values (at least ``MIN_THROUGHPUT_VALUES`` of them); a stall
        is ``now - last_step_ts > stall_factor x`` the median step time and at least
        ``stall_min_s``, after 3 steps.
        """
        if stats.steps_total > self._task_steps:
            self._task_steps = stats.steps_total
            self._throughput_drop(stats, now)
        step_s, last = stats.step_seconds, stats.last_step_ts
        if step_s and last is not None and stats.steps_total >= MIN_STALL_STEPS:
            limit = max(self.cfg.stall_factor * step_s, self.cfg.stall_min_s)
            if self._edge("step_stall", None, now - last > limit):
                msg = f"no training step for {now - last:.0f} s (median step {step_s:.3g} s)"
                ev = {"last_step_ts": last, "step_seconds": step_s}
                since = round(now - last, 3)
                self._emit(last + limit, "step_stall", msg, None, **ev, seconds_since_step=since)
        else:
            self._edge("step_stall", None, False)
        return self._take()

    def observe_ranks(self, steps: Mapping[int, Sequence[Any]], now: float) -> list[Event]:
        """``rank_straggler``: a rank of this node whose own work per step (step time minus
        communication) is above its peers' (checks/rank_straggler.py); once per rank while
        it lasts."""
        from slurmhealth.checks.rank_straggler import rank_stragglers

        slow = {s.rank: s for s in rank_stragglers(steps)}
        for rank in steps:
            s = slow.get(rank)
            if self._edge("rank_straggler", rank, s is not None) and s is not None:
                self._emit(now, "rank_straggler", s.text, None, rank=rank, cause=s.cause,
                           own_seconds=round(s.own_seconds, 6), steps=s.steps,
                           peers_seconds=round(s.peers_median, 6))  # fmt: skip
        return self._take()

    def _throughput_drop(self, stats: TaskStats, now: float) -> None:
        metric, value = "samples_per_second", stats.samples_per_second
        if value is None:
            metric, value = "tokens_per_second", stats.tokens_per_second
        if value is None:
            return
        if metric != self._throughput_metric:
            self._throughput.clear()
            self._throughput_metric = metric
            self._edge("throughput_drop", None, False)
        history = list(self._throughput)
        self._throughput.append(value)
        if len(history) < MIN_THROUGHPUT_VALUES:
            return
        median = _median(history)
        floor = (1.0 - self.cfg.throughput_drop) * median
        if self._edge("throughput_drop", None, value < floor):
            drop = 100 * (1 - value / median)
            what = metric.replace("_", " ")
            msg = f"{what} {value:.4g}, {drop:.0f}% below the job's median {median:.4g}"
            ev = {"value": value, "median": median, "threshold": round(floor, 6)}
            self._emit(now, "throughput_drop", msg, None, metric=metric, **ev)
