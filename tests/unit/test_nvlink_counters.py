"""NVLink error counters through the per-link counter API or, where the GPU answers only
field values (Hopper, Blackwell), through ``nvmlDeviceGetFieldValues``: the same counters and
the same findings either way, each field's own return code judged on its own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pynvml
import pytest

from slurmhealth.checks import CheckContext, run_checks
from slurmhealth.gpu.nvml import NvmlBackend
from slurmhealth.gpu.sim import SimHandle, SimulatedNvml
from slurmhealth.model import GpuStatus, NodeSnapshot, Severity
from tests.unit.sim_backend import FakeClock, SimBackends, findings_since

H100_FIELD_VALUES_ONLY = '[all_gpus]\nnot_supported = ["nvlink_counter_api"]\n'
GROWING = (
    "[[faults]]\ngpu = 2\nat = 100\n"
    'rate = { "nvlink.4.replay" = 10.0, "nvlink.15.recovery" = 1.0, "nvlink.5.crc_data" = 3.0 }\n'
)
Backends = Callable[..., NvmlBackend]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Backends]:
    backends = SimBackends(tmp_path)
    yield backends
    backends.close_all()


class CountingNvml(SimulatedNvml):
    """Counts the calls of the two NVLink error interfaces."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.counter_calls = 0
        self.field_calls: list[int] = []  # fields asked per call

    def nvmlDeviceGetNvLinkErrorCounter(self, h: SimHandle, link: int, counter: int) -> int:
        self.counter_calls += 1
        return super().nvmlDeviceGetNvLinkErrorCounter(h, link, counter)

    def nvmlDeviceGetFieldValues(self, h: SimHandle, field_ids: list[Any]) -> Any:
        self.field_calls.append(len(field_ids))
        return super().nvmlDeviceGetFieldValues(h, field_ids)


def link_counters(snap: NodeSnapshot, gpu: int) -> dict[int, tuple[int | None, ...]]:
    g = snap.gpu(gpu)
    assert g is not None and g.nvlinks is not None
    return {
        link.link: (link.replay_errors, link.recovery_errors, link.crc_flit_errors,
                    link.crc_data_errors)
        for link in g.nvlinks
    }  # fmt: skip


def test_field_values_give_the_counters_the_counter_api_gives(make: Backends) -> None:
    clock = FakeClock(130)
    counter_api = make(GROWING, clock=clock).snapshot()
    fields_only = make(H100_FIELD_VALUES_ONLY + GROWING, clock=clock).snapshot()
    want = link_counters(counter_api, 2)
    assert (want[4][0], want[15][1], want[5][3]) == (300, 30, 90)
    got = link_counters(fields_only, 2)
    for link in range(18):
        if link < 12:
            assert got[link] == want[link], link
        else:  # no field id carries data CRC beyond link 11: unknown, never zero
            assert got[link] == (*want[link][:3], None), link
    assert fields_only.gpu(2) is not None and fields_only.gpu(2).error is None  # type: ignore[union-attr]


def test_counter_api_is_given_up_after_the_first_link(make: Backends) -> None:
    backend = make("gpus = 1\n" + H100_FIELD_VALUES_ONLY, lib_class=CountingNvml)
    backend.snapshot()
    lib = backend.lib
    assert lib.counter_calls == 4  # one NotSupported per counter, not 4 x 18
    # 18 links x 3 link-scoped ids + 12 links x 4 per-link ids, in batches of at most 64
    assert sum(lib.field_calls) == 18 * 3 + 12 * 4
    assert max(lib.field_calls) <= 64


def test_counter_api_that_works_needs_no_field_values(make: Backends) -> None:
    backend = make("gpus = 1\n", lib_class=CountingNvml)
    backend.snapshot()
    assert (backend.lib.counter_calls, backend.lib.field_calls) == (18 * 4, [])


def test_growing_counters_fail_through_field_values(make: Backends) -> None:
    clock = FakeClock(130)
    backend = make(H100_FIELD_VALUES_ONLY + GROWING, clock=clock)
    first = backend.snapshot()
    clock.at(190)
    second = backend.snapshot()
    findings = findings_since(first, second)
    assert {(f.check, f.severity, f.gpu, f.evidence["link"]) for f in findings} == {
        ("nvlink_errors", Severity.FAIL, 2, 4),
        ("nvlink_errors", Severity.FAIL, 2, 15),  # link 15: only the link-scoped id has it
        ("nvlink_errors", Severity.WARN, 2, 5),
    }


def test_nvlink_errors_unsupported_everywhere_is_unknown(make: Backends) -> None:
    snap = make('[all_gpus]\nnot_supported = ["nvlink_counter_api", "nvlink_errors"]\n').snapshot()
    for g in snap.gpus:
        assert g.status is GpuStatus.OK and g.error is None
        assert set(link_counters(snap, g.index)[0]) == {None}
    assert run_checks(CheckContext(snapshot=snap)) == []


class FieldCodes(SimulatedNvml):
    """Field values where chosen field ids answer a chosen per-field error code."""

    codes: ClassVar[dict[int, int]] = {}

    def nvmlDeviceGetFieldValues(self, h: SimHandle, field_ids: list[Any]) -> Any:
        values = super().nvmlDeviceGetFieldValues(h, field_ids)
        for fv in values:
            if h.index == 1 and fv.fieldId in self.codes:
                fv.nvmlReturn = self.codes[fv.fieldId]
        return values


def field_codes(codes: dict[int, int]) -> type[SimulatedNvml]:
    return type("Codes", (FieldCodes,), {"codes": codes})


SCOPED = (
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
)


def test_per_link_ids_answer_where_the_scoped_ids_are_unsupported(make: Backends) -> None:
    lib_class = field_codes(dict.fromkeys(SCOPED, pynvml.NVML_ERROR_NOT_SUPPORTED))
    backend = make(H100_FIELD_VALUES_ONLY + GROWING, lib_class=lib_class, clock=FakeClock(130))
    snap = backend.snapshot()
    got = link_counters(snap, 1)
    assert all(None not in got[link] for link in range(12))
    assert all(got[link] == (None,) * 4 for link in range(12, 18))
    g1 = snap.gpu(1)
    assert g1 is not None and g1.status is GpuStatus.OK and g1.error is None


def test_a_field_that_says_gpu_lost_loses_the_gpu(make: Backends) -> None:
    lib_class = field_codes({SCOPED[0]: pynvml.NVML_ERROR_GPU_IS_LOST})
    snap = make(H100_FIELD_VALUES_ONLY, lib_class=lib_class).snapshot()
    g1 = snap.gpu(1)
    assert g1 is not None and g1.status is GpuStatus.LOST
    assert g1.error is not None and "nvmlDeviceGetFieldValues" in g1.error
    assert all(g.status is GpuStatus.OK for g in snap.gpus if g.index != 1)


def test_a_field_with_another_error_is_noted_and_unknown(make: Backends) -> None:
    lib_class = field_codes({SCOPED[0]: pynvml.NVML_ERROR_UNKNOWN})
    snap = make(H100_FIELD_VALUES_ONLY, lib_class=lib_class).snapshot()
    g1 = snap.gpu(1)
    assert g1 is not None and g1.status is GpuStatus.OK
    assert g1.error is not None and f"field {SCOPED[0]}/0" in g1.error
    got = link_counters(snap, 1)
    assert got[0] == (0, 0, 0, 0)  # the per-link id for links 0..11 still answered
    assert got[17][0] is None  # link 17 has only the scoped id
    findings = run_checks(CheckContext(snapshot=snap))
    assert [(f.check, f.gpu) for f in findings] == [("nvml_error", 1)]
