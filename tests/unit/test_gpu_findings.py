"""What `slurmhealth check` says of the GPUs themselves, exactly as an operator reads it:
count, driver, persistence mode and a previous job's leftovers, with their evidence."""

from __future__ import annotations

from dataclasses import replace

from slurmhealth.checks import run_checks
from slurmhealth.model import Action, GpuProcess, GpuState, Severity
from tests.unit.test_checks import H100, ctx, healthy_gpu, healthy_link, node, of, only, with_link

MIB = 2**20


def test_fewer_gpus_than_expected_and_an_allocated_one_missing() -> None:
    found = of(run_checks(ctx(node(count=6), expected_count=8, gpus=(1, 6, 7))), "gpu_count")
    assert [(f.message, f.evidence) for f in found] == [
        ("6 GPUs visible, 8 expected", {"visible": 6, "expected": 8}),
        ("allocated GPU(s) 6,7 not visible (6 GPUs)", {"visible": 6, "missing": [6, 7]}),
    ]
    assert all(f.gpu is None and f.severity is Severity.FAIL for f in found)


def test_another_driver_than_the_fleets() -> None:
    f = only(run_checks(ctx(node(driver_version="535.1"), expected_driver="550.9")),
             "driver_version")  # fmt: skip
    assert (f.message, f.evidence) == (
        "driver 535.1, expected 550.9",
        {"driver": "535.1", "expected": "550.9"},
    )


def test_persistence_mode_off_on_each_gpu() -> None:
    off = [replace(healthy_gpu(i), persistence_mode=False) for i in (2, 5)]
    found = of(run_checks(ctx(node(*off))), "persistence_mode")
    assert [(f.gpu, f.message, f.severity) for f in found] == [
        (2, "persistence mode is off", Severity.WARN),
        (5, "persistence mode is off", Severity.WARN),
    ]


def test_leftovers_of_a_previous_job_on_each_gpu() -> None:
    one = replace(healthy_gpu(1), processes=(GpuProcess(42, MIB),), memory_used_bytes=3 * MIB)
    mig = replace(healthy_gpu(2), mig_mode=True, processes=(GpuProcess(9, MIB),))
    many = replace(healthy_gpu(4), processes=tuple(GpuProcess(p, None) for p in (7, 8, 9)),
                   memory_used_bytes=None)  # fmt: skip
    memory = replace(healthy_gpu(6), memory_used_bytes=2048 * MIB)
    found = of(run_checks(ctx(node(one, mig, many, memory), phase="prolog")), "stale_job")
    assert [(f.gpu, f.message) for f in found] == [
        (1, "1 process(es) on the GPU before the job: pid 42"),
        (4, "3 process(es) on the GPU before the job: pid 7 and 2 more"),
        (6, "2048 MiB used with no process (limit 1024 MiB)"),
    ]
    assert [f.evidence for f in found] == [
        {"pids": [42], "memory_used_mib": 3.0},
        {"pids": [7, 8, 9], "memory_used_mib": None},
        {"memory_used_mib": 2048.0},
    ]
    assert all(f.severity is Severity.FAIL for f in found)


def test_row_remap_failure_pending_and_retired_pages() -> None:
    rows = {"remapped_rows_correctable": 3, "remapped_rows_uncorrectable": 1}
    failed = replace(healthy_gpu(1), remap_failure=True, remap_pending=True, **rows)
    pending = replace(healthy_gpu(3), remap_pending=True, **rows)
    retired = replace(healthy_gpu(5), retired_pages_pending=True)
    found = of(run_checks(ctx(node(failed, pending, retired))), "row_remap")
    assert [(f.gpu, f.message, f.severity) for f in found] == [
        (1, "row remapping failed: the GPU has no spare rows left", Severity.FAIL),
        (3, "row remap pending", Severity.FAIL),
        (5, "retired pages pending", Severity.FAIL),
    ]
    assert (
        found[0].evidence
        == found[1].evidence
        == {"remapped_rows": {"correctable": 3, "uncorrectable": 1}}
    )
    assert found[0].hint == "row remap failure: the GPU needs replacement (RMA); keep it drained"
    assert found[0].action is Action.DRAIN and found[1].action is Action.RESET


