"""Recording NVML answers and replaying them: a replay gives the snapshots, Xids and findings
the recorded run gave, whatever the recorded GPUs answered (values, errors, structures filled
by reference, field values, hangs)."""

from __future__ import annotations

import ctypes
import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pynvml
import pytest

from slurmhealth.errors import ScenarioError
from slurmhealth.gpu.nvml import NvmlBackend
from slurmhealth.gpu.recording import FORMAT, Encoder, RecordingNvml, timings, write_recording
from slurmhealth.gpu.replay import ReplayNvml, decode, load_recording
from slurmhealth.gpu.scenario import load_scenario
from slurmhealth.gpu.sim import SimulatedNvml
from slurmhealth.model import GpuStatus, NodeSnapshot, Severity
from tests.unit.sim_backend import EPOCH, NODE, FakeClock, findings_since

FAULTY = """
[gpu.1.nvlink.3]
state = "inactive"
[gpu.3]
not_supported = ["nvlink_counter_api"]
[gpu.4]
fabric_state = "in_progress"
[gpu.5]
lost = true
[gpu.6]
ecc_volatile_uncorrectable = 1
[[faults]]
gpu = [2, 3]
at = 100
rate = { "nvlink.4.replay" = 10.0, "nvlink.14.recovery" = 2.0 }
[[faults]]
gpu = 0
at = 0
xid = 79
"""


def sim(tmp_path: Path, text: str, clock: Callable[[], float]) -> SimulatedNvml:
    path = tmp_path / "live.toml"
    path.write_text(text)
    return SimulatedNvml(
        load_scenario(str(path)),
        NODE,
        epoch=EPOCH,
        kernel_log_path=str(tmp_path / "kmsg"),
        clock=clock,
    )


def run(
    backend: NvmlBackend, between: Callable[[], None], xids: bool = True
) -> tuple[NodeSnapshot, ...]:
    """What a device check does: snapshot, wait for Xids, snapshot again. (Registering for
    Xids reads every GPU without a deadline, so a test with a hung GPU skips it.)"""
    first = backend.snapshot()
    between()
    if xids:
        assert len(backend.wait_xid(0.2)) <= 1
    second = backend.snapshot()
    return first, second


def same(snap: NodeSnapshot) -> NodeSnapshot:
    return dataclasses.replace(snap, duration_s=0.0)


# The snapshot deadline: generous, so that a GPU that answers is never cut on a loaded CI
# machine; the hung-GPU test takes a short one (a hung read is cut at the deadline).
ANSWERS_S, HANG_S = 30.0, 2.0


def record(
    tmp_path: Path, text: str, xids: bool = True, timeout_s: float = ANSWERS_S
) -> tuple[tuple[NodeSnapshot, ...], Path]:
    clock = FakeClock(130)
    rec = RecordingNvml(sim(tmp_path, text, clock), clock=clock)
    backend = NvmlBackend(rec, node=NODE, clock=rec.clock, timeout_s=timeout_s)
    snaps = run(backend, lambda: clock.at(190), xids)
    out = tmp_path / "recording.json"
    write_recording(str(out), rec.recording(node=NODE))  # before close: a hung call is hung
    backend.close()
    return snaps, out


def replay(path: Path, timeout_s: float = ANSWERS_S) -> tuple[NvmlBackend, ReplayNvml]:
    lib = ReplayNvml(load_recording(str(path)))
    return NvmlBackend(lib, node=NODE, clock=lib.clock, timeout_s=timeout_s), lib


def test_replay_gives_the_recorded_snapshots_and_findings(tmp_path: Path) -> None:
    live, path = record(tmp_path, FAULTY)
    backend, lib = replay(path)
    again = run(backend, lambda: None)
    backend.close()
    assert [same(s) for s in again] == [same(s) for s in live]
    assert lib.missed == []
    got = {(f.check, f.severity, f.gpu) for f in findings_since(*again)}
    assert got == {(f.check, f.severity, f.gpu) for f in findings_since(*live)}
    assert {
        ("nvlink_inactive", Severity.FAIL, 1),
        ("nvlink_errors", Severity.FAIL, 2),
        ("nvlink_errors", Severity.FAIL, 3),  # read through field values
        ("fabric_state", Severity.FAIL, 4),
        ("gpu_lost", Severity.CRITICAL, 5),
        ("ecc_uncorrectable", Severity.FAIL, 6),
    } <= got, got


def test_replayed_xid_and_times_are_the_recorded_ones(tmp_path: Path) -> None:
    _, path = record(tmp_path, FAULTY)
    backend, _ = replay(path)
    first = backend.snapshot()
    (xid,) = backend.wait_xid(0.7)  # another timeout than recorded: the recorded answer
    assert backend.wait_xid(0.3) == []  # the recorded timeout, at once
    second = backend.snapshot()
    backend.close()
    assert (xid.xid, xid.pci_bus_id) == (79, "0000:18:00.0")
    assert (first.ts, second.ts) == (EPOCH + 130, EPOCH + 190)


