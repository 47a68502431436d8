"""The NVML adapter, driven through the simulated NVML library.

Every test runs ``NvmlBackend(SimulatedNvml(load_scenario(path), node))``: the adapter's own
code against pynvml's return shapes and exception classes.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from slurmhealth.checks import CheckContext, run_checks, window_of
from slurmhealth.checks.counters import load, remember
from slurmhealth.errors import GpuBackendError
from slurmhealth.gpu.nvml import NvmlBackend
from slurmhealth.gpu.scenario import SUPPORT_GROUPS
from slurmhealth.gpu.sim import SimHandle, SimulatedNvml
from slurmhealth.kernel_log import parse_line, parse_xid
from slurmhealth.model import GpuState, GpuStatus, NodeSnapshot, Severity
from tests.unit.sim_backend import EPOCH, NODE, FakeClock, SimBackends

H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., NvmlBackend]]:
    """Build a backend from scenario text; every backend is closed (hung calls released)."""
    backends = SimBackends(tmp_path)
    yield backends
    backends.close_all()


def findings_of(snapshot: NodeSnapshot, **kw: Any) -> list[Any]:
    return run_checks(CheckContext(snapshot=snapshot, **kw))


# -- a healthy node ----------------------------------------------------------------------


def test_healthy_node_reads_every_field(make: Callable[..., NvmlBackend]) -> None:
    snap = make().snapshot()
    assert (snap.node, snap.device_count, len(snap.gpus)) == (NODE, 8, 8)
    assert (snap.driver_version, snap.nvml_version) == ("550.90.07", "12.550.90.07")
    assert snap.ts == EPOCH + 10
    g = snap.gpus[3]
    assert (g.index, g.status, g.error, g.name) == (3, GpuStatus.OK, None, H100)
    assert g.pci_bus_id == "00000000:5D:00.0"
    assert g.uuid is not None and g.uuid.startswith("GPU-")
    assert len({gpu.uuid for gpu in snap.gpus}) == 8
    assert (g.power_w, g.power_limit_w) == (71.0, 700.0)
    assert g.memory_total_bytes == 81559 * 2**20
    assert g.clock_event_reasons == 0x1
    assert g.nvlinks is not None and len(g.nvlinks) == 18
    assert all(link.active for link in g.nvlinks)
    assert (g.fabric_state, g.fabric_status) == ("completed", "ok")
    assert findings_of(snap, expected_count=8, nvlinks_per_model={H100: 18}) == []


def test_devices_enumerates_gpus(make: Callable[..., NvmlBackend]) -> None:
    assert make("gpus = 4").devices() == [0, 1, 2, 3]


# -- not supported -> None, never a finding ----------------------------------------------

# GpuState fields each group of NVML calls fills; "nvlinks[].x" means x of every NvLink.
GROUP_FIELDS: dict[str, tuple[str, ...]] = {
    "serial": ("serial",),
    "minor_number": ("minor_number",),
    "persistence_mode": ("persistence_mode",),
    "temperature": ("temperature_c",),
    "margin_temperature": ("margin_temperature_c",),
    "power": ("power_w",),
    "power_limit": ("power_limit_w",),
    "energy": ("energy_j",),
    "utilization": ("utilization_gpu_pct", "utilization_memory_pct"),
    "memory": ("memory_total_bytes", "memory_used_bytes"),
    "clocks": ("sm_clock_mhz", "sm_clock_max_mhz", "mem_clock_mhz"),
    "clock_event_reasons": ("clock_event_reasons",),
    "pcie": ("pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max"),
    "pcie_replay": ("pcie_replay_errors",),
    "ecc": (
        "ecc_enabled",
        "ecc_volatile_uncorrectable",
        "ecc_volatile_correctable",
        "ecc_aggregate_uncorrectable",
    ),
    "row_remap": (
        "remapped_rows_correctable",
        "remapped_rows_uncorrectable",
        "remap_pending",
        "remap_failure",
    ),
    "retired_pages": ("retired_pages_pending",),
    "nvlink": ("nvlinks",),
    "nvlink_errors": (
        "nvlinks[].replay_errors",
        "nvlinks[].recovery_errors",
        "nvlinks[].crc_flit_errors",
        "nvlinks[].crc_data_errors",
    ),
    "nvlink_counter_api": (),  # the field-value API answers instead (test_nvlink_counters.py)
    "fabric": ("fabric_state", "fabric_status"),
    "processes": ("processes",),
    # an older library without nvmlDeviceGetGpuFabricInfoV: the old call answers state/status
    "fabric_v": ("fabric_clique_id", "fabric_health_mask"),
    "mig": ("mig_mode",),
}
# Retired pages are only read on GPUs without row remapping (V100 and older).
ALSO_UNSUPPORTED = {"retired_pages": ["row_remap"]}


def field_values(gpu: GpuState, name: str) -> list[Any]:
    if name.startswith("nvlinks[]."):
        assert gpu.nvlinks, "links are needed to judge their counters"
        return [getattr(link, name.removeprefix("nvlinks[].")) for link in gpu.nvlinks]
    return [getattr(gpu, name)]


def test_group_mapping_covers_every_support_group() -> None:
    assert set(GROUP_FIELDS) == set(SUPPORT_GROUPS)


@pytest.mark.parametrize("group", SUPPORT_GROUPS)
def test_unsupported_group_is_none_and_never_a_finding(
    group: str, make: Callable[..., NvmlBackend]
) -> None:
    base = ALSO_UNSUPPORTED.get(group, [])
    baseline = make(f"[all_gpus]\nnot_supported = {base!r}\n").snapshot()
    for g in baseline.gpus:  # the fields are read when supported, so None below means something
        for name in GROUP_FIELDS[group]:
            assert None not in field_values(g, name), (group, name)

    snap = make(f"[all_gpus]\nnot_supported = {[*base, group]!r}\n").snapshot()
    assert len(snap.gpus) == 8
    for g in snap.gpus:
        assert (g.status, g.error) == (GpuStatus.OK, None), g
        for name in GROUP_FIELDS[group]:
            assert set(field_values(g, name)) == {None}, (group, name)
    assert findings_of(snap) == []
    assert findings_of(snap, phase="prolog", expected_count=8, gpus=(0, 7)) == []


# -- GPUs that are gone ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "status", "check"),
    [
        ("lost", GpuStatus.LOST, "gpu_lost"),
        ("reset_required", GpuStatus.RESET_REQUIRED, "gpu_reset_required"),
    ],
)
def test_gone_gpu_is_critical_others_fine(
    field: str, status: GpuStatus, check: str, make: Callable[..., NvmlBackend]
) -> None:
    snap = make(f"[gpu.5]\n{field} = true\n").snapshot()
    g5 = snap.gpu(5)
    assert g5 is not None and g5.status is status
    assert g5.error
    for g in snap.gpus:
        if g.index != 5:
            assert g.status is GpuStatus.OK and g.uuid and g.nvlinks
    findings = findings_of(snap, nvlinks_per_model={H100: 18})
    assert [(f.check, f.severity, f.gpu) for f in findings] == [(check, Severity.CRITICAL, 5)]


def test_hung_gpu_is_unresponsive_within_the_deadline(make: Callable[..., NvmlBackend]) -> None:
    backend = make("[gpu.2]\nhang = true\n", timeout_s=1.0)
    t0 = time.monotonic()
    snap = backend.snapshot()
    elapsed = time.monotonic() - t0
    assert elapsed < 1.0 + 10  # the call hangs 600 s: cut at the deadline (slack for a busy CI)
    g2 = snap.gpu(2)
    assert g2 is not None and g2.status is GpuStatus.UNRESPONSIVE
    assert g2.error is not None and "1 s" in g2.error
    stuck = re.search(r"stuck in (nvml\w+)", g2.error)
    assert stuck is not None, g2.error
    assert hasattr(backend.lib, stuck.group(1))  # a real NVML function name
    for g in snap.gpus:
        if g.index != 2:
            assert g.status is GpuStatus.OK and g.temperature_c is not None
    findings = findings_of(snap)
    assert [(f.check, f.gpu) for f in findings] == [("gpu_unresponsive", 2)]
    assert "stuck in" in findings[0].message


def test_snapshot_reads_only_the_gpus_asked_for(make: Callable[..., NvmlBackend]) -> None:
    # GPU 2 hangs: if it were read, the snapshot would take its 10 s deadline
    backend = make("[gpu.2]\nhang = true\n", timeout_s=10.0)
    t0 = time.monotonic()
    snap = backend.snapshot([0, 3])
    assert time.monotonic() - t0 < 10.0
    assert [g.index for g in snap.gpus] == [0, 3]
    assert all(g.status is GpuStatus.OK for g in snap.gpus)
    assert snap.device_count == 8  # the node still has 8


def test_snapshot_skips_indices_beyond_the_device_count(make: Callable[..., NvmlBackend]) -> None:
    snap = make("gpus = 4").snapshot([1, 6])
    assert [g.index for g in snap.gpus] == [1]
    assert snap.device_count == 4
    f = findings_of(snap, gpus=(1, 6))
    assert [(x.check, x.evidence["missing"]) for x in f] == [("gpu_count", [6])]


# -- time-varying faults -----------------------------------------------------------------


def _link7(snap: NodeSnapshot, index: int = 3) -> bool | None:
    g = snap.gpu(index)
    assert g is not None and g.nvlinks is not None
    return {link.link: link.active for link in g.nvlinks}[7]


def test_fault_set_at_zero_is_visible(make: Callable[..., NvmlBackend]) -> None:
    backend = make('[[faults]]\ngpu = 3\nat = 0\nset = {"nvlink.7.state" = "inactive"}\n')
    snap = backend.snapshot()
    assert _link7(snap, 3) is False
    assert _link7(snap, 2) is True  # only GPU 3
    f = findings_of(snap, nvlinks_per_model={H100: 18})
    assert [(x.check, x.gpu, x.evidence["link"]) for x in f] == [("nvlink_inactive", 3, 7)]


def test_fault_in_the_future_is_not_yet_visible(make: Callable[..., NvmlBackend]) -> None:
    clock = FakeClock(10)
    text = '[[faults]]\ngpu = 3\nat = 3600\nset = {"nvlink.7.state" = "inactive"}\n'
    backend = make(text, clock=clock)
    assert _link7(backend.snapshot()) is True
    assert findings_of(backend.snapshot(), nvlinks_per_model={H100: 18}) == []
    clock.at(3600)
    assert _link7(backend.snapshot()) is False


def test_fault_until_ends_it(make: Callable[..., NvmlBackend]) -> None:
    clock = FakeClock(10)
    backend = make(
        "[[faults]]\ngpu = 1\nat = 0\nuntil = 60\nset = { margin_temperature = 0 }\n", clock=clock
    )
    g = backend.snapshot().gpu(1)
    assert g is not None and g.margin_temperature_c == 0
    clock.at(61)
    g = backend.snapshot().gpu(1)
    assert g is not None and g.margin_temperature_c == 52


def test_rate_fault_grows_with_the_scenario_clock(make: Callable[..., NvmlBackend]) -> None:
    clock = FakeClock(50)
    backend = make(
        "[[faults]]\ngpu = 2\nat = 100\nrate = { nvlink.4.replay = 10.0 }\n", clock=clock
    )

    def replays(snap: NodeSnapshot) -> int | None:
        g = snap.gpu(2)
        assert g is not None and g.nvlinks is not None
        return g.nvlinks[4].replay_errors

    before = backend.snapshot()
    assert replays(before) == 0
    clock.at(130)
    first = backend.snapshot()
    assert replays(first) == 300
    clock.at(190)
    second = backend.snapshot()
    assert replays(second) == 900
    assert second.ts - first.ts == 60
    other = second.gpu(1)
    assert other is not None and other.nvlinks is not None and other.nvlinks[4].replay_errors == 0

    history = remember(load(None), first, window_of())
    clock.at(130 + window_of())  # a rate is judged over the check's minimum window
    findings = run_checks(CheckContext(snapshot=backend.snapshot(), counter_history=history))
    assert [(f.check, f.severity, f.gpu, f.evidence["link"]) for f in findings] == [
        ("nvlink_errors", Severity.FAIL, 2, 4)
    ]
    assert findings[0].evidence["replay_per_min"] == pytest.approx(600)


# -- Xid events --------------------------------------------------------------------------


def test_wait_xid_returns_the_event_once(make: Callable[..., NvmlBackend]) -> None:
    backend = make('[[faults]]\ngpu = 3\nat = 0\nxid = 79\nxid_message = "fell off"\n')
    events = backend.wait_xid(2.0)
    assert len(events) == 1
    ev = events[0]
    assert (ev.xid, ev.pci_bus_id) == (79, "0000:5d:00.0")
    assert ev.ts == EPOCH + 10
    t0 = time.monotonic()
    assert backend.wait_xid(0.1) == []  # delivered already
    assert time.monotonic() - t0 < 1.0

    # the simulator also wrote it as a kernel-log line naming the same GPU
    log = Path(str(backend.kernel_log_hint)).read_text().splitlines()
    xids = [parse_xid(parse_line(line)[2]) for line in log]
    assert [(x.xid, x.pci_bus_id) for x in xids if x] == [(79, "0000:5d:00.0")]
    snap = backend.snapshot()
    f = run_checks(CheckContext(snapshot=snap, xids=tuple(events)))
    assert [(x.check, x.gpu, x.severity) for x in f] == [("xid", 3, Severity.CRITICAL)]


def test_wait_xid_times_out_empty(make: Callable[..., NvmlBackend]) -> None:
    backend = make("[[faults]]\ngpu = 3\nat = 3600\nxid = 79\n")
    t0 = time.monotonic()
    assert backend.wait_xid(0.2) == []
    assert 0.15 < time.monotonic() - t0 < 1.5


def test_close_frees_the_xid_event_set(make: Callable[..., NvmlBackend]) -> None:
    backend = make("[[faults]]\ngpu = 3\nat = 0\nxid = 79\n")
    lib = backend.lib
    assert len(backend.wait_xid(2.0)) == 1
    assert backend.wait_xid(0.05) == []
    assert (len(lib.event_sets), lib.open_event_sets) == (1, 1)  # one set, reused
    backend.close()
    assert lib.open_event_sets == 0
    assert lib.event_sets[0].handles, "the GPUs were registered on the set that was freed"


def test_close_without_waiting_makes_no_event_set(make: Callable[..., NvmlBackend]) -> None:
    backend = make()
    backend.snapshot()
    backend.close()
    assert backend.lib.event_sets == []


class OrderedNvml(SimulatedNvml):
    """Logs when an event wait ends and when its set is freed."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.log: list[str] = []

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        try:
            return super().nvmlEventSetWait_v2(event_set, timeout_ms)
        finally:
            self.log.append("wait ended")

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self.log.append("free")
        super().nvmlEventSetFree(event_set)