def test_an_unknown_utilization_is_idle_whatever_the_sites_threshold() -> None:
    unknown = replace(healthy_gpu(2), pcie_gen=3, pcie_gen_max=5, utilization_gpu_pct=None)
    settings = {"pcie_link": {"min_util_for_gen_pct": 1}}
    assert of(run_checks(ctx(node(unknown)), settings), "pcie_link") == []
    busy = replace(unknown, utilization_gpu_pct=1)
    assert [f.gpu for f in of(run_checks(ctx(node(busy)), settings), "pcie_link")] == [2]


def test_a_downgraded_pcie_link() -> None:
    narrow = replace(healthy_gpu(1), pcie_width=8, pcie_width_max=16)
    slow = replace(healthy_gpu(2), pcie_gen=3, pcie_gen_max=5, utilization_gpu_pct=50)
    idle = replace(healthy_gpu(3), pcie_gen=1, pcie_gen_max=5, utilization_gpu_pct=None)
    at_max = replace(healthy_gpu(4), pcie_gen=5, pcie_gen_max=5, utilization_gpu_pct=99)
    found = of(run_checks(ctx(node(narrow, slow, idle, at_max))), "pcie_link")
    assert [(f.gpu, f.message, f.evidence) for f in found] == [
        (1, "PCIe width x8, max x16", {"width": 8, "width_max": 16}),
        (2, "PCIe gen 3 under load, max gen 5",
         {"gen": 3, "gen_max": 5, "utilization_pct": 50}),
    ]  # fmt: skip
    assert all(f.severity is Severity.WARN for f in found)


def test_replay_and_correctable_ecc_warnings_name_what_grew() -> None:
    from tests.unit.test_counter_rates import Node, ecc, pcie

    gpu = Node()
    gpu.run(0, pcie(0))
    f = only(gpu.run(600, pcie(100)), "pcie_replay")
    assert f.message == "100 PCIe replays in 600 s (10/min)"
    gpu = Node()
    gpu.run(0, ecc(0))
    f = only(gpu.run(300, ecc(3000)), "ecc_correctable")
    assert f.message == "3000 correctable ECC errors in 300 s (600/min)"


def test_a_replay_rate_warns_from_its_threshold_on_with_its_evidence() -> None:
    from tests.unit.test_counter_rates import Node, pcie

    for replays, t, evidence in [
        (40, 300.0, {"per_min": 8.0, "count": 40, "window_s": 300.0}),  # 8/min: the threshold
        (43, 300.0625, {"per_min": 8.598, "count": 43, "window_s": 300.062}),
    ]:
        gpu = Node()
        gpu.run(0, pcie(0))
        f = only(gpu.run(t, pcie(replays)), "pcie_replay")
        assert (f.gpu, f.severity, f.action, f.evidence) == (
            6,
            Severity.WARN,
            Action.WARN,
            evidence,
        )
    gpu = Node()
    gpu.run(0, pcie(0))
    assert gpu.run(300, pcie(39)) == []  # 7.8/min


def test_clock_limits_named_per_gpu_with_the_mask_and_clock() -> None:
    """A GPU with no reason set before ones with faults: each fault reason its own finding,
    normal reasons (idle, SW power cap) none."""
    quiet = replace(healthy_gpu(0), clock_event_reasons=0)
    hot = replace(healthy_gpu(2), clock_event_reasons=0x8 | 0x4 | 0x40, sm_clock_mhz=1005)
    warm = replace(healthy_gpu(3), clock_event_reasons=0x20 | 0x1, sm_clock_mhz=1410)
    found = of(run_checks(ctx(node(quiet, hot, warm))), "clock_events")
    assert [(f.gpu, f.message, f.severity, f.action, f.evidence) for f in found] == [
        (2, "clocks limited by hw slowdown", Severity.FAIL, Action.DRAIN,
         {"reason": "hw_slowdown", "mask": "0x4c", "sm_clock_mhz": 1005}),
        (2, "clocks limited by hw thermal", Severity.FAIL, Action.DRAIN,
         {"reason": "hw_thermal", "mask": "0x4c", "sm_clock_mhz": 1005}),
        (3, "clocks limited by sw thermal", Severity.WARN, Action.WARN,
         {"reason": "sw_thermal", "mask": "0x21", "sm_clock_mhz": 1410}),
    ]  # fmt: skip


