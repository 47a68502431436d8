"""The check catalog, one check at a time, on hand-built snapshots.

Every test builds a healthy 8x H100 node and breaks one thing with ``dataclasses.replace``,
so a finding can only come from that one fault.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import pytest

from slurmhealth.checks import (
    PHASES,
    REGISTRY,
    CheckContext,
    catalog,
    check,
    run_checks,
    validate_settings,
)
from slurmhealth.errors import ConfigError
from slurmhealth.model import (
    Action,
    Finding,
    GpuProcess,
    GpuState,
    GpuStatus,
    NodeSnapshot,
    NvLink,
    Severity,
    XidEvent,
)

H100 = "NVIDIA H100 80GB HBM3"
BUS = ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
TS = 1_700_000_000.0
MIB = 2**20


def healthy_gpu(index: int = 0, links: int = 18) -> GpuState:
    """An idle, healthy H100 SXM as NVML reports it, with ``links`` active NVLinks."""
    return GpuState(
        index=index,
        uuid=f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
        name=H100,
        pci_bus_id=f"00000000:{BUS[index]}:00.0",
        serial=f"165492200000{index}",
        minor_number=index,
        persistence_mode=True,
        temperature_c=34,
        margin_temperature_c=52,
        power_w=71.0,
        power_limit_w=700.0,
        energy_j=1.5e6,
        utilization_gpu_pct=0,
        utilization_memory_pct=0,
        memory_total_bytes=81559 * MIB,
        memory_used_bytes=0,
        sm_clock_mhz=345,
        sm_clock_max_mhz=1980,
        mem_clock_mhz=2619,
        clock_event_reasons=0x1,  # gpu_idle
        pcie_gen=5,
        pcie_gen_max=5,
        pcie_width=16,
        pcie_width_max=16,
        pcie_replay_errors=0,
        ecc_enabled=True,
        ecc_volatile_uncorrectable=0,
        ecc_volatile_correctable=0,
        ecc_aggregate_uncorrectable=0,
        remapped_rows_correctable=0,
        remapped_rows_uncorrectable=0,
        remap_pending=False,
        remap_failure=False,
        retired_pages_pending=None,  # not read on GPUs with row remapping
        nvlinks=tuple(healthy_link(n) for n in range(links)),
        fabric_state="completed",
        fabric_status="ok",
        processes=(),
    )


def healthy_link(n: int, **changes: Any) -> NvLink:
    link = NvLink(
        link=n,
        active=True,
        remote_pci_bus_id=f"00000000:{5 + n % 4:02X}:00.0",
        version=4,
        replay_errors=0,
        recovery_errors=0,
        crc_flit_errors=0,
        crc_data_errors=0,
    )
    return replace(link, **changes)


def with_link(gpu: GpuState, n: int, **changes: Any) -> GpuState:
    """``gpu`` with NVLink ``n`` changed."""
    assert gpu.nvlinks is not None
    return replace(
        gpu, nvlinks=tuple(replace(ln, **changes) if ln.link == n else ln for ln in gpu.nvlinks)
    )


def node(*broken: GpuState, count: int = 8, ts: float = TS, **changes: Any) -> NodeSnapshot:
    """A healthy node of ``count`` GPUs, with the GPUs in ``broken`` replacing theirs."""
    by_index = {g.index: g for g in broken}
    gpus = tuple(by_index.get(i, healthy_gpu(i)) for i in range(count))
    snap = NodeSnapshot(
        node="gpu-node-01",
        ts=ts,
        gpus=gpus,
        device_count=count,
        driver_version="550.90.07",
        nvml_version="12.550.90.07",
    )
    return replace(snap, **changes)


def ctx(snapshot: NodeSnapshot, **kw: Any) -> CheckContext:
    return CheckContext(snapshot=snapshot, **kw)


def of(findings: list[Finding], name: str) -> list[Finding]:
    return [f for f in findings if f.check == name]


def only(findings: list[Finding], name: str) -> Finding:
    """The single finding of the run, which must come from check ``name``."""
    assert [f.check for f in findings] == [name], findings
    return findings[0]


# -- the catalog as a whole --------------------------------------------------------------


def test_healthy_node_has_no_findings_in_any_phase() -> None:
    for phase in PHASES:
        findings = run_checks(
            ctx(
                node(),
                phase=phase,
                gpus=(0, 1),
                expected_count=8,
                expected_driver="550.90.07",
                nvlinks_per_model={H100: 18},
            )
        )
        assert findings == [], phase


def test_catalog_holds_the_documented_checks() -> None:
    expected = {
        "gpu_count", "gpu_lost", "gpu_reset_required", "gpu_unresponsive", "nvml_error",
        "driver_version", "persistence_mode", "stale_job", "ecc_uncorrectable", "row_remap",
        "nvlink_inactive", "nvlink_errors", "pcie_link", "clock_events", "thermal_margin",
        "fabric_state", "xid",
    }  # fmt: skip
    assert expected <= set(catalog())
    for spec in catalog().values():
        assert spec.description and spec.hint, spec.name


def test_disabled_check_does_not_run() -> None:
    snap = node(replace(healthy_gpu(1), persistence_mode=False))
    assert of(run_checks(ctx(snap)), "persistence_mode")
    assert run_checks(ctx(snap), disabled=["persistence_mode"]) == []


def test_findings_sorted_worst_first() -> None:
    snap = node(
        replace(healthy_gpu(1), persistence_mode=False),
        replace(healthy_gpu(2), status=GpuStatus.LOST, error="lost"),
        replace(healthy_gpu(3), margin_temperature_c=0),
    )
    sev = [f.severity for f in run_checks(ctx(snap))]
    assert sev == [Severity.CRITICAL, Severity.FAIL, Severity.WARN]


# -- gpu_count ---------------------------------------------------------------------------


def test_gpu_count_fewer_than_expected_fails() -> None:
    snap = node(count=7)
    f = only(run_checks(ctx(snap, expected_count=8)), "gpu_count")
    assert (f.severity, f.action) == (Severity.FAIL, Action.DRAIN)
    assert "7" in f.message and "8" in f.message
    assert (f.evidence["visible"], f.evidence["expected"]) == (7, 8)


def test_gpu_count_as_many_or_more_than_expected_passes() -> None:
    assert run_checks(ctx(node(), expected_count=8)) == []
    assert run_checks(ctx(node(), expected_count=4)) == []
    assert run_checks(ctx(node(count=7))) == []  # expected_count 0: not configured


def test_gpu_count_allocated_gpu_beyond_device_count_fails() -> None:
    snap = node(count=6)
    f = only(run_checks(ctx(snap, gpus=(4, 6, 7))), "gpu_count")
    assert f.severity is Severity.FAIL
    assert f.evidence["missing"] == [6, 7]
    assert "6,7" in f.message
    assert run_checks(ctx(snap, gpus=(0, 5))) == []


def test_gpu_count_unknown_device_count_is_silent() -> None:
    assert run_checks(ctx(node(device_count=None), expected_count=8, gpus=(9,))) == []


# -- lost / reset required / unresponsive ------------------------------------------------


def _broken_everywhere(index: int) -> GpuState:
    """A GPU whose last-read fields would trip almost every check."""
    return with_link(
        replace(
            healthy_gpu(index),
            persistence_mode=False,
            margin_temperature_c=0,
            ecc_volatile_uncorrectable=3,
            remap_pending=True,
            clock_event_reasons=0x8,
            pcie_width=8,
            fabric_state="in_progress",
            processes=(GpuProcess(4242, 10 * 2**30),),
        ),
        3,
        active=False,
    )


GONE = "nvmlDeviceGetUUID: gone"


@pytest.mark.parametrize(
    ("status", "name", "message", "evidence"),
    [
        (GpuStatus.LOST, "gpu_lost", "GPU is lost (fallen off the bus)", {"error": GONE}),
        (GpuStatus.RESET_REQUIRED, "gpu_reset_required", "GPU requires a reset", {"error": GONE}),
        (GpuStatus.UNRESPONSIVE, "gpu_unresponsive", f"GPU unresponsive: {GONE}", {}),
    ],
)
def test_gone_gpu_is_critical_and_nothing_else_fires(
    status: GpuStatus, name: str, message: str, evidence: dict[str, str]
) -> None:
    gpu = replace(_broken_everywhere(5), status=status, error=GONE)
    findings = run_checks(ctx(node(gpu), nvlinks_per_model={H100: 18}))
    f = only(findings, name)
    assert (f.severity, f.action, f.gpu) == (Severity.CRITICAL, Action.RESET, 5)
    assert (f.message, f.evidence) == (message, evidence)
    assert f.action.takes_node_out


def test_unresponsive_message_carries_the_stuck_call() -> None:
    gpu = GpuState(5, GpuStatus.UNRESPONSIVE, error="no answer within 5 s (stuck in nvmlX)")
    f = only(run_checks(ctx(node(gpu))), "gpu_unresponsive")
    assert "stuck in nvmlX" in f.message


def test_nvml_error_on_readable_gpu_is_recorded_not_failed() -> None:
    gpu = replace(healthy_gpu(1), error="nvmlDeviceGetPowerUsage: Unknown Error")
    f = only(run_checks(ctx(node(gpu))), "nvml_error")
    assert f.severity is Severity.INFO and not f.failing
    assert "nvmlDeviceGetPowerUsage" in f.message
    err = GpuState(2, GpuStatus.ERROR, error="nvmlDeviceGetHandleByIndex: Unknown Error")
    f = only(run_checks(ctx(node(err))), "nvml_error")
    assert f.severity is Severity.WARN


# -- ECC and row remapping ---------------------------------------------------------------


def test_ecc_volatile_uncorrectable_fails() -> None:
    gpu = replace(healthy_gpu(2), ecc_volatile_uncorrectable=1, ecc_aggregate_uncorrectable=1)
    f = only(run_checks(ctx(node(gpu))), "ecc_uncorrectable")
    assert (f.severity, f.action, f.gpu, f.uuid) == (Severity.FAIL, Action.RESET, 2, gpu.uuid)
    assert f.evidence["volatile"] == 1


def test_ecc_aggregate_only_warns() -> None:
    gpu = replace(healthy_gpu(2), ecc_aggregate_uncorrectable=4)
    f = only(run_checks(ctx(node(gpu))), "ecc_uncorrectable")
    assert (f.severity, f.action) == (Severity.WARN, Action.WARN)
    assert f.evidence["aggregate"] == 4


def test_ecc_thresholds_come_from_settings() -> None:
    gpu = replace(healthy_gpu(2), ecc_volatile_uncorrectable=3, ecc_aggregate_uncorrectable=3)
    loose = {"ecc_uncorrectable": {"volatile_max": 5, "aggregate_max": 10}}
    assert run_checks(ctx(node(gpu)), loose) == []
    partly = {"ecc_uncorrectable": {"volatile_max": 5}}  # aggregate keeps its default 0
    assert only(run_checks(ctx(node(gpu)), partly), "ecc_uncorrectable").severity is Severity.WARN
    worse = replace(gpu, ecc_volatile_uncorrectable=6)
    assert only(run_checks(ctx(node(worse)), loose), "ecc_uncorrectable").failing


def test_ecc_unknown_counters_are_silent() -> None:
    gpu = replace(healthy_gpu(2), ecc_volatile_uncorrectable=None, ecc_aggregate_uncorrectable=None)
    assert run_checks(ctx(node(gpu))) == []


def test_row_remap_pending_needs_reset() -> None:
    gpu = replace(healthy_gpu(4), remap_pending=True, remapped_rows_uncorrectable=1)
    f = only(run_checks(ctx(node(gpu))), "row_remap")
    assert (f.severity, f.action, f.gpu) == (Severity.FAIL, Action.RESET, 4)
    assert "pending" in f.message
    assert f.evidence["remapped_rows"] == {"correctable": 0, "uncorrectable": 1}


def test_row_remap_failure_drains_for_rma() -> None:
    gpu = replace(healthy_gpu(4), remap_failure=True, remap_pending=True)
    f = only(run_checks(ctx(node(gpu))), "row_remap")
    assert (f.severity, f.action) == (Severity.FAIL, Action.DRAIN)
    assert "RMA" in f.hint


def test_retired_pages_pending_fails() -> None:
    gpu = replace(
        healthy_gpu(4), remap_pending=None, remap_failure=None, retired_pages_pending=True
    )
    f = only(run_checks(ctx(node(gpu))), "row_remap")
    assert f.severity is Severity.FAIL and "retired pages" in f.message


# -- NVLink state ------------------------------------------------------------------------


def test_nvlink_inactive_names_link_gpu_and_uuid() -> None:
    gpu = with_link(healthy_gpu(3), 7, active=False)
    f = only(run_checks(ctx(node(gpu), nvlinks_per_model={H100: 18})), "nvlink_inactive")
    assert (f.severity, f.action, f.gpu, f.uuid) == (Severity.FAIL, Action.DRAIN, 3, gpu.uuid)
    assert f.evidence["link"] == 7
    assert f.evidence["remote_pci_bus_id"] == healthy_link(7).remote_pci_bus_id
    assert "7" in f.message and "inactive" in f.message


def test_nvlink_missing_link_counts_when_model_is_known() -> None:
    gpu = healthy_gpu(3, links=17)  # link 17 not reported at all
    f = only(run_checks(ctx(node(gpu), nvlinks_per_model={H100: 18})), "nvlink_inactive")
    assert f.evidence["link"] == 17 and "missing" in f.message


def test_nvlink_unknown_model_judges_only_reported_links() -> None:
    short = replace(healthy_gpu(3, links=17), name="NVIDIA X1")  # not in the SKU table
    assert run_checks(ctx(node(short))) == []  # nothing to compare the 17 with
    down = with_link(short, 2, active=False)
    f = only(run_checks(ctx(node(down))), "nvlink_inactive")
    assert f.evidence["link"] == 2 and f.gpu == 3


def test_nvlink_node_without_active_links_is_silent() -> None:
    """PCIe cards: NVML reports links, none active, or no links at all."""
    pcie = [replace(healthy_gpu(i, links=0), nvlinks=None, name="NVIDIA H100 PCIe") for i in (0, 1)]
    assert run_checks(ctx(node(*pcie, count=2))) == []
    dark = [
        replace(
            healthy_gpu(i),
            name=model,
            nvlinks=tuple(healthy_link(n, active=False) for n in range(18)),
        )
        for i in (0, 1)
        for model in ["NVIDIA X1"]  # a model neither the config nor the SKU table knows
    ]
    assert run_checks(ctx(node(*dark, count=2), nvlinks_per_model={"other": 4})) == []


def test_nvlink_known_model_with_all_links_down_fails_each() -> None:
    gpu = replace(healthy_gpu(0), nvlinks=tuple(healthy_link(n, active=False) for n in range(18)))
    findings = run_checks(ctx(node(gpu, count=1), nvlinks_per_model={H100: 18}))
    assert sorted(f.evidence["link"] for f in of(findings, "nvlink_inactive")) == list(range(18))


# -- PCIe --------------------------------------------------------------------------------


def test_pcie_width_below_max_warns_even_idle() -> None:
    gpu = replace(healthy_gpu(6), pcie_width=8)
    f = only(run_checks(ctx(node(gpu))), "pcie_link")
    assert (f.severity, f.action, f.gpu) == (Severity.WARN, Action.WARN, 6)
    assert (f.evidence["width"], f.evidence["width_max"]) == (8, 16)


def test_pcie_gen_below_max_warns_only_under_load() -> None:
    idle = replace(healthy_gpu(6), pcie_gen=1, utilization_gpu_pct=10)
    assert run_checks(ctx(node(idle))) == []
    assert run_checks(ctx(node(replace(idle, utilization_gpu_pct=49)))) == []
    busy = replace(idle, utilization_gpu_pct=50)
    f = only(run_checks(ctx(node(busy))), "pcie_link")
    assert f.severity is Severity.WARN
    assert (f.evidence["gen"], f.evidence["gen_max"]) == (1, 5)


# -- clocks and thermals -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("mask", "reason", "severity"),
    [
        (0x8, "hw_slowdown", Severity.FAIL),
        (0x40, "hw_thermal", Severity.FAIL),
        (0x80, "hw_power_brake", Severity.FAIL),
        (0x20, "sw_thermal", Severity.WARN),
    ],
)
def test_clock_events(mask: int, reason: str, severity: Severity) -> None:
    gpu = replace(healthy_gpu(1), clock_event_reasons=mask | 0x1)
    f = only(run_checks(ctx(node(gpu))), "clock_events")
    assert (f.severity, f.gpu, f.evidence["reason"]) == (severity, 1, reason)
    assert f.action is (Action.DRAIN if severity is Severity.FAIL else Action.WARN)


@pytest.mark.parametrize("mask", [0x1, 0x4, 0x5, 0x2, 0x10, 0])
def test_clock_events_benign_reasons_are_silent(mask: int) -> None:
    """gpu_idle, sw_power_cap, applications clocks and sync boost are normal."""
    assert run_checks(ctx(node(replace(healthy_gpu(1), clock_event_reasons=mask)))) == []


def test_clock_events_several_reasons_each_reported() -> None:
    gpu = replace(healthy_gpu(1), clock_event_reasons=0x8 | 0x40 | 0x20)
    reasons = {f.evidence["reason"] for f in of(run_checks(ctx(node(gpu))), "clock_events")}
    assert reasons == {"hw_slowdown", "hw_thermal", "sw_thermal"}


@pytest.mark.parametrize(
    ("margin", "severity"),
    [(-3, Severity.FAIL), (0, Severity.FAIL), (1, Severity.WARN), (4, Severity.WARN)],
)
def test_thermal_margin(margin: int, severity: Severity) -> None:
    gpu = replace(healthy_gpu(7), margin_temperature_c=margin, temperature_c=88)
    f = only(run_checks(ctx(node(gpu))), "thermal_margin")
    assert (f.severity, f.gpu, f.evidence["margin_c"]) == (severity, 7, margin)
    assert "88" in f.message


@pytest.mark.parametrize("margin", [5, 30, None])
def test_thermal_margin_enough_or_unknown_is_silent(margin: int | None) -> None:
    assert run_checks(ctx(node(replace(healthy_gpu(7), margin_temperature_c=margin)))) == []


# -- persistence, stale jobs, fabric, driver ---------------------------------------------


def test_persistence_off_warns() -> None:
    f = only(
        run_checks(ctx(node(replace(healthy_gpu(0), persistence_mode=False)))), "persistence_mode"
    )
    assert (f.severity, f.action, f.gpu) == (Severity.WARN, Action.WARN, 0)
    assert run_checks(ctx(node(replace(healthy_gpu(0), persistence_mode=None)))) == []


def test_stale_job_process_left_on_gpu_fails() -> None:
    gpu = replace(healthy_gpu(2), processes=(GpuProcess(31337, 30 * 2**30), GpuProcess(7, None)))
    f = only(run_checks(ctx(node(gpu), phase="prolog")), "stale_job")
    assert (f.severity, f.action, f.gpu) == (Severity.FAIL, Action.DRAIN, 2)
    assert f.evidence["pids"] == [31337, 7]
    assert "31337" in f.message and "1 more" in f.message


def test_stale_job_memory_without_process() -> None:
    over = replace(healthy_gpu(2), memory_used_bytes=1025 * MIB)
    f = only(run_checks(ctx(node(over), phase="prolog")), "stale_job")
    assert f.severity is Severity.FAIL and f.evidence["memory_used_mib"] == pytest.approx(1025)
    at_limit = replace(healthy_gpu(2), memory_used_bytes=1024 * MIB)
    assert run_checks(ctx(node(at_limit), phase="prolog")) == []
    loose = {"stale_job": {"max_memory_used_mib": 2048}}
    assert run_checks(ctx(node(over), phase="prolog"), loose) == []


@pytest.mark.parametrize("phase", ["sidecar", "epilog"])
def test_stale_job_not_judged_while_or_after_a_job_runs(phase: str) -> None:
    gpu = replace(
        healthy_gpu(2), processes=(GpuProcess(31337, 30 * 2**30),), memory_used_bytes=30 * 2**30
    )
    assert run_checks(ctx(node(gpu), phase=phase)) == []


def test_fabric_in_progress_fails() -> None:
    gpu = replace(healthy_gpu(3), fabric_state="in_progress", fabric_status="ok")
    f = only(run_checks(ctx(node(gpu))), "fabric_state")
    assert (f.severity, f.action, f.gpu) == (Severity.FAIL, Action.DRAIN, 3)
    assert f.evidence["state"] == "in_progress"


def test_fabric_completed_with_error_status_fails() -> None:
    gpu = replace(healthy_gpu(3), fabric_state="completed", fabric_status="Timeout")
    f = only(run_checks(ctx(node(gpu))), "fabric_state")
    assert f.failing and "Timeout" in f.message


def test_fabric_unknown_is_silent() -> None:
    gpu = replace(healthy_gpu(3), fabric_state=None, fabric_status=None)
    assert run_checks(ctx(node(gpu))) == []


def test_driver_mismatch_fails() -> None:
    snap = node(driver_version="535.104.05")
    f = only(run_checks(ctx(snap, expected_driver="550.90.07")), "driver_version")
    assert (f.severity, f.action, f.gpu) == (Severity.FAIL, Action.DRAIN, None)
    assert "535.104.05" in f.message and "550.90.07" in f.message


def test_driver_unset_or_unknown_is_silent() -> None:
    assert run_checks(ctx(node(driver_version="535.104.05"))) == []
    assert run_checks(ctx(node(driver_version=None), expected_driver="550.90.07")) == []


# -- Xid ---------------------------------------------------------------------------------


def xid_event(code: int, bus: str = "0000:5d:00.0", **kw: Any) -> XidEvent:
    raw = f"NVRM: Xid (PCI:{bus[:-2]}): {code}, pid=4242, name=python3, simulated"
    return XidEvent(xid=code, pci_bus_id=bus, message="simulated", raw=raw, **kw)


def test_xid_maps_bus_id_to_gpu() -> None:
    snap = node()
    assert snap.gpus[3].pci_bus_id == "00000000:5D:00.0"
    f = only(run_checks(ctx(snap, xids=(xid_event(79, pid=4242),))), "xid")
    assert (f.gpu, f.uuid) == (3, snap.gpus[3].uuid)
    assert (f.severity, f.action) == (Severity.CRITICAL, Action.RESET)
    assert f.evidence["xid"] == 79 and f.evidence["pid"] == 4242
    assert "79" in f.message and "0000:5d:00.0" in f.message


def test_xid_application_error_is_recorded() -> None:
    f = only(run_checks(ctx(node(), xids=(xid_event(13),))), "xid")
    assert (f.severity, f.action, f.gpu) == (Severity.INFO, Action.RECORD, 3)
    assert not f.failing


@pytest.mark.parametrize(
    ("pending", "severity", "action"),
    [
        (True, Severity.FAIL, Action.DRAIN),
        (False, Severity.INFO, Action.RECORD),
        (None, Severity.WARN, Action.RECORD),
    ],
)
def test_xid_63_depends_on_remap_pending(
    pending: bool | None, severity: Severity, action: Action
) -> None:
    gpu = replace(healthy_gpu(3), remap_pending=pending)
    findings = run_checks(ctx(node(gpu), xids=(xid_event(63),)), disabled=["row_remap"])
    f = only(findings, "xid")
    assert (f.severity, f.action, f.gpu) == (severity, action, 3)


def test_repeated_xids_on_one_gpu_aggregate() -> None:
    events = (*(xid_event(31, ts=TS + n) for n in range(5)), xid_event(31, "0000:18:00.0"))
    findings = of(run_checks(ctx(node(), xids=events)), "xid")
    assert len(findings) == 2
    on3 = next(f for f in findings if f.gpu == 3)
    assert on3.evidence["count"] == 5 and "x5" in on3.message
    assert on3.evidence["ts"] == TS  # the first one
    on0 = next(f for f in findings if f.gpu == 0)
    assert on0.evidence["count"] == 1


def test_xid_on_unknown_bus_is_still_reported() -> None:
    f = only(run_checks(ctx(node(), xids=(xid_event(79, "0000:ee:00.0"),))), "xid")
    assert f.gpu is None and f.severity is Severity.CRITICAL


# -- registry, crash handling, settings validation ---------------------------------------


@pytest.fixture
def throwaway() -> Iterator[str]:
    catalog()  # every real check registered first
    name = "zz_test_throwaway_check"
    assert name not in REGISTRY
    try:
        yield name
    finally:
        REGISTRY.pop(name, None)


def test_check_decorator_refuses_duplicate_name(throwaway: str) -> None:
    def fn(c: CheckContext, th: Mapping[str, float]) -> list[Finding]:
        return []

    check(throwaway, "first", action=Action.RECORD, hint="h")(fn)
    first = REGISTRY[throwaway]
    with pytest.raises(ValueError, match=throwaway):
        check(throwaway, "second", action=Action.DRAIN, hint="h")(fn)
    assert REGISTRY[throwaway] is first
    with pytest.raises(ValueError, match="gpu_count"):
        check("gpu_count", "again", action=Action.RECORD, hint="h")(fn)


def test_crashing_check_is_a_warning_not_a_crash(throwaway: str) -> None:
    def boom(c: CheckContext, th: Mapping[str, float]) -> list[Finding]:
        raise RuntimeError("kaboom")

    check(throwaway, "crashes", action=Action.DRAIN, hint="h")(boom)
    snap = node(replace(healthy_gpu(1), persistence_mode=False))
    findings = run_checks(ctx(snap))
    crash = only(of(findings, throwaway), throwaway)
    assert (crash.severity, crash.action) == (Severity.WARN, Action.RECORD)
    assert not crash.action.takes_node_out
    assert "RuntimeError" in crash.message and "kaboom" in crash.message
    assert "kaboom" in crash.evidence["traceback"]
    assert of(findings, "persistence_mode"), "the other checks still ran"


CFG = "/etc/slurmhealth.toml"


def sources_for(settings: Mapping[str, Any]) -> dict[str, str]:
    """The config's provenance map, as ``load_config`` builds it: ``checks.<name>`` -> file."""
    return {"checks.disabled": CFG, **{f"checks.{name}": CFG for name in settings}}


