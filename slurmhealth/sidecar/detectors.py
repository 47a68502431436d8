"""In-job fault detectors: snapshots, Xids and task stats in, :class:`Event` s out.

Pure and deterministic: no I/O, no clock reads; time comes from ``snapshot.ts``, the Xid's own
``ts`` or an explicit ``now``. Every detector is edge-triggered: an event is emitted once, when
its condition starts (or is confirmed), and the same condition on the same GPU (link, metric)
fires again only after it has cleared. ``None`` (unknown) never confirms a condition.

- State conditions (``gpu_lost``, ``nvlink_down``, ``row_remap``, ``throttle``) are judged from
  the first snapshot on, so a fault already present when the sidecar starts is recorded once.
  Counter conditions (``ecc``, ``nvlink_errors``) need a previous snapshot: counts from before
  the job are the prolog's business; continuous growth is one event until an interval passes
  without growth.
- ``hang`` counts idle time from the job start (the first snapshot), not only after the GPUs
  were busy once: a job stuck in NCCL init or deadlocked before its first kernel hangs too.
  ``hang_after_s`` (default 15 min) leaves room for slow model loading.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from slurmhealth.checks import REGISTRY
from slurmhealth.checks.nvlink import counters_of
from slurmhealth.checks.thermal import REASONS
from slurmhealth.checks.xid_table import classify
from slurmhealth.config import SidecarConfig
from slurmhealth.model import GpuState, GpuStatus, NodeSnapshot, Severity, XidEvent
from slurmhealth.model import normalize_pci_bus_id as _norm_bus
from slurmhealth.sidecar.state import Event, TaskStats

KINDS: Mapping[str, Severity] = {
    "xid": Severity.INFO,  # per Xid from the catalog (classify): INFO up to CRITICAL
    "gpu_lost": Severity.CRITICAL,
    "nvlink_down": Severity.CRITICAL,
    "nvlink_errors": Severity.FAIL,
    "throttle": Severity.FAIL,
    "ecc": Severity.FAIL,
    "row_remap": Severity.FAIL,
    "hang": Severity.CRITICAL,
    "straggler": Severity.WARN,
    "throughput_drop": Severity.WARN,
    "step_stall": Severity.FAIL,
}
"""Every event kind and its severity (``xid``: the Xid catalog decides per Xid)."""

LOST_STATUSES = frozenset({GpuStatus.LOST, GpuStatus.UNRESPONSIVE, GpuStatus.RESET_REQUIRED})
HW_THROTTLE_MASK = 0x8 | 0x40 | 0x80  # HW slowdown, HW thermal slowdown, HW power brake
XID_DEDUPE_S = 2.0  # the same Xid on the same GPU this close in time: one event (two sources)
THROUGHPUT_HISTORY = 100  # task throughput values kept for the rolling median
MIN_THROUGHPUT_VALUES = 5
MIN_STALL_STEPS = 3
STRAGGLER_BUSY_PCT = 50.0  # the peers' median utilisation at least this: the job is running


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return math.fsum(known) / len(known) if known else None


class Detectors:
    """Per-job detectors: one :meth:`observe` per sampling interval, Xids and task stats as
    they come. Memory is bounded by the job's GPUs, links and the straggler window.

    ``gpus`` are the job's GPU indices (empty: every GPU of the snapshot).
    ``nvlink_thresholds`` overrides the ``nvlink_errors`` check's thresholds
    (``replay_per_min``, ``recovery_per_min``, ``crc_fail_per_s``).
    """

    def __init__(
        self,
        cfg: SidecarConfig,
        gpus: Sequence[int],
        nvlink_thresholds: Mapping[str, float] | None = None,
    ) -> None:
        self.cfg = cfg
        self.gpus = tuple(sorted(set(gpus)))
        spec = REGISTRY.get("nvlink_errors")
        self._nvlink_th = {
            "replay_per_min": 1.0,
            "recovery_per_min": 1.0,
            "crc_fail_per_s": 100.0,
            **(spec.thresholds if spec else {}),
            **(nvlink_thresholds or {}),
        }
        self._window_n = max(2, round(cfg.straggler_window_s / max(cfg.interval_s, 1e-3)))
        self._out: list[Event] = []
        self._active: set[tuple[str, Hashable]] = set()  # (kind, key) of conditions that fired
        self._since: dict[tuple[str, Hashable], float] = {}  # when a sustained condition began
        self._last: NodeSnapshot | None = None
        self._link_expected: dict[int, set[int]] = {}
        self._counters: dict[str, dict[str, int]] = {}
        self._link_errors: dict[int, set[int]] = {}  # links whose error growth fired
        self._ecc_last: dict[int, int] = {}
        self._samples: dict[int, deque[tuple[float, float, float | None]]] = {}
        self._xids_seen: deque[tuple[int, str, float]] = deque(maxlen=64)
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
        """Judge one snapshot against the previous ones; return the events that start now."""
        ts = snapshot.ts
        if self.gpus:
            gpus = [g for i in self.gpus if (g := snapshot.gpu(i)) is not None]
        else:
            gpus = sorted(snapshot.gpus, key=lambda g: g.index)
        for g in gpus:
            if self._edge("gpu_lost", g.index, g.status in LOST_STATUSES):
                msg = f"GPU {g.index} {g.status.value.replace('_', ' ')}"
                self._emit(ts, "gpu_lost", msg, g, status=g.status.value, error=g.error)
        readable = [g for g in gpus if g.readable]
        self._nvlink_down(ts, readable)
        self._nvlink_errors(snapshot, readable)
        for g in readable:
            self._throttle(ts, g)
            self._ecc(ts, g)
            self._row_remap(ts, g)
        self._hang(ts, gpus)
        self._straggler(ts, gpus)
        self._last = snapshot
        return self._take()

    def _nvlink_down(self, ts: float, gpus: list[GpuState]) -> None:
        """A link active before (or, on a node with active links, any reported link) down."""
        node_has_links = any(link.active for g in gpus for link in g.nvlinks or ())
        for g in gpus:
            expected = self._link_expected.setdefault(g.index, set())
            for link in g.nvlinks or ():
                if link.active:
                    expected.add(link.link)
                if link.active is None:  # unknown: keep the state
                    continue
                down = not link.active and (link.link in expected or node_has_links)
                if self._edge("nvlink_down", (g.index, link.link), down):
                    msg = f"NVLink {link.link} of GPU {g.index} down"
                    remote = link.remote_pci_bus_id
                    self._emit(ts, "nvlink_down", msg, g, link=link.link, remote_pci_bus_id=remote)

    def _nvlink_errors(self, snapshot: NodeSnapshot, gpus: list[GpuState]) -> None:
        """Same math as the ``nvlink_errors`` check, between consecutive snapshots."""
        prev, before = self._last, self._counters
        now = self._counters = counters_of(snapshot)
        if prev is None or snapshot.ts <= prev.ts:
            return
        dt = snapshot.ts - prev.ts
        th = self._nvlink_th
        for g in gpus:
            cur, old = now.get(g.uuid or "", {}), before.get(g.uuid or "", {})
            rates: dict[int, dict[str, float]] = {}
            for key, value in cur.items() if cur != old else ():
                was = old.get(key)  # lower: counters reset by a driver reload
                if was is not None and value > was:
                    link_no, name = key.split(".", 1)
                    rates.setdefault(int(link_no), {})[name] = (value - was) / dt
            firing, fired = set(), self._link_errors.get(g.index, set())
            for link, r in sorted(rates.items()):
                replay_pm = round(r.get("replay_errors", 0.0) * 60, 3)
                recovery_pm = round(r.get("recovery_errors", 0.0) * 60, 3)
                crc_ps = round(r.get("crc_flit_errors", 0.0) + r.get("crc_data_errors", 0.0), 3)
                if (
                    replay_pm < th["replay_per_min"]
                    and recovery_pm < th["recovery_per_min"]
                    and crc_ps < th["crc_fail_per_s"]
                ):
                    continue
                firing.add(link)
                if link in fired:
                    continue
                msg = (
                    f"NVLink {link} of GPU {g.index} errors growing: replay {replay_pm:.3g}/min, "
                    f"recovery {recovery_pm:.3g}/min, CRC {crc_ps:.3g}/s over {dt:.0f} s"
                )
                ev = {"replay_per_min": replay_pm, "recovery_per_min": recovery_pm}
                ev |= {"crc_per_s": crc_ps, "window_s": round(dt, 3)}
                self._emit(snapshot.ts, "nvlink_errors", msg, g, link=link, **ev)
            self._link_errors[g.index] = firing

    def _throttle(self, ts: float, g: GpuState) -> None:
        mask = g.clock_event_reasons
        if mask is None:  # unknown: neither confirms nor clears
            return
        hold = self.cfg.throttle_sustain_s
        at = self._sustained("throttle", g.index, ts, bool(mask & HW_THROTTLE_MASK), hold)
        if at is None:
            return
        reasons = [name for bit, (name, _) in REASONS.items() if mask & bit & HW_THROTTLE_MASK]
        text = ", ".join(r.replace("_", " ") for r in reasons)
        msg = f"GPU {g.index} clocks cut by {text} for {hold:.0f} s"
        ev = {"sm_clock_mhz": g.sm_clock_mhz, "temperature_c": g.temperature_c}
        self._emit(at, "throttle", msg, g, reason=",".join(reasons), since=at - hold, **ev)

    def _ecc(self, ts: float, g: GpuState) -> None:
        count = g.ecc_volatile_uncorrectable
        if count is None:
            return
        before = self._ecc_last.get(g.index)
        self._ecc_last[g.index] = count
        if self._edge("ecc", g.index, before is not None and count > before):
            msg = f"GPU {g.index} volatile uncorrectable ECC errors {before} -> {count}"
            self._emit(ts, "ecc", msg, g, before=before, after=count)

    def _row_remap(self, ts: float, g: GpuState) -> None:
        if g.remap_pending is None and g.remap_failure is None:
            return
        failure = g.remap_failure is True
        if self._edge("row_remap", g.index, failure or g.remap_pending is True):
            msg = f"GPU {g.index} row remap {'failure' if failure else 'pending'}"
            ev = {"remap_pending": g.remap_pending, "remap_failure": g.remap_failure}
            self._emit(ts, "row_remap", msg, g, **ev, rows=g.remapped_rows_uncorrectable)

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
        """A GPU whose mean utilisation (else power) over the window is below
        ``straggler_ratio`` x its peers' median while the peers are busy."""
        horizon = ts - self.cfg.straggler_window_s
        for g in gpus:
            buf = self._samples.setdefault(g.index, deque(maxlen=self._window_n))
            if g.readable and g.utilization_gpu_pct is not None:
                buf.append((ts, float(g.utilization_gpu_pct), g.power_w))
            while buf and buf[0][0] <= horizon:
                buf.popleft()
        full = {g.index: self._samples[g.index] for g in gpus}
        full = {i: buf for i, buf in full.items() if len(buf) >= self._window_n}
        util = {i: math.fsum(s[1] for s in buf) / len(buf) for i, buf in full.items()}
        power = {i: _mean([s[2] for s in buf]) for i, buf in full.items()}
        ratio, window = self.cfg.straggler_ratio, self.cfg.straggler_window_s
        for g in gpus:
            i = g.index
            slow, metric, mine, peers = False, "utilization", 0.0, 0.0
            if len(full) >= 2 and i in full:
                peers_util = _median([u for j, u in util.items() if j != i])
                peer_power = [p for j, p in power.items() if j != i and p is not None]
                if peers_util >= STRAGGLER_BUSY_PCT:
                    mine, peers = util[i], peers_util
                    slow = mine < ratio * peers
                    my_power = power[i]
                    if not slow and my_power is not None and peer_power:
                        metric, mine, peers = "power", my_power, _median(peer_power)
                        slow = mine < ratio * peers
            if self._edge("straggler", i, slow):
                unit = "%" if metric == "utilization" else " W"
                msg = (
                    f"GPU {i} lags its peers: mean {metric} {mine:.0f}{unit} vs the peers' "
                    f"median {peers:.0f}{unit} over {window:.0f} s"
                )
                ev = {"mean": round(mine, 3), "peers_median": round(peers, 3)}
                self._emit(ts, "straggler", msg, g, metric=metric, **ev, window_s=window)

    # -- Xids --------------------------------------------------------------------------------

    def observe_xids(
        self,
        xids: Sequence[XidEvent],
        gpu_by_bus: Mapping[str, int],
        uuid_by_gpu: Mapping[int, str | None] | None = None,
        now: float | None = None,
    ) -> list[Event]:
        """One ``xid`` event per Xid, severity from the Xid catalog (application Xids are
        INFO, node Xids FAIL/CRITICAL: every Xid is recorded, the severity says what matters).

        ``gpu_by_bus`` maps PCI bus ids (any spelling) to GPU indices (the job's or the whole
        node's). An Xid on a GPU that is not the job's is skipped; so is one on an unmapped
        bus id when every job GPU's bus id is known, else it is kept with ``gpu=None``.
        The same Xid on the same bus within ``XID_DEDUPE_S`` (NVML's event API and the kernel
        log both delivered it) is one event. ``ts`` is the Xid's own time, else ``now``, else
        the last snapshot's.
        """
        buses: dict[str, int] = {}
        for bus, idx in gpu_by_bus.items():
            try:
                buses[_norm_bus(bus)] = idx
            except ValueError:
                continue
        covered = set(self.gpus) <= set(buses.values())
        for x in xids:
            try:
                bus = _norm_bus(x.pci_bus_id)
            except ValueError:
                bus = x.pci_bus_id
            gpu = buses.get(bus)
            if self.gpus and (gpu not in self.gpus if gpu is not None else covered):
                continue
            last_ts = 0.0 if self._last is None else self._last.ts
            ts = x.ts if x.ts is not None else now if now is not None else last_ts
            seen = self._xids_seen
            if any(n == x.xid and b == bus and abs(t - ts) <= XID_DEDUPE_S for n, b, t in seen):
                continue
            seen.append((x.xid, bus, ts))
            state = None if gpu is None or self._last is None else self._last.gpu(gpu)
            info = classify(x.xid, None if state is None else state.remap_pending)
            where = f"GPU {gpu}" if gpu is not None else f"PCI {bus}"
            evidence = {
                "xid": x.xid,
                "name": info.name,
                "action": info.action.value,
                "hint": info.hint,
                "pci_bus_id": bus,
                "pid": x.pid,
                "process_name": x.process_name,
                "text": x.message,
            }
            uuid = None if gpu is None else (uuid_by_gpu or {}).get(gpu)
            msg = f"Xid {x.xid} {info.name} on {where}"
            self._out.append(Event(ts, "xid", info.severity, msg, gpu, uuid, evidence))
        return self._take()

    # -- task metrics ------------------------------------------------------------------------

    def observe_task(self, stats: TaskStats, now: float) -> list[Event]:
        """``throughput_drop`` and ``step_stall`` from what the training loop reported.

        Throughput is judged once per new data (``steps_total`` grew) against the rolling
        median of the previous values (at least ``MIN_THROUGHPUT_VALUES`` of them); a stall
        is ``now - last_step_ts > stall_factor x`` the median step time, after 3 steps.
        """
        if stats.steps_total > self._task_steps:
            self._task_steps = stats.steps_total
            self._throughput_drop(stats, now)
        step_s, last = stats.step_seconds, stats.last_step_ts
        if step_s and last is not None and stats.steps_total >= MIN_STALL_STEPS:
            limit = self.cfg.stall_factor * step_s
            if self._edge("step_stall", None, now - last > limit):
                msg = f"no training step for {now - last:.0f} s (median step {step_s:.3g} s)"
                ev = {"last_step_ts": last, "step_seconds": step_s}
                since = round(now - last, 3)
                self._emit(last + limit, "step_stall", msg, None, **ev, seconds_since_step=since)
        else:
            self._edge("step_stall", None, False)
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