def test_thermal_margin_at_fail_and_below_warn_per_gpu() -> None:
    unknown = replace(healthy_gpu(0), margin_temperature_c=None)
    at_fail = replace(healthy_gpu(1), margin_temperature_c=0, temperature_c=87)
    warm = replace(healthy_gpu(4), margin_temperature_c=4, temperature_c=83)
    at_warn = replace(healthy_gpu(5), margin_temperature_c=5, temperature_c=82)
    found = of(run_checks(ctx(node(unknown, at_fail, warm, at_warn))), "thermal_margin")
    assert [(f.gpu, f.message, f.severity, f.action, f.evidence) for f in found] == [
        (1, "0 C of thermal margin left (87 C)", Severity.FAIL, Action.DRAIN,
         {"margin_c": 0, "temperature_c": 87}),
        (4, "4 C of thermal margin left (83 C)", Severity.WARN, Action.WARN,
         {"margin_c": 4, "temperature_c": 83}),
    ]  # fmt: skip


def test_nvlinks_down_per_gpu_as_check_prints_them() -> None:
    """A GPU without NVLink support first, then: a link down (with its peer), a link the
    design has but NVML does not report, links beyond the design that are off, and a MIG
    GPU (NVLink unused there)."""
    unsupported = replace(healthy_gpu(0), nvlinks=None)
    down = with_link(healthy_gpu(1), 3, active=False)
    short = healthy_gpu(2, links=17)
    links = tuple(healthy_link(n, active=n < 18) for n in range(20))  # 18 and 19: off by design
    extra = replace(healthy_gpu(4), nvlinks=links)
    mig = replace(with_link(healthy_gpu(5), 1, active=False), mig_mode=True)
    found = of(run_checks(ctx(node(unsupported, down, short, extra, mig))), "nvlink_inactive")
    assert [(f.gpu, f.message, f.evidence) for f in found] == [
        (1, "NVLink 3 inactive", {"link": 3, "expected_links": 18,
                                  "remote_pci_bus_id": healthy_link(3).remote_pci_bus_id}),
        (2, "NVLink 17 missing", {"link": 17, "remote_pci_bus_id": None, "expected_links": 18}),
    ]  # fmt: skip


def test_nvlinks_per_model_counts_unless_the_node_sets_topology_says_otherwise() -> None:
    sixteen = replace(healthy_gpu(1), nvlinks=tuple(
        healthy_link(n, active=n < 16) for n in range(18)))  # fmt: skip
    configured = ctx(node(sixteen), nvlinks_per_model={H100: 16})
    assert of(run_checks(configured), "nvlink_inactive") == []
    unknown = ctx(node(sixteen), nvlinks_per_model={"NVIDIA X1": 16})  # another model's count
    assert [f.evidence["link"] for f in of(run_checks(unknown), "nvlink_inactive")] == [16, 17]
    overridden = ctx(node(sixteen), nvlinks_per_model={H100: 16}, topology={"nvlinks": 17})
    by_sku = ctx(node(sixteen), nvlinks_per_model={H100: 16}, topology={"sku": "h200-sxm"})
    assert [f.evidence["link"] for f in of(run_checks(by_sku), "nvlink_inactive")] == [16, 17]
    found = of(run_checks(overridden), "nvlink_inactive")  # under the count: every link off
    assert [(f.message, f.evidence["expected_links"]) for f in found] == [
        ("NVLink 16 inactive", 17), ("NVLink 17 inactive", 17)
    ]  # fmt: skip