def test_close_frees_the_set_only_after_a_wait_in_another_thread(
    make: Callable[..., NvmlBackend],
) -> None:
    backend = make("[[faults]]\ngpu = 3\nat = 3600\nxid = 79\n", lib_class=OrderedNvml)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(backend.wait_xid(0.5)))
    waiter.start()
    while not backend.lib.event_sets:  # the waiter is about to wait on the set
        time.sleep(0.01)
    backend.close()
    waiter.join(2.0)
    assert got == [[]]
    assert backend.lib.log == ["wait ended", "free"]  # never freed under the waiting call
    assert backend.lib.open_event_sets == 0


# -- NVML that does not start ------------------------------------------------------------


class DriverNotLoaded(SimulatedNvml):
    def nvmlInit(self) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)


class DriverNotLoadedWithConstant(DriverNotLoaded):
    NVML_ERROR_DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED


def test_driver_not_loaded_gives_a_hint(make: Callable[..., NvmlBackend]) -> None:
    backend = make(lib_class=DriverNotLoaded)
    with pytest.raises(GpuBackendError) as info:
        backend.snapshot()
    assert "kernel module" in info.value.hint
    assert "kernel module" in str(info.value)


def test_driver_not_loaded_hint_when_the_library_names_the_code(
    make: Callable[..., NvmlBackend],
) -> None:
    backend = make(lib_class=DriverNotLoadedWithConstant)
    with pytest.raises(GpuBackendError) as info:
        backend.snapshot()
    assert "Driver Not Loaded" in str(info.value)
    assert "kernel module" in info.value.hint and "lsmod" in str(info.value)
    with pytest.raises(GpuBackendError):
        backend.devices()


