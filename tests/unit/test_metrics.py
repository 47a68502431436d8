"""The sidecar's Prometheus collector: names, units, labels, None handling, speed."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from slurmhealth.config import Config
from slurmhealth.metrics.job_series import (
    GPU_LABELS,
    INFO_LABELS,
    JOB_LABELS,
    RDMA_ERROR_COUNTERS,
    SidecarCollector,
    render,
)
from slurmhealth.metrics.series_labels import GPU_INFO_LABELS
from slurmhealth.model import GpuState, GpuStatus, NodeSnapshot, NvLink
from slurmhealth.model_records import ExportState, Job, TaskStats
from slurmhealth.rdma.model import Hca, IbPort, Rate, RdmaSnapshot
from slurmhealth.sidecar.rdma import exports_rdma
from tests.prometheus_util import promtool

GIB = 1024**3
LABELS = Job(
    job_id="4242", node="", user="alice", account="ml", partition="gpu", qos="normal", priority=1000
)

EXPECTED_NAMES = {
    # per-GPU gauges
    "slurmhealth_gpu_utilization_ratio",
    "slurmhealth_gpu_memory_utilization_ratio",
    "slurmhealth_gpu_memory_used_bytes",
    "slurmhealth_gpu_memory_total_bytes",
    "slurmhealth_gpu_temperature_celsius",
    "slurmhealth_gpu_thermal_margin_celsius",
    "slurmhealth_gpu_power_watts",
    "slurmhealth_gpu_power_limit_watts",
    "slurmhealth_gpu_sm_clock_hertz",
    "slurmhealth_gpu_clock_event_active",
    "slurmhealth_gpu_row_remap_pending",
    "slurmhealth_gpu_row_remap_failure",
    "slurmhealth_gpu_nvlink_links_down",
    "slurmhealth_gpu_up",
    "slurmhealth_gpu_pcie_link_gen",
    "slurmhealth_gpu_pcie_link_width",
    # counters
    "slurmhealth_gpu_energy_joules_total",
    "slurmhealth_gpu_ecc_uncorrectable_errors_total",
    "slurmhealth_gpu_remapped_rows_total",
    "slurmhealth_gpu_nvlink_errors_total",
    "slurmhealth_gpu_pcie_replay_errors_total",
    "slurmhealth_gpu_xid_errors_total",
    "slurmhealth_events_total",
    "slurmhealth_sidecar_samples_total",
    # job level
    "slurmhealth_job_info",
    "slurmhealth_job_gpu_info",
}
TASK_NAMES = {
    "slurmhealth_job_steps_total",
    "slurmhealth_job_step_seconds",
    "slurmhealth_job_samples_per_second",
    "slurmhealth_job_tokens_per_second",
    "slurmhealth_job_mfu_ratio",
    "slurmhealth_job_comm_ratio",
    "slurmhealth_job_data_wait_ratio",
    "slurmhealth_job_last_step_time_seconds",
}


def h100(index: int, **changes: object) -> GpuState:
    links = tuple(
        NvLink(link=n, active=True, version=4, replay_errors=n, recovery_errors=0,
               crc_flit_errors=2 * n, crc_data_errors=0)
        for n in range(18)
    )  # fmt: skip
    gpu = GpuState(
        index=index, uuid=f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
        name="NVIDIA H100 80GB HBM3", pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
        temperature_c=45 + index, margin_temperature_c=40 - index, power_w=650.5,
        power_limit_w=700.0, energy_j=1.5e9 + index, utilization_gpu_pct=87,
        utilization_memory_pct=40, memory_total_bytes=80 * GIB, memory_used_bytes=70 * GIB,
        sm_clock_mhz=1980, sm_clock_max_mhz=1980, mem_clock_mhz=2619, clock_event_reasons=0,
        pcie_gen=5, pcie_gen_max=5, pcie_width=16, pcie_width_max=16, pcie_replay_errors=0,
        ecc_enabled=True, ecc_volatile_uncorrectable=0, ecc_volatile_correctable=0,
        ecc_aggregate_uncorrectable=1, remapped_rows_correctable=2,
        remapped_rows_uncorrectable=0, remap_pending=False, remap_failure=False, nvlinks=links,
    )  # fmt: skip
    return dataclasses.replace(gpu, **changes)  # type: ignore[arg-type]


def snapshot() -> NodeSnapshot:
    gpus = [h100(i) for i in range(8)]
    gpus[2] = h100(2, nvlinks=tuple(
        dataclasses.replace(link, active=False) if link.link == 7 else link
        for link in gpus[2].nvlinks or ()
    ))  # fmt: skip
    gpus[3] = h100(3, clock_event_reasons=0x40 | 0x4)  # hw_thermal + sw_power_cap
    gpus[5] = h100(5, utilization_gpu_pct=None, power_w=None, remap_pending=None,
                   ecc_volatile_uncorrectable=None)  # fmt: skip
    return NodeSnapshot(node="gpu-a01", ts=1_700_000_000.0, gpus=tuple(gpus), device_count=8)


def state(**changes: object) -> ExportState:
    base = ExportState(
        labels=LABELS,
        snapshot=snapshot(),
        xid_counts={(1, 79): 1, (4, 13): 3},
        event_counts={("hang", None): 1, ("nvlink_down", 2): 1},
        drains_suppressed_total=2,
        samples_total=120,
        started_ts=1_699_999_000.0,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def registry_for(st: ExportState, **options: object) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(SidecarCollector(lambda: st, **options))  # type: ignore[arg-type]
    return registry


def gpu_labels(gpu: int, **extra: str) -> dict[str, str]:
    return {
        "job_id": "4242", "user": "alice", "priority": "1000", "node": "gpu-a01",
        "gpu": str(gpu), "uuid": f"GPU-0000000{gpu}-aaaa-bbbb-cccc-dddddddddddd", **extra,
    }  # fmt: skip


def job_labels(**extra: str) -> dict[str, str]:
    return {k: v for k, v in gpu_labels(0).items() if k in JOB_LABELS} | extra


@pytest.fixture
def reg() -> CollectorRegistry:
    return registry_for(state())


def test_exports_exactly_the_documented_names(reg: CollectorRegistry) -> None:
    names = {s.name for fam in reg.collect() for s in fam.samples}
    assert names == EXPECTED_NAMES
    with_task = registry_for(state(task=TaskStats(steps_total=10, step_seconds=0.5)))
    names = {s.name for fam in with_task.collect() for s in fam.samples}
    assert names - EXPECTED_NAMES == {
        "slurmhealth_job_steps_total",
        "slurmhealth_job_step_seconds",
    }


def test_every_gpu_series_carries_the_job_and_gpu_labels(reg: CollectorRegistry) -> None:
    for fam in reg.collect():
        for s in fam.samples:
            want = GPU_LABELS if s.name.startswith("slurmhealth_gpu_") else JOB_LABELS
            assert set(want) <= set(s.labels), s
            assert s.labels["node"] == "gpu-a01"


def test_job_facts_other_than_the_queried_tags_are_on_job_info_only(
    reg: CollectorRegistry,
) -> None:
    for fam in reg.collect():
        for s in fam.samples:
            extra = set(s.labels) - set(GPU_LABELS)
            if s.name == "slurmhealth_job_info":
                assert set(s.labels) == set(INFO_LABELS)
            elif s.name == "slurmhealth_job_gpu_info":  # the join's side: the queried facts
                assert set(s.labels) == set(GPU_INFO_LABELS)
            else:
                assert not extra & {"account", "partition", "qos", "job_name", "gpu_model"}, s


def test_units_are_converted_to_base_units(reg: CollectorRegistry) -> None:
    get = reg.get_sample_value
    assert get("slurmhealth_gpu_utilization_ratio", gpu_labels(0)) == pytest.approx(0.87)
    assert get("slurmhealth_gpu_memory_utilization_ratio", gpu_labels(0)) == pytest.approx(0.4)
    assert get("slurmhealth_gpu_sm_clock_hertz", gpu_labels(0)) == 1.98e9
    assert get("slurmhealth_gpu_memory_used_bytes", gpu_labels(0)) == 70 * GIB
    assert get("slurmhealth_gpu_memory_total_bytes", gpu_labels(0)) == 80 * GIB
    assert get("slurmhealth_gpu_temperature_celsius", gpu_labels(4)) == 49
    assert get("slurmhealth_gpu_thermal_margin_celsius", gpu_labels(4)) == 36
    assert get("slurmhealth_gpu_power_watts", gpu_labels(0)) == 650.5
    assert get("slurmhealth_gpu_power_limit_watts", gpu_labels(0)) == 700.0
    assert get("slurmhealth_gpu_energy_joules_total", gpu_labels(6)) == 1.5e9 + 6
    assert get("slurmhealth_gpu_pcie_link_gen", gpu_labels(0)) == 5
    assert get("slurmhealth_gpu_pcie_link_width", gpu_labels(0)) == 16
    assert get("slurmhealth_gpu_pcie_replay_errors_total", gpu_labels(0)) == 0
    assert get("slurmhealth_gpu_row_remap_pending", gpu_labels(0)) == 0
    assert get("slurmhealth_gpu_row_remap_failure", gpu_labels(0)) == 0
    assert get("slurmhealth_gpu_up", gpu_labels(0, status="ok")) == 1
    ecc = "slurmhealth_gpu_ecc_uncorrectable_errors_total"
    assert get(ecc, gpu_labels(0, scope="volatile")) == 0
    assert get(ecc, gpu_labels(0, scope="aggregate")) == 1
    rows = "slurmhealth_gpu_remapped_rows_total"
    assert get(rows, gpu_labels(0, kind="correctable")) == 2
    assert get(rows, gpu_labels(0, kind="uncorrectable")) == 0


def test_none_is_skipped_never_zero(reg: CollectorRegistry) -> None:
    get = reg.get_sample_value
    assert get("slurmhealth_gpu_utilization_ratio", gpu_labels(5)) is None
    assert get("slurmhealth_gpu_power_watts", gpu_labels(5)) is None
    assert get("slurmhealth_gpu_row_remap_pending", gpu_labels(5)) is None
    ecc = "slurmhealth_gpu_ecc_uncorrectable_errors_total"
    assert get(ecc, gpu_labels(5, scope="volatile")) is None
    assert get(ecc, gpu_labels(5, scope="aggregate")) == 1
    assert get("slurmhealth_gpu_temperature_celsius", gpu_labels(5)) == 50
    assert get("slurmhealth_gpu_up", gpu_labels(5, status="ok")) == 1


def test_nvlinks_summed_per_gpu_by_default(reg: CollectorRegistry) -> None:
    get = reg.get_sample_value
    assert get("slurmhealth_gpu_nvlink_links_down", gpu_labels(2)) == 1
    assert get("slurmhealth_gpu_nvlink_links_down", gpu_labels(0)) == 0
    errs = "slurmhealth_gpu_nvlink_errors_total"
    assert get(errs, gpu_labels(0, counter="replay")) == sum(range(18))
    assert get(errs, gpu_labels(0, counter="crc_flit")) == 2 * sum(range(18))
    assert get(errs, gpu_labels(0, counter="recovery")) == 0
    names = {s.name for fam in reg.collect() for s in fam.samples}
    assert not any("_nvlink_link_" in n for n in names)


def test_per_link_nvlink_series_are_opt_in() -> None:
    reg = registry_for(state(), per_link_nvlink=True)
    get = reg.get_sample_value
    assert get("slurmhealth_gpu_nvlink_link_up", gpu_labels(2, link="7")) == 0
    assert get("slurmhealth_gpu_nvlink_link_up", gpu_labels(2, link="6")) == 1
    errs = "slurmhealth_gpu_nvlink_link_errors_total"
    assert get(errs, gpu_labels(0, link="5", counter="replay")) == 5
    assert get(errs, gpu_labels(0, link="5", counter="crc_flit")) == 10
    ups = [s for fam in reg.collect() for s in fam.samples if s.name.endswith("_link_up")]
    assert len(ups) == 8 * 18
    assert sum(s.value == 0 for s in ups) == 1
    assert get("slurmhealth_gpu_nvlink_links_down", gpu_labels(2)) == 1  # the sums stay


def series_per_gpu(reg: CollectorRegistry, gpus: int = 8) -> float:
    return sum(len(fam.samples) for fam in reg.collect()) / gpus


def hcas(indices: range) -> RdmaSnapshot:
    """One NDR HCA per GPU index (an H100 node's compute fabric), all 8 error counters read."""
    counters = {c: 0 for c in RDMA_ERROR_COUNTERS} | {"port_xmit_data": 1, "port_rcv_data": 1}
    return RdmaSnapshot(1.7e9, tuple(
        Hca(f"mlx5_{i}", (IbPort(f"mlx5_{i}", 1, 4, "ACTIVE", 5, "LinkUp", Rate(400.0, 4, "NDR"),
                                 "InfiniBand", counters),))
        for i in indices
    ))  # fmt: skip


def test_cardinality_budget_default_mode_at_most_40_series_per_gpu() -> None:
    """With an HCA per GPU, as on an 8x H100 node: 5 RDMA series per GPU by default."""
    task = TaskStats(1000, 0.42, 1024.0, 4.2e6, 0.41, 0.12, 0.01, 1_700_000_000.5)
    full = state(task=task, rdma=hcas(range(8)))
    default = series_per_gpu(registry_for(full))
    per_link = series_per_gpu(registry_for(full, per_link_nvlink=True))
    per_counter = series_per_gpu(registry_for(full, per_counter_rdma=True))
    assert default <= 40, default
    assert per_link >= default + 18 * 5  # up + 4 counters per link, 18 links per GPU
    assert per_counter == default + 8 - 1  # 8 error series a port instead of their sum
    text = render(registry_for(full))
    assert len(text) / 8 < 8_000  # bytes per GPU and scrape, HELP/TYPE lines included
    # 8 single-GPU jobs, each reporting task metrics: the job-level series add up
    assert series_per_gpu(single_gpu_jobs(task, with_hcas=False)) <= 40
    # with the HCA behind each GPU, 5 more per GPU: over the budget, so a one-node job's
    # sidecar exports no port series unless [metrics] rdma_series = "all" (docs/metrics.md)
    with_hcas = series_per_gpu(single_gpu_jobs(task, with_hcas=True))
    assert with_hcas == series_per_gpu(single_gpu_jobs(task, with_hcas=False)) + 5
    assert not exports_rdma(Config().metrics.rdma_series, "gpu-a01")
    assert exports_rdma(Config().metrics.rdma_series, "gpu-a[01-02]")


def single_gpu_jobs(task: TaskStats, with_hcas: bool) -> CollectorRegistry:
    snap = state().snapshot
    assert snap is not None
    eight = CollectorRegistry()
    for g in snap.gpus:
        one = state(labels=dataclasses.replace(LABELS, job_id=f"9{g.index}"), task=task,
                    snapshot=dataclasses.replace(snap, gpus=(g,)),
                    rdma=hcas(range(g.index, g.index + 1)) if with_hcas else None)  # fmt: skip
        eight.register(SidecarCollector(lambda one=one: one))  # type: ignore[misc]
    return eight


def test_dcgm_mode_exports_no_gpu_counters_of_its_own() -> None:
    reg = registry_for(state(task=TaskStats(steps_total=3)), mode="dcgm")
    names = {s.name for fam in reg.collect() for s in fam.samples}
    assert names == {
        "slurmhealth_gpu_up", "slurmhealth_gpu_xid_errors_total",
        "slurmhealth_events_total", "slurmhealth_sidecar_samples_total", "slurmhealth_job_info",
        "slurmhealth_job_steps_total", "slurmhealth_job_gpu_info",
    }  # fmt: skip
    assert reg.get_sample_value("slurmhealth_gpu_up", gpu_labels(1, status="ok")) == 1
    with pytest.raises(ValueError, match="mode"):
        SidecarCollector(state, mode="dcgm-exporter")


def test_clock_event_reasons_from_the_bitmask(reg: CollectorRegistry) -> None:
    """Only reasons that hold clocks down have a series (value 1): 8 per GPU otherwise."""
    active = "slurmhealth_gpu_clock_event_active"
    reasons = ("hw_thermal", "sw_power_cap", "hw_slowdown", "sw_thermal", "hw_power_brake",
               "gpu_idle")  # fmt: skip
    got = {r: reg.get_sample_value(active, gpu_labels(3, reason=r)) for r in reasons}
    assert got == {r: 1.0 if r in ("hw_thermal", "sw_power_cap") else None for r in reasons}
    assert all(reg.get_sample_value(active, gpu_labels(0, reason=r)) is None for r in reasons)
    bits = {"hw_slowdown": 0x8, "sw_thermal": 0x20, "hw_power_brake": 0x80, "gpu_idle": 0x1}
    for reason, bit in bits.items():
        one = registry_for(
            state(snapshot=NodeSnapshot("gpu-a01", 0.0, (h100(0, clock_event_reasons=bit),)))
        )
        values = {r: one.get_sample_value(active, gpu_labels(0, reason=r)) for r in reasons}
        assert values == {r: 1.0 if r == reason else None for r in reasons}


def test_xid_counter_per_gpu_and_code(reg: CollectorRegistry) -> None:
    xid = "slurmhealth_gpu_xid_errors_total"
    assert reg.get_sample_value(xid, gpu_labels(1, xid="79")) == 1
    assert reg.get_sample_value(xid, gpu_labels(4, xid="13")) == 3
    assert reg.get_sample_value(xid, gpu_labels(0, xid="79")) is None


def test_events_drains_samples(reg: CollectorRegistry) -> None:
    get = reg.get_sample_value
    assert get("slurmhealth_events_total", job_labels(kind="hang", gpu="")) == 1
    assert get("slurmhealth_events_total", job_labels(kind="nvlink_down", gpu="2")) == 1
    assert get("slurmhealth_sidecar_samples_total", job_labels()) == 120


def test_job_info(reg: CollectorRegistry) -> None:
    facts = {"account": "ml", "partition": "gpu", "qos": "normal", "job_name": "",
             "gpu_model": "NVIDIA H100 80GB HBM3"}  # fmt: skip
    info = reg.get_sample_value("slurmhealth_job_info", job_labels(gpus="0,1,2,3,4,5,6,7", **facts))
    assert info == 1


def test_task_metrics_only_when_task_set(reg: CollectorRegistry) -> None:
    names = {s.name for fam in reg.collect() for s in fam.samples}
    assert not names & TASK_NAMES
    task = TaskStats(steps_total=1000, step_seconds=0.42, samples_per_second=1024.0,
                     tokens_per_second=4.2e6, mfu_ratio=0.41, comm_ratio=0.12,
                     data_wait_ratio=0.01, last_step_ts=1_700_000_000.5)  # fmt: skip
    reg = registry_for(state(task=task))
    get = reg.get_sample_value
    assert get("slurmhealth_job_steps_total", job_labels()) == 1000
    assert get("slurmhealth_job_step_seconds", job_labels()) == 0.42
    assert get("slurmhealth_job_samples_per_second", job_labels()) == 1024.0
    assert get("slurmhealth_job_tokens_per_second", job_labels()) == 4.2e6
    assert get("slurmhealth_job_mfu_ratio", job_labels()) == 0.41
    assert get("slurmhealth_job_comm_ratio", job_labels()) == 0.12
    assert get("slurmhealth_job_data_wait_ratio", job_labels()) == 0.01
    assert get("slurmhealth_job_last_step_time_seconds", job_labels()) == 1_700_000_000.5
    sparse = registry_for(state(task=TaskStats(steps_total=3)))
    names = {s.name for fam in sparse.collect() for s in fam.samples}
    assert names & TASK_NAMES == {"slurmhealth_job_steps_total"}


def test_lost_gpu_is_down_and_keeps_its_identity() -> None:
    current = state()
    collector = SidecarCollector(lambda: current)
    registry = CollectorRegistry()
    registry.register(collector)
    generate_latest(registry)  # first scrape sees GPU 1 healthy, with its UUID
    lost = GpuState(index=1, status=GpuStatus.LOST, error="GPU is lost")
    snap = current.snapshot
    assert snap is not None
    gpus = tuple(lost if g.index == 1 else g for g in snap.gpus)
    current = state(snapshot=dataclasses.replace(snap, gpus=gpus))
    get = registry.get_sample_value
    assert get("slurmhealth_gpu_up", gpu_labels(1, status="lost")) == 0
    assert get("slurmhealth_gpu_up", gpu_labels(1, status="ok")) is None
    assert get("slurmhealth_gpu_temperature_celsius", gpu_labels(1)) is None
    assert get("slurmhealth_gpu_xid_errors_total", gpu_labels(1, xid="79")) == 1


def test_state_is_read_on_every_scrape() -> None:
    calls: list[int] = []

    def get_state() -> ExportState:
        calls.append(1)
        return state(samples_total=len(calls))

    registry = CollectorRegistry()
    registry.register(SidecarCollector(get_state))
    assert calls == []  # describe() is empty, so register() does not collect
    assert registry.get_sample_value("slurmhealth_sidecar_samples_total", job_labels()) == 1
    assert registry.get_sample_value("slurmhealth_sidecar_samples_total", job_labels()) == 2


def test_without_snapshot_only_job_series() -> None:
    registry = registry_for(ExportState(labels=dataclasses.replace(LABELS, node="gpu-b07")))
    samples = [s for fam in registry.collect() for s in fam.samples]
    assert {s.name for s in samples} == {
        "slurmhealth_job_info",
        "slurmhealth_sidecar_samples_total",
    }
    info = next(s for s in samples if s.name == "slurmhealth_job_info")
    assert info.labels["gpus"] == ""
    assert info.labels["node"] == "gpu-b07"


def test_nothing_lands_on_the_global_registry() -> None:
    names = {s.name for fam in prometheus_client.REGISTRY.collect() for s in fam.samples}
    assert not any(n.startswith("slurmhealth_") for n in names)


def test_promtool_accepts_the_exposition(reg: CollectorRegistry) -> None:
    task = TaskStats(steps_total=1, step_seconds=0.4, mfu_ratio=0.4, last_step_ts=1.0)
    for registry in (reg, registry_for(state(task=task))):
        text = render(registry).decode()
        result = promtool("check", "metrics", stdin=text)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.strip() == "" and result.stderr.strip() == "", result


def test_render_is_byte_for_byte_generate_latest(reg: CollectorRegistry) -> None:
    assert render(reg) == generate_latest(reg)
    odd = dataclasses.replace(LABELS, user='o"brien\\x\ny', account="équipe")
    registry = registry_for(state(labels=odd, task=TaskStats(steps_total=1, mfu_ratio=0.5)))
    # families render() leaves to the client: a histogram, an info, a timestamped gauge
    prometheus_client.Histogram("h_seconds", "a histogram", ["x"], registry=registry).labels(
        "a"
    ).observe(0.2)
    prometheus_client.Info("build", "an info", registry=registry).info({"version": "1"})
    stamped = GaugeMetricFamily("stamped", "with a timestamp", labels=["a"])
    stamped.add_metric(["b"], 1.5, timestamp=1_700_000_000.25)

    class Stamped(Collector):
        def collect(self) -> Iterator[Metric]:
            yield stamped

    registry.register(Stamped())
    text = render(registry)
    assert text == generate_latest(registry)
    assert b'user="o\\"brien\\\\x\\ny"' in text
    assert render(registry) == text  # again, from the label cache