def test_nvlink_errors_as_check_prints_them() -> None:
    from tests.unit.test_counter_rates import Node

    def link4(**counters: int) -> GpuState:
        return with_link(healthy_gpu(2), 4, **counters)

    zero = {"replay_errors": 0, "recovery_errors": 0, "crc_flit_errors": 0, "crc_data_errors": 0}
    gpu = Node()
    gpu.run(0, link4(**zero))
    f = only(gpu.run(300, link4(replay_errors=10, recovery_errors=3, crc_flit_errors=20000,
                                crc_data_errors=10000)), "nvlink_errors")  # fmt: skip
    assert (f.gpu, f.severity, f.action) == (2, Severity.FAIL, Action.DRAIN)
    assert f.message == (
        "NVLink 4 errors growing: replay 2/min, recovery 0.6/min, crc 100/s over 300 s "
        "(judged from 300 s and 5 errors)"  # 3 recoveries: too few to judge
    )
    assert f.evidence == {
        "link": 4, "replay_per_min": 2.0, "recovery_per_min": 0.6, "crc_per_s": 100.0,
        "counts": {"replay": 10, "recovery": 3, "crc": 30000}, "window_s": 300.0,
        "failing": ["replay", "crc"],
    }  # fmt: skip
    gpu = Node()
    gpu.run(0, link4(**zero))
    at = only(gpu.run(300, link4(replay_errors=5, recovery_errors=5, crc_flit_errors=29999)),
              "nvlink_errors")  # fmt: skip
    assert at.message == (
        "NVLink 4 errors growing: replay 1/min, recovery 1/min, crc 100/s over 300 s"
    )  # at the replay and recovery limits (they fail), just below the CRC one
    assert (at.evidence["failing"], at.evidence["crc_per_s"]) == (["replay", "recovery"], 99.997)
    gpu = Node()
    gpu.run(0, link4(**zero))
    odd = only(gpu.run(300.0625, link4(replay_errors=7, recovery_errors=7)), "nvlink_errors")
    assert odd.message == "NVLink 4 errors growing: replay 1.4/min, recovery 1.4/min over 300 s"
    assert {k: odd.evidence[k] for k in ("replay_per_min", "recovery_per_min", "crc_per_s",
                                         "window_s", "counts")} == {
        "replay_per_min": 1.4, "recovery_per_min": 1.4, "crc_per_s": 0.0, "window_s": 300.062,
        "counts": {"replay": 7, "recovery": 7},
    }  # fmt: skip
    gpu = Node()
    gpu.run(0, link4(**zero))
    five = only(gpu.run(5, link4(replay_errors=5)), "nvlink_errors")  # min_count, too soon
    assert (five.severity, five.action, five.evidence["failing"]) == (
        Severity.WARN, Action.WARN, []
    )  # fmt: skip
    gpu = Node()
    gpu.run(0, link4(**zero))
    burst = only(gpu.run(300, link4(crc_flit_errors=29999)), "nvlink_errors")
    assert (burst.severity, burst.action, burst.evidence["failing"]) == (
        Severity.WARN, Action.WARN, []
    )  # fmt: skip
    assert (burst.evidence["replay_per_min"], burst.evidence["recovery_per_min"]) == (0.0, 0.0)


def test_uncorrectable_ecc_errors_per_gpu_volatile_before_lifetime() -> None:
    vol = replace(healthy_gpu(1), ecc_volatile_uncorrectable=2, ecc_aggregate_uncorrectable=7)
    agg = replace(healthy_gpu(3), ecc_volatile_uncorrectable=0, ecc_aggregate_uncorrectable=4)
    found = of(run_checks(ctx(node(vol, agg))), "ecc_uncorrectable")
    assert [(f.gpu, f.message, f.severity, f.action, f.evidence) for f in found] == [
        (1, "2 volatile uncorrectable ECC error(s)", Severity.FAIL, Action.RESET,
         {"volatile": 2, "aggregate": 7}),
        (3, "4 aggregate (lifetime) uncorrectable ECC error(s)", Severity.WARN, Action.WARN,
         {"aggregate": 4}),
    ]  # fmt: skip


def test_a_node_without_active_nvlinks_still_judges_its_known_models() -> None:
    """No link up anywhere: a model nobody knows is not judged, an H100 after it is."""
    dark = tuple(healthy_link(n, active=False) for n in range(18))
    odd = replace(healthy_gpu(0), name="NVIDIA X1", nvlinks=dark)
    h100 = replace(healthy_gpu(1), nvlinks=dark)
    found = of(run_checks(ctx(node(odd, h100, count=2))), "nvlink_inactive")
    assert {f.gpu for f in found} == {1} and len(found) == 18