# -- what the library returns ------------------------------------------------------------


class BytesNvml(SimulatedNvml):
    """Older pynvml releases return ``bytes`` for strings."""

    def nvmlDeviceGetUUID(self, h: SimHandle) -> bytes:  # type: ignore[override]
        return super().nvmlDeviceGetUUID(h).encode()

    def nvmlDeviceGetName(self, h: SimHandle) -> bytes:  # type: ignore[override]
        return super().nvmlDeviceGetName(h).encode()

    def nvmlDeviceGetSerial(self, h: SimHandle) -> bytes:  # type: ignore[override]
        return super().nvmlDeviceGetSerial(h).encode()

    def nvmlSystemGetDriverVersion(self) -> bytes:  # type: ignore[override]
        return super().nvmlSystemGetDriverVersion().encode()

    def nvmlSystemGetNVMLVersion(self) -> bytes:  # type: ignore[override]
        return super().nvmlSystemGetNVMLVersion().encode()


def test_bytes_from_the_library_are_decoded(make: Callable[..., NvmlBackend]) -> None:
    plain = make().snapshot()
    snap = make(lib_class=BytesNvml).snapshot()
    assert (snap.driver_version, snap.nvml_version) == ("550.90.07", "12.550.90.07")
    for g, p in zip(snap.gpus, plain.gpus, strict=True):
        assert (g.uuid, g.name, g.serial, g.pci_bus_id) == (p.uuid, p.name, p.serial, p.pci_bus_id)
        assert all(isinstance(v, str) for v in (g.uuid, g.name, g.serial, g.pci_bus_id))
        assert g.nvlinks is not None
        assert all(isinstance(link.remote_pci_bus_id, str) for link in g.nvlinks)
    assert findings_of(snap, nvlinks_per_model={H100: 18}) == []


class UuidFails(SimulatedNvml):
    def nvmlDeviceGetUUID(self, h: SimHandle) -> str:
        if h.index == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
        return super().nvmlDeviceGetUUID(h)


def test_other_nvml_error_is_recorded_on_the_gpu(make: Callable[..., NvmlBackend]) -> None:
    snap = make(lib_class=UuidFails).snapshot()
    g1 = snap.gpu(1)
    assert g1 is not None and g1.status is GpuStatus.OK
    assert g1.error is not None and "nvmlDeviceGetUUID" in g1.error
    f = findings_of(snap)
    assert [(x.check, x.gpu, x.severity) for x in f] == [("nvml_error", 1, Severity.INFO)]


def test_unreadable_uuid_is_none_not_the_string_none(make: Callable[..., NvmlBackend]) -> None:
    snap = make(lib_class=UuidFails).snapshot()
    g1 = snap.gpu(1)
    assert g1 is not None and g1.uuid is None