def test_a_recorded_hang_replays_as_an_unresponsive_gpu(tmp_path: Path) -> None:
    (live, _), path = record(tmp_path, "[gpu.2]\nhang = true\n", xids=False, timeout_s=HANG_S)
    assert live.gpu(2) is not None and live.gpu(2).status is GpuStatus.UNRESPONSIVE  # type: ignore[union-attr]
    data = json.loads(path.read_text())
    assert any(call.get("hang") for call in data["calls"])
    backend, _ = replay(path, HANG_S)
    snap = backend.snapshot()
    backend.close()
    g2 = snap.gpu(2)
    assert g2 is not None and g2.status is GpuStatus.UNRESPONSIVE
    assert g2.error is not None and "stuck in nvmlDevice" in g2.error
    assert all(g.status is GpuStatus.OK for g in snap.gpus if g.index != 2)


def test_recording_holds_codes_structures_and_timings(tmp_path: Path) -> None:
    _, path = record(tmp_path, FAULTY)
    data = json.loads(path.read_text())
    assert data["format"] == FORMAT and data["node"] == NODE
    calls = data["calls"]
    lost = [c for c in calls if (c["fn"], c["args"]) == ("nvmlDeviceGetHandleByIndex", [5])]
    assert lost and {c["error"] for c in lost} == {pynvml.NVML_ERROR_GPU_IS_LOST}
    fabric = next(c for c in calls if c["fn"] == "nvmlDeviceGetGpuFabricInfoV")
    assert fabric["args"][1] == {"byref": True}
    assert fabric["out"]["1"]["fields"]["state"] in (2, 3)
    fields = next(c for c in calls if c["fn"] == "nvmlDeviceGetFieldValues")
    assert fields["args"][0] == {"handle": 3}
    first = fields["result"][0]["fields"]
    assert (first["nvmlReturn"], first["scopeId"]) == (0, 0)
    rows = timings(calls)
    assert {r[0] for r in rows} >= {"nvmlDeviceGetTemperature", "nvmlDeviceGetFieldValues"}
    temp = next(r for r in rows if r[0] == "nvmlDeviceGetTemperature")
    assert temp[1] == 2 * 7  # two snapshots of the seven GPUs that answer
    assert 0 <= temp[2] <= temp[3]


def test_a_call_the_recording_lacks_answers_not_supported(tmp_path: Path) -> None:
    _, path = record(tmp_path, "gpus = 2\n")
    data = json.loads(path.read_text())
    data["calls"] = [c for c in data["calls"] if c["fn"] != "nvmlDeviceGetTemperature"]
    path.write_text(json.dumps(data))
    backend, lib = replay(path)
    snap = backend.snapshot()
    backend.close()
    assert [g.temperature_c for g in snap.gpus] == [None, None]
    assert all(g.status is GpuStatus.OK and g.error is None for g in snap.gpus)
    assert len(lib.missed) == 2 and "nvmlDeviceGetTemperature" in lib.missed[0]


def test_real_ctypes_answers_encode_by_field_and_pointer() -> None:
    enc = Encoder()
    handle = ctypes.cast(ctypes.c_void_p(0x7F00_0000_1000), pynvml.c_nvmlDevice_t)
    enc.learn(handle, {"handle": 3})
    same_gpu = ctypes.cast(ctypes.c_void_p(0x7F00_0000_1000), pynvml.c_nvmlDevice_t)
    assert enc.encode(same_gpu) == {"handle": 3}  # a new pointer object, the same device
    pci = pynvml.nvmlPciInfo_t()
    pci.busId = b"00000000:18:00.0"
    encoded = enc.encode(pci)
    assert encoded["struct"] == "nvmlPciInfo_t"
    # nvidia-ml-py answers str for char arrays, older releases bytes: both round-trip
    assert decode(encoded["fields"]["busId"]) in ("00000000:18:00.0", b"00000000:18:00.0")
    assert decode(json.loads(json.dumps(enc.encode(b"\xff\x00ab")))) == b"\xff\x00ab"
    values = (pynvml.c_nvmlFieldValue_t * 2)()
    values[1].fieldId, values[1].scopeId = pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, 7
    values[1].value.ullVal = 2**40
    rows = enc.encode(values)
    assert rows[1]["fields"]["scopeId"] == 7
    assert rows[1]["fields"]["value"]["fields"]["ullVal"] == 2**40
    json.dumps(rows)  # plain JSON


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ('replay = "nope.json"\n', "replay", "not found"),
        ('replay = "bad.json"\n', "replay", "not a slurmhealth.nvml-recording/1"),
        ("replay = 3\n", "replay", "path of a recording"),
        ('replay = "rec.json"\ngpus = 4\n', "gpus", "only name, description"),
    ],
)
def test_replay_scenario_errors_name_the_file_and_key(
    tmp_path: Path, text: str, key: str, words: str
) -> None:
    (tmp_path / "bad.json").write_text('{"format": "other"}')
    (tmp_path / "rec.json").write_text(json.dumps({"format": FORMAT, "functions": [], "calls": []}))
    path = tmp_path / "s.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError) as info:
        load_scenario(str(path))
    assert (info.value.key, info.value.source) == (key, str(path))
    assert words in str(info.value)


def test_replay_path_is_relative_to_the_scenario_file(tmp_path: Path) -> None:
    (tmp_path / "fixtures").mkdir()
    rec = {"format": FORMAT, "functions": [], "calls": []}
    (tmp_path / "fixtures" / "rec.json").write_text(json.dumps(rec))
    (tmp_path / "s.toml").write_text('name = "r"\nreplay = "fixtures/rec.json"\n')
    s = load_scenario(str(tmp_path / "s.toml"))
    assert s.replay == str(tmp_path / "fixtures" / "rec.json")