def test_validate_settings_accepts_known_thresholds() -> None:
    settings: dict[str, dict[str, float]] = {
        "ecc_uncorrectable": {"volatile_max": 1},
        "pcie_link": {"min_util_for_gen_pct": 80.5},
    }
    validate_settings(settings, ["persistence_mode"], sources_for(settings))


def test_validate_settings_rejects_unknown_check() -> None:
    settings: dict[str, dict[str, Any]] = {"ecc_uncorectable": {}}
    with pytest.raises(ConfigError) as info:
        validate_settings(settings, [], sources_for(settings))
    assert info.value.key == "checks.ecc_uncorectable"
    assert CFG in str(info.value) and "checks.ecc_uncorectable" in str(info.value)
    with pytest.raises(ConfigError, match=r"checks\.disabled") as info:
        validate_settings({}, ["no_such_check"], sources_for({}))
    assert CFG in str(info.value) and "no_such_check" in str(info.value)


def test_validate_settings_rejects_unknown_threshold_key() -> None:
    settings = {"ecc_uncorrectable": {"volatile": 1}}
    with pytest.raises(ConfigError) as info:
        validate_settings(settings, [], sources_for(settings))
    assert info.value.key == "checks.ecc_uncorrectable.volatile"
    assert f"{CFG}: checks.ecc_uncorrectable.volatile" in str(info.value)
    assert "volatile_max" in str(info.value)  # lists what is known


def test_validate_settings_without_provenance_still_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"checks\.pcie_link\.min_util"):
        validate_settings({"pcie_link": {"min_util": 1}}, [], {})


@pytest.mark.parametrize("value", ["1", True, None])
def test_validate_settings_rejects_non_numbers(value: Any) -> None:
    settings = {"thermal_margin": {"warn_c": value}}
    with pytest.raises(ConfigError, match=r"checks\.thermal_margin\.warn_c"):
        validate_settings(settings, [], sources_for(settings))
