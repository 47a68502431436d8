"""Job-labelled GPU metrics for Prometheus, built by the per-job sidecar.

Names follow dcgm-exporter's semantics under the ``slurmhealth_`` prefix with base units
(ratios 0-1, bytes, celsius, watts, hertz, ``_total`` counters). ``None`` in the state means
"unknown / not supported": no sample is exported, never a 0.

The cardinality budget (docs/metrics.md): per-GPU series carry only :data:`GPU_LABELS` (with
``job_labels="info"`` only the GPU's, ``series_labels``); the job's other facts (account,
partition, QOS, name, GPUs and their model) are on one ``slurmhealth_job_info`` series, and
``slurmhealth_job_gpu_info`` names each GPU's job, to join with ``group_left``.
NVLinks are summed per GPU (errors by counter, links down) unless ``per_link_nvlink``; an
RDMA port's error counters are summed (``counter="all"``) unless ``per_counter_rdma``.
In ``mode="dcgm"`` dcgm-exporter owns the GPU counters: only health, Xids, events, job and
task series are built here.

Nothing registers on import; callers own the registry::

    registry = CollectorRegistry()
    registry.register(SidecarCollector(lambda: current_state))
    body = render(registry)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from slurmhealth.metrics.exposition import CONTENT_TYPE, render, serve
from slurmhealth.metrics.mig_series import mig_families
from slurmhealth.metrics.series_labels import (
    GPU_INFO,
    GPU_INFO_LABELS,
    JOB_LABEL_MODES,
    SeriesLabels,
)
from slurmhealth.model import CLOCK_EVENT_REASONS, GpuState, GpuStatus
from slurmhealth.model_records import GPU_LABELS, JOB_LABELS, ExportState, Job, job_label_values
from slurmhealth.rdma.model import ERROR_COUNTERS

__all__ = ["CONTENT_TYPE", "GPU_LABELS", "JOB_LABELS", "SidecarCollector", "render", "serve"]

INFO_LABELS = (*JOB_LABELS, "account", "partition", "qos", "job_name", "gpus", "gpu_model")
MODES = ("slurmhealth", "dcgm")


_Get = Callable[[GpuState], float | None]


def _ratio(pct: int | None) -> float | None:
    return None if pct is None else pct / 100.0


def _flag(value: bool | None) -> float | None:
    return None if value is None else (1.0 if value else 0.0)


def _mhz(mhz: int | None) -> float | None:
    return None if mhz is None else mhz * 1e6


# name (without prefix), help, getter: one sample per GPU, labels GPU_LABELS
_GPU_GAUGES: tuple[tuple[str, str, _Get], ...] = (
    ("gpu_utilization_ratio", "Share of time a kernel ran, 0-1 (nvidia-smi utilization.gpu/100, "
     "DCGM_FI_DEV_GPU_UTIL).", lambda g: _ratio(g.utilization_gpu_pct)),
    ("gpu_memory_utilization_ratio", "Share of time device memory was read or written, 0-1 "
     "(nvidia-smi utilization.memory/100, DCGM_FI_DEV_MEM_COPY_UTIL).",
     lambda g: _ratio(g.utilization_memory_pct)),
    ("gpu_memory_used_bytes", "Framebuffer memory used (nvidia-smi memory.used, "
     "DCGM_FI_DEV_FB_USED).", lambda g: g.memory_used_bytes),
    ("gpu_memory_total_bytes", "Framebuffer memory total (nvidia-smi memory.total, "
     "DCGM_FI_DEV_FB_TOTAL).", lambda g: g.memory_total_bytes),
    ("gpu_temperature_celsius", "GPU core temperature (nvidia-smi temperature.gpu, "
     "DCGM_FI_DEV_GPU_TEMP).", lambda g: g.temperature_c),
    ("gpu_thermal_margin_celsius", "Degrees left before the GPU slows down "
     "(nvidia-smi -q GPU T.Limit Temp, nvmlDeviceGetMarginTemperature).",
     lambda g: g.margin_temperature_c),
    ("gpu_power_watts", "Power draw (nvidia-smi power.draw, DCGM_FI_DEV_POWER_USAGE).",
     lambda g: g.power_w),
    ("gpu_power_limit_watts", "Enforced power limit (nvidia-smi enforced.power.limit, "
     "DCGM_FI_DEV_POWER_MGMT_LIMIT).", lambda g: g.power_limit_w),
    ("gpu_sm_clock_hertz", "SM clock (nvidia-smi clocks.sm in MHz*1e6, DCGM_FI_DEV_SM_CLOCK).",
     lambda g: _mhz(g.sm_clock_mhz)),
    ("gpu_row_remap_pending", "1 when a row remap waits for a GPU reset (nvidia-smi -q "
     "Remapped Rows Pending, DCGM_FI_DEV_ROW_REMAP_PENDING).", lambda g: _flag(g.remap_pending)),
    ("gpu_row_remap_failure", "1 when a row remap failed (nvidia-smi -q Remapped Rows "
     "Remapping Failure Occurred, DCGM_FI_DEV_ROW_REMAP_FAILURE).",
     lambda g: _flag(g.remap_failure)),
    ("gpu_pcie_link_gen", "Current PCIe link generation (nvidia-smi pcie.link.gen.current, "
     "DCGM_FI_DEV_PCIE_LINK_GEN).", lambda g: g.pcie_gen),
    ("gpu_pcie_link_width", "Current PCIe link width in lanes (nvidia-smi "
     "pcie.link.width.current, DCGM_FI_DEV_PCIE_LINK_WIDTH).", lambda g: g.pcie_width),
)  # fmt: skip

_GPU_COUNTERS: tuple[tuple[str, str, _Get], ...] = (
    ("gpu_energy_joules", "Energy used since the driver loaded (nvmlDeviceGetTotalEnergy"
     "Consumption, DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION).", lambda g: g.energy_j),
    ("gpu_pcie_replay_errors", "PCIe replays (nvidia-smi -q Replays Since Reset, "
     "DCGM_FI_DEV_PCIE_REPLAY_COUNTER).", lambda g: g.pcie_replay_errors),
)  # fmt: skip

_NVLINK_COUNTERS = (
    ("replay", "replay_errors"),
    ("recovery", "recovery_errors"),
    ("crc_flit", "crc_flit_errors"),
    ("crc_data", "crc_data_errors"),
)

_TASK_GAUGES = (
    ("job_step_seconds", "step_seconds", "Median training step time over the recent window."),
    ("job_samples_per_second", "samples_per_second", "Training samples per second."),
    ("job_tokens_per_second", "tokens_per_second", "Training tokens per second."),
    ("job_mfu_ratio", "mfu_ratio", "Model FLOPs utilisation, 0-1."),
    ("job_comm_ratio", "comm_ratio", "Share of step time spent in communication, 0-1."),
    ("job_data_wait_ratio", "data_wait_ratio", "Share of step time waiting for data, 0-1."),
    ("job_last_step_time_seconds", "last_step_ts", "Unix time of the last reported step."),
)

_HELP = {
    "gpu_up": "1 when the GPU answers NVML normally, else 0; `status` says why (nvidia-smi -q "
    "readable or not, DCGM health).",
    "clock": "1 while the clock event reason holds clocks down (nvidia-smi "
    "clocks_event_reasons.*, DCGM_FI_DEV_CLOCK_THROTTLE_REASONS bits); reasons that do "
    "not hold have no series (the cardinality budget).",
    "nvlink_up": "1 when the NVLink is active, 0 when inactive (nvidia-smi nvlink -s).",
    "nvlink": "NVLink error counters of one link (nvidia-smi nvlink -e, "
    "DCGM_FI_DEV_NVLINK_{REPLAY,RECOVERY,CRC_FLIT,CRC_DATA}_ERROR_COUNT_L*).",
    "nvlink_sum": "NVLink error counters summed over the GPU's links (nvidia-smi nvlink -e, "
    "DCGM_FI_DEV_NVLINK_{REPLAY,RECOVERY,CRC_FLIT,CRC_DATA}_ERROR_COUNT_TOTAL).",
    "links_down": "NVLinks of the GPU that are inactive (nvidia-smi nvlink -s).",
    "ecc": "Uncorrectable ECC errors (nvidia-smi ecc.errors.uncorrected.volatile/aggregate.total, "
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL / DCGM_FI_DEV_ECC_DBE_AGG_TOTAL).",
    "remap": "Rows remapped (nvidia-smi -q Remapped Rows, DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS / "
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS).",
    "info": "Slurm job running on this node, value 1: its account, partition, QOS and name, "
    "`gpus`, its GPU indices (scontrol show job), `gpu_model` (nvidia-smi name). Join with "
    "group_left.",
    "gpu_info": "The Slurm job using this GPU, value 1 (one series per job and GPU): join "
    "per-GPU series with `* on (node, gpu) group_left (job_id, user, ...)`; with [metrics] "
    'job_labels = "info" they carry no job labels of their own.',
    "xid": "Xid errors seen in the kernel log per GPU and Xid (dmesg NVRM: Xid, "
    "DCGM_FI_DEV_XID_ERRORS).",
    "events": "Events the sidecar's detectors raised, by kind and GPU (gpu is empty for "
    "job-level events).",
}

P = "slurmhealth_"


def _gauge(name: str, doc: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
    return GaugeMetricFamily(P + name, doc, labels=labels)


def _counter(name: str, doc: str, labels: tuple[str, ...]) -> CounterMetricFamily:
    return CounterMetricFamily(P + name, doc, labels=labels)


def _info_values(job: Job) -> tuple[str, ...]:
    name: Any = getattr(job, "job_name", "") or getattr(job, "name", "")
    return (job.account, job.partition, job.qos, str(name or ""))


class _GpuFamilies:
    """The per-GPU families of one scrape, filled GPU by GPU."""

    def __init__(self, per_link: bool, full: bool, names: tuple[str, ...] = GPU_LABELS) -> None:
        self.per_link, self.full = per_link, full
        self.gauges = [(_gauge(n, d, names), get) for n, d, get in _GPU_GAUGES] if full else []
        self.counters = [(_counter(n, d, names), g) for n, d, g in _GPU_COUNTERS] if full else []
        self.up = _gauge("gpu_up", _HELP["gpu_up"], (*names, "status"))
        self.clock = _gauge("gpu_clock_event_active", _HELP["clock"], (*names, "reason"))
        self.ecc = _counter("gpu_ecc_uncorrectable_errors", _HELP["ecc"], (*names, "scope"))
        self.remap = _counter("gpu_remapped_rows", _HELP["remap"], (*names, "kind"))
        self.down = _gauge("gpu_nvlink_links_down", _HELP["links_down"], names)
        self.err_sum = _counter("gpu_nvlink_errors", _HELP["nvlink_sum"], (*names, "counter"))
        self.link_up = _gauge("gpu_nvlink_link_up", _HELP["nvlink_up"], (*names, "link"))
        self.link_err = _counter(
            "gpu_nvlink_link_errors", _HELP["nvlink"], (*names, "link", "counter")
        )

    def add(self, g: GpuState, lv: tuple[str, ...]) -> None:
        self.up.add_metric((*lv, g.status.value), 1.0 if g.status is GpuStatus.OK else 0.0)
        if not self.full:
            return
        for fam, get in self.gauges:
            if (v := get(g)) is not None:
                fam.add_metric(lv, v)
        for cfam, get in self.counters:
            if (v := get(g)) is not None:
                cfam.add_metric(lv, v)
        if (bits := g.clock_event_reasons) is not None:
            for reason, bit in CLOCK_EVENT_REASONS.items():
                if bits & bit:
                    self.clock.add_metric((*lv, reason), 1.0)
        for cnt, label, n in (
            (self.ecc, "volatile", g.ecc_volatile_uncorrectable),
            (self.ecc, "aggregate", g.ecc_aggregate_uncorrectable),
            (self.remap, "correctable", g.remapped_rows_correctable),
            (self.remap, "uncorrectable", g.remapped_rows_uncorrectable),
        ):
            if n is not None:
                cnt.add_metric((*lv, label), n)
        self._nvlinks(g, lv)

    def _nvlinks(self, g: GpuState, lv: tuple[str, ...]) -> None:
        links = g.nvlinks or ()
        known = [link.active for link in links if link.active is not None]
        if known:
            self.down.add_metric(lv, sum(1 for a in known if not a))
        for counter, attr in _NVLINK_COUNTERS:
            values = [n for link in links if (n := getattr(link, attr)) is not None]
            if values:
                self.err_sum.add_metric((*lv, counter), sum(values))
        if not self.per_link:
            return
        for link in links:
            ll = (*lv, str(link.link))
            if link.active is not None:
                self.link_up.add_metric(ll, 1.0 if link.active else 0.0)
            for counter, attr in _NVLINK_COUNTERS:
                if (n := getattr(link, attr)) is not None:
                    self.link_err.add_metric((*ll, counter), n)

    def families(self) -> Iterator[Metric]:
        yield from (fam for fam, _ in self.gauges)
        yield self.up
        if not self.full:
            return
        yield from (fam for fam, _ in self.counters)
        yield from (self.clock, self.ecc, self.remap, self.down, self.err_sum)
        if self.per_link:
            yield from (self.link_up, self.link_err)


class SidecarCollector(Collector):
    """A custom collector: every scrape rebuilds all families from ``get_state()``.

    ``mode`` "slurmhealth" exports the GPU counters, "dcgm" leaves them to dcgm-exporter;
    ``per_link_nvlink`` adds one series per NVLink (18 per H100) and counter;
    ``per_counter_rdma`` splits an RDMA port's error series by counter (8 instead of 1);
    ``job_labels`` "series" puts the job's labels on every series, "info" only on
    ``slurmhealth_job_gpu_info`` and the job-level series (:class:`SeriesLabels`).
    """

    def __init__(
        self,
        get_state: Callable[[], ExportState],
        *,
        mode: str = "slurmhealth",
        per_link_nvlink: bool = False,
        per_counter_rdma: bool = False,
        job_labels: str = "series",
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"metrics mode must be one of {', '.join(MODES)}, got {mode!r}")
        if job_labels not in JOB_LABEL_MODES:
            raise ValueError(f"metrics job_labels must be series or info, got {job_labels!r}")
        self._job_labels = job_labels
        self._get_state = get_state
        self._full = mode == "slurmhealth"
        self._per_link, self._per_counter_rdma = per_link_nvlink, per_counter_rdma
        # uuid/model of each GPU index as last seen, so xid series keep their labels even
        # when the GPU is lost and NVML no longer reports its UUID.
        self._ident: dict[int, tuple[str, str]] = {}

    def describe(self) -> list[Metric]:
        return []  # registering must not call collect()

    def collect(self) -> Iterator[Metric]:
        state = self._get_state()
        snap = state.snapshot
        job = job_label_values(state.labels, snap.node if snap is not None else "")
        lab = SeriesLabels(self._job_labels, job)
        gpus = snap.gpus if snap is not None else ()
        fams = _GpuFamilies(self._per_link, self._full, lab.gpu_names)
        models = []
        for g in gpus:
            uuid, model = self._identity(g)
            fams.add(g, lab.gpu(g.index, uuid))
            models.append(model)
        yield from fams.families()
        if self._full:  # per MIG instance: the job's labels in both modes (docs/mig.md)
            yield from mig_families(gpus, job)
        yield _gpu_info(state.labels, lab, gpus)
        yield from self._job_families(state, lab, gpus, next((m for m in models if m), ""))

    def _identity(self, g: GpuState) -> tuple[str, str]:
        uuid, model = g.uuid or "", g.name or ""
        if g.uuid:
            self._ident[g.index] = (uuid, model)
        elif g.index in self._ident:
            uuid, model = self._ident[g.index][0], model or self._ident[g.index][1]
        return uuid, model

    def _job_families(
        self, state: ExportState, lab: SeriesLabels, gpus: tuple[GpuState, ...], model: str
    ) -> Iterator[Metric]:
        job = lab.job
        info = _gauge("job_info", _HELP["info"], INFO_LABELS)
        gpu_list = ",".join(str(g.index) for g in gpus)
        info.add_metric((*job, *_info_values(state.labels), gpu_list, model), 1.0)
        yield info
        xid = _counter("gpu_xid_errors", _HELP["xid"], (*lab.gpu_names, "xid"))
        by_index = {g.index: g for g in gpus}
        for (index, code), n in sorted(state.xid_counts.items()):
            g = by_index.get(index)
            uuid = g.uuid if g is not None and g.uuid else self._ident.get(index, ("", ""))[0]
            xid.add_metric((*lab.gpu(index, uuid), str(code)), n)
        yield xid
        events = _counter("events", _HELP["events"], (*JOB_LABELS, "kind", "gpu"))
        for (kind, gpu), n in sorted(state.event_counts.items(), key=_event_key):
            events.add_metric((*job, kind, "" if gpu is None else str(gpu)), n)
        yield events
        samples = _counter("sidecar_samples", "GPU snapshots the sidecar took.", JOB_LABELS)
        samples.add_metric(job, state.samples_total)
        yield samples
        yield from _task_families(state, job)
        yield from _rdma_families(state, lab, self._per_counter_rdma)


def _gpu_info(job: Job, lab: SeriesLabels, gpus: tuple[GpuState, ...]) -> Metric:
    """One ``slurmhealth_job_gpu_info`` series per GPU of the job (both modes)."""
    info = GaugeMetricFamily(GPU_INFO, _HELP["gpu_info"], labels=GPU_INFO_LABELS)
    job_id, user, priority, node = lab.job
    for g in gpus:
        info.add_metric((job_id, user, job.account, job.partition, job.qos, priority, node,
                         str(g.index)), 1.0)  # fmt: skip
    return info


def _task_families(state: ExportState, job: tuple[str, ...]) -> Iterator[Metric]:
    task = state.task
    if task is None:
        return
    steps = _counter("job_steps", "Training steps the job reported.", JOB_LABELS)
    steps.add_metric(job, task.steps_total)
    yield steps
    for name, attr, doc in _TASK_GAUGES:
        value: Any = getattr(task, attr)
        if value is not None:
            fam = _gauge(name, doc, JOB_LABELS)
            fam.add_metric(job, float(value))
            yield fam


_RDMA_HELP = {
    "up": "1 when the RDMA port is ACTIVE with its physical link LinkUp, else 0; `state` is "
    "state/physical state (ibstat State / Physical state, /sys/class/infiniband/*/ports/*/state).",
    "rate": "The port's data rate, active width x lane speed, in bytes per second (ibstat "
    "Rate in Gb/s x 1e9 / 8).",
    "errors": "RDMA port error counters (perfquery, /sys/class/infiniband/*/ports/*/counters: "
    'symbol_error, link_downed, port_rcv_errors, ...): counter="all" is their sum, or one '
    "series per counter with [metrics] per_counter_rdma, never both.",
    "rx": "Bytes the port received (counters/port_rcv_data x 4: the counter is in 4-byte words).",
    "tx": "Bytes the port sent (counters/port_xmit_data x 4: the counter is in 4-byte words).",
}
RDMA_ERROR_COUNTERS = (*ERROR_COUNTERS, "port_rcv_remote_physical_errors")
"""The error counters exported per port: those the checks judge (rdma.model) and the remote
physical errors, their sum (one series) or each (8 series)."""


def _rdma_families(state: ExportState, lab: SeriesLabels, per_counter: bool) -> Iterator[Metric]:
    """Per judged RDMA port of the node (not per GPU): state, rate, errors, bytes. The
    errors are one ``counter="all"`` series (the sum of the counters the port reports), or
    one per counter when ``per_counter``: never both, so ``sum by (hca, port)`` holds."""
    if state.rdma is None:
        return
    names = lab.port_names
    up = _gauge("rdma_port_up", _RDMA_HELP["up"], (*names, "state"))
    rate = _gauge("rdma_port_rate_bytes_per_second", _RDMA_HELP["rate"], names)
    errors = _counter("rdma_port_errors", _RDMA_HELP["errors"], (*names, "counter"))
    rx = _counter("rdma_port_received_bytes", _RDMA_HELP["rx"], names)
    tx = _counter("rdma_port_transmitted_bytes", _RDMA_HELP["tx"], names)
    for p in state.rdma.ports():
        lv = lab.port(p.hca, p.port)
        if p.active is not None or p.link_up is not None:
            text = f"{p.state_name or '?'}/{p.phys_state_name or '?'}"
            up.add_metric((*lv, text), 1.0 if p.active and p.link_up is not False else 0.0)
        if p.rate is not None:
            rate.add_metric(lv, p.rate.gbps * 1e9 / 8)
        known = {c: n for c in RDMA_ERROR_COUNTERS if (n := p.counters.get(c)) is not None}
        if known and not per_counter:
            known = {"all": sum(known.values())}
        for name, n in known.items():
            errors.add_metric((*lv, name), n)
        sent, received = p.data_bytes()
        if received is not None:
            rx.add_metric(lv, received)
        if sent is not None:
            tx.add_metric(lv, sent)
    yield from (up, rate, errors, rx, tx)


def _event_key(item: tuple[tuple[str, int | None], int]) -> tuple[str, int]:
    (kind, gpu), _ = item
    return (kind, -1 if gpu is None else gpu)
