"""The Xid verdict in each of its branches: the catalog alone, Xid 63 by row-remap state, the
driver's own fields (Contained/Uncontained, RST, D-RST) one at a time, Xid 154's recovery
action, Xid 45's cause, and what ``slurmhealth xid N`` explains. Each case is what a drain
decision turns on: a mutation of any branch changes one of these verdicts."""

from __future__ import annotations

import dataclasses
import tomllib
from importlib import resources
from typing import Any

import pytest

from slurmhealth import model
from slurmhealth.checks import CheckContext, catalog, xid_table
from slurmhealth.checks.xid_table import CATALOG_URL, classify, explain, judge
from slurmhealth.model import Action, Finding, GpuState, NodeSnapshot, Severity, XidEvent
from slurmhealth.model_records import KernelEvent

CATALOG: dict[str, Any] = tomllib.loads(
    resources.files("slurmhealth.checks").joinpath("xid_catalog.toml").read_text()
)


@pytest.fixture(autouse=True)
def _catalog_read_anew() -> None:
    """Each test reads the catalog itself (it is cached for the process): what it checks is
    the verdicts built from the file, not a copy an earlier test left."""
    xid_table._catalog.cache_clear()


def event(xid: int, **driver: Any) -> XidEvent:
    return XidEvent(xid, "0000:18:00.0", "m", f"NVRM: Xid (PCI:0000:18:00): {xid}, m", **driver)


def verdict(xid: int, **driver: Any) -> tuple[Severity, Action, str]:
    info = judge(event(xid, **driver))
    return info.severity, info.action, info.basis


# -- Xid 63: the row-remap state decides --------------------------------------------------------
def test_xid_63_drains_only_while_a_row_remap_is_pending() -> None:
    pending, done, unknown = classify(63, True), classify(63, False), classify(63, None)
    assert (pending.severity, pending.action) == (Severity.FAIL, Action.DRAIN)
    assert pending.hint == (
        "row remap pending: drain and reset the GPU (nvidia-smi -r) to activate it "
        "(nvidia-smi -q -d ROW_REMAPPER)"
    )
    assert (done.severity, done.action) == (Severity.INFO, Action.RECORD)
    assert done.hint == (
        "row remap/page retirement recorded, nothing pending: watch the trend "
        "(nvidia-smi -q -d ROW_REMAPPER)"
    )
    assert (unknown.severity, unknown.action) == (Severity.WARN, Action.RECORD)
    assert unknown.hint == (
        "row remap state unknown: check nvidia-smi -q -d ROW_REMAPPER for a pending remap"
    )
    for info in (pending, done, unknown):  # the catalog's row, with the state's verdict
        assert (info.xid, info.mnemonic) == (63, "INFOROM_DRAM_RETIREMENT_EVENT")
    assert judge(event(63), remap_pending=True).action is Action.DRAIN  # judge passes it on
    assert judge(event(63), remap_pending=False).action is Action.RECORD


def test_the_lazy_module_attributes_are_the_catalogs() -> None:
    assert classify(63, True) == xid_table.XID63_PENDING
    assert classify(63, False) == xid_table.XID63_DONE
    assert classify(63, None) == xid_table.XID63_UNKNOWN
    assert xid_table.XID_TABLE[79] == classify(79) and 63 not in xid_table.XID_TABLE
    assert xid_table.BUCKETS["RESET_GPU"]["action"] == "reset"
    with pytest.raises(AttributeError, match="has no attribute 'NOPE'"):
        _ = xid_table.NOPE


def test_an_unknown_xid_is_a_warning_to_look_up() -> None:
    info = classify(99_999)
    assert (info.severity, info.action, info.basis) == (Severity.WARN, Action.RECORD, "unknown")
    assert info.name == "unknown Xid" and CATALOG_URL in info.hint


# -- the driver's verdict, one field at a time ---------------------------------------------------
@pytest.mark.parametrize(
    ("driver", "expected"),
    [
        # Xid 79 is RESTART_BM in the catalog: only a contained, no-reset verdict softens it
        ({"contained": True}, (Severity.WARN, Action.RECORD, "driver")),
        ({"reset_required": False, "drain_reset_required": False},
         (Severity.WARN, Action.RECORD, "driver")),
        ({"reset_required": False}, None),  # half a verdict: the catalog decides
        ({"drain_reset_required": False}, None),
        ({"reset_required": True, "drain_reset_required": False},
         (Severity.CRITICAL, Action.RESET, "driver")),
        ({"drain_reset_required": True}, (Severity.CRITICAL, Action.RESET, "driver")),
        ({"contained": False}, (Severity.CRITICAL, Action.RESET, "driver")),
    ],
)  # fmt: skip
def test_the_driver_fields_of_an_xid_79_line(
    driver: dict[str, Any], expected: tuple[Severity, Action, str] | None
) -> None:
    catalog = classify(79)
    want = expected or (catalog.severity, catalog.action, "catalog")
    assert verdict(79, **driver) == want


def test_a_contained_xid_94_is_recorded_and_an_uncontained_one_resets() -> None:
    assert verdict(94, contained=True) == (Severity.WARN, Action.RECORD, "driver")
    assert verdict(94, reset_required=False, drain_reset_required=False)[1] is Action.RECORD
    severity, action, basis = verdict(94, contained=False)
    assert (action, basis) == (Action.RESET, "driver") and severity >= Severity.FAIL
    assert judge(event(94, contained=False)).hint.startswith("the driver asks for a GPU reset")
    assert judge(event(94, contained=True)).hint.startswith("contained by the driver")
    assert judge(event(94, drain_reset_required=True)).hint.startswith(
        "the driver asks to drain and reset (D-RST: Yes)"
    )


# -- Xid 154 and Xid 45 -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("action_code", "expected"),
    [
        (0, (Severity.INFO, Action.RECORD)),
        (1, (Severity.FAIL, Action.RESET)),
        (2, (Severity.CRITICAL, Action.RESET)),
        (3, (Severity.FAIL, Action.DRAIN)),
        (4, (Severity.FAIL, Action.RESET)),
    ],
)
def test_xid_154_does_the_recovery_action_it_names(
    action_code: int, expected: tuple[Severity, Action]
) -> None:
    info = judge(event(154, recovery_action=action_code))
    assert (info.severity, info.action, info.basis) == (*expected, "driver")
    assert info.hint.startswith("the driver asks for ")


def test_xid_154_without_a_known_recovery_action_and_other_xids_with_one_keep_the_catalog() -> None:
    assert judge(event(154)) == classify(154)  # no action on the line
    assert judge(event(154, recovery_action=-1)) == classify(154)
    assert judge(event(154, recovery_action=9)) == classify(154)  # not one NVML defines
    assert judge(event(79, recovery_action=0)) == classify(79)  # only Xid 154 carries one


def test_xid_45_points_at_the_xid_that_caused_it() -> None:
    caused = judge(event(45, caused_by=149))
    assert caused.hint == "caused by previous Xid 149: that Xid's finding decides"
    assert (caused.severity, caused.action) == (classify(45).severity, classify(45).action)
    assert judge(event(45)) == classify(45)  # no cause named
    assert judge(event(13, caused_by=149)) == classify(13)  # only Xid 45 says so


# -- what `slurmhealth xid N` explains ----------------------------------------------------------
def test_explain_a_catalog_row_is_the_catalogs_row_and_its_bucket() -> None:
    row = CATALOG["xid"]["79"]
    bucket = CATALOG["bucket"][row["immediate"]]
    out = explain(79)
    assert out == {
        "xid": 79,
        "known": True,
        "name": row["name"],
        "mnemonic": row["mnemonic"],
        "immediate_action": row["immediate"],
        "immediate_action_meaning": bucket["meaning"],
        "severity": row.get("severity", bucket["severity"]),
        "action": row.get("action", bucket["action"]),
        "hint": row.get("hint", bucket["hint"]),
        "source": row["source"],
        "catalog": CATALOG_URL,
        "driver_override": (
            "when the line carries the driver's verdict (Contained:/Uncontained:, RST:, D-RST:, "
            "Xid 154's recovery action), it overrides this table"
        ),
    }


NVLINK5_DECODE = (
    "judged by the line's sub component and error status (the catalog's XID 144-150 "
    "Decode, intrInfo encoded as before or from driver R575): fatal rows reset the GPU, "
    "others are recorded; this row applies when the line carries no such fields"
)


@pytest.mark.parametrize(("xid", "decoded"), [(143, False), (144, True), (150, True), (151, False)])
def test_explain_says_how_nvlink5_xids_are_decoded(xid: int, decoded: bool) -> None:
    out = explain(xid)
    assert out.get("decode") == (NVLINK5_DECODE if decoded else None)
    assert "reason" not in out


def test_explain_says_why_an_unbucketed_xid_never_drains() -> None:
    out = explain(162)
    assert (out["immediate_action"], out["action"]) == ("UNBUCKETED", "record")
    assert out["reason"] == (
        "NVIDIA's catalog lists this Xid without a resolution bucket yet, so slurmhealth "
        "records it as a warning and never drains for it"
    )


def test_explain_xid_63_and_an_unknown_xid() -> None:
    out = explain(63)
    assert out["severity"] == "fail if a row remap is pending, info if not, warn if unknown"
    assert out["action"] == "drain if a row remap is pending, else record"
    assert out["hint"] == classify(63, True).hint
    unknown = explain(99_999)
    assert (unknown["known"], unknown["mnemonic"], unknown["immediate_action"]) == (
        False,
        None,
        None,
    )
    assert unknown["immediate_action_meaning"] is None and unknown["source"] is None
    assert unknown["severity"] == "warn" and unknown["action"] == "record"
    assert unknown["name"] == "unknown Xid" and "look up Xid 99999 in" in unknown["hint"]


# -- the xid and kernel_log checks on a node snapshot -------------------------------------------
BUSES = ("18", "2a")


def node(**gpu0: Any) -> NodeSnapshot:
    gpus = tuple(
        GpuState(index=i, uuid=f"GPU-{i}", pci_bus_id=f"00000000:{b.upper()}:00.0",
                 **(gpu0 if i == 0 else {}))
        for i, b in enumerate(BUSES)
    )  # fmt: skip
    odd = GpuState(index=2, uuid="GPU-2", pci_bus_id="not a bus id")  # skipped, not fatal
    return NodeSnapshot(node="n1", ts=1.0, gpus=(odd, *gpus), device_count=3)


def run(name: str, snap: NodeSnapshot, xids: tuple[XidEvent, ...] = (),
        kernel: tuple[KernelEvent, ...] = ()) -> list[Finding]:  # fmt: skip
    return catalog()[name].fn(CheckContext(snap, xids=xids, kernel_events=kernel), {})


def on(bus: str, xid: int, **driver: Any) -> XidEvent:
    return XidEvent(xid, f"0000:{bus}:00.0", "m", f"NVRM: Xid (PCI:0000:{bus}:00): {xid}", **driver)


@pytest.mark.parametrize(
    ("gpu0", "severity", "action"),
    [
        ({"remap_pending": True}, Severity.FAIL, Action.DRAIN),
        ({"remap_pending": False, "retired_pages_pending": True}, Severity.INFO, Action.RECORD),
        ({"retired_pages_pending": True}, Severity.FAIL, Action.DRAIN),  # V100: pages
        ({"retired_pages_pending": False}, Severity.INFO, Action.RECORD),
        ({}, Severity.WARN, Action.RECORD),  # unknown: a warning
    ],
)
def test_xid_63_follows_the_gpus_remap_state(
    gpu0: dict[str, Any], severity: Severity, action: Action
) -> None:
    [f] = run("xid", node(**gpu0), (on("18", 63),))
    assert (f.gpu, f.severity, f.action) == (0, severity, action)


def test_xid_63_on_a_bus_no_gpu_has_is_state_unknown() -> None:
    [f] = run("xid", node(remap_pending=True), (on("c1", 63),))
    assert (f.gpu, f.severity, f.action) == (None, Severity.WARN, Action.RECORD)


def test_an_xid_45_takes_its_cause_from_an_earlier_xid_on_the_same_gpu_only() -> None:
    xids = (on("2a", 31), on("18", 44), on("18", 45), on("18", 46))
    found = {(f.evidence["xid"], f.gpu): f for f in run("xid", node(), xids)}
    assert found[(45, 0)].evidence["caused_by"] == 44  # GPU 1's Xid 31 is not its cause
    assert "caused by Xid 44" in found[(45, 0)].message
    lone = {f.evidence["xid"]: f for f in run("xid", node(), (on("18", 45),))}
    assert lone[45].evidence["caused_by"] is None and "caused by" not in lone[45].message
    only_45s = run("xid", node(), (on("18", 45), on("18", 45)))
    assert only_45s[0].evidence["caused_by"] is None and only_45s[0].evidence["count"] == 2


def test_the_driver_verdict_shows_in_the_message_only_when_it_asked_for_a_reset() -> None:
    [uncontained] = run("xid", node(), (on("18", 94, contained=False),))
    assert uncontained.message.endswith(", uncontained: reset required")
    [rst] = run("xid", node(), (on("18", 94, reset_required=True),))
    assert rst.message.endswith(", the driver asks for a reset")
    [contained] = run("xid", node(), (on("18", 94, contained=True),))
    assert contained.message == "Xid 94 " + classify(94).name + " on 0000:18:00.0"
    [catalog_reset] = run("xid", node(), (on("18", 79),))  # the catalog's reset, no driver word
    assert catalog_reset.message == "Xid 79 " + classify(79).name + " on 0000:18:00.0"


def kev(kind: str, bus: str | None = None, **kw: Any) -> KernelEvent:
    return KernelEvent(kind, "m", f"raw {kind}", pci_bus_id=bus, **kw)


def test_kernel_faults_land_on_the_gpu_they_name() -> None:
    [by_bus] = run("kernel_log", node(), kernel=(kev("gsp_timeout", "0000:2a:00.0"),))
    assert (by_bus.gpu, by_bus.action) == (1, Action.RESET)
    [by_number] = run("kernel_log", node(), kernel=(kev("gsp_timeout", gpu_number=1),))
    assert by_number.gpu == 1 and by_number.message.endswith(" on GPU1")
    [nowhere] = run("kernel_log", node(), kernel=(kev("init_failed"),))
    assert nowhere.gpu is None and nowhere.action is Action.RESET
    sxid = kev("sxid", "0000:18:00.0", level="fatal", code=20034)
    [switch] = run("kernel_log", node(), kernel=(sxid,))  # an NVSwitch's: the node's
    assert (switch.gpu, switch.action) == (None, Action.DRAIN)
    assert switch.message == "fatal NVSwitch error 20034 on 0000:18:00.0"


def test_pcie_aer_counts_errors_not_lines_and_judges_only_gpus() -> None:
    port = kev("pcie_aer", "0000:18:00.0", level="non-fatal")  # the root port's "received"
    dev = kev("pcie_aer", "0000:18:00.0", level="non-fatal", device="nvidia")
    [f] = run("kernel_log", node(), kernel=(port, dev, port, dev, dev))
    assert f.evidence["count"] == 3 and "(x3)" in f.message  # three errors: the device's lines
    [f] = run("kernel_log", node(), kernel=(port, port))  # lines without a device: each one
    assert f.evidence["count"] == 2
    [gsp] = run("kernel_log", node(), kernel=(kev("gsp_timeout", "0000:18:00.0"),) * 3)
    assert gsp.evidence["count"] == 3
    nic = "0000:c1:00.0"  # no GPU there
    assert run("kernel_log", node(), kernel=(kev("pcie_aer", nic, level="non-fatal"),)) == []
    [fatal_nic] = run("kernel_log", node(), kernel=(kev("pcie_aer", nic, level="fatal"),))
    assert (fatal_nic.severity, fatal_nic.action) == (Severity.WARN, Action.RECORD)
    gpu_by_driver = kev("pcie_aer", nic, level="fatal", device="nvidia")  # NVML missed it
    [f] = run("kernel_log", node(), kernel=(gpu_by_driver,))
    assert (f.severity, f.action) == (Severity.CRITICAL, Action.RESET)
    unnamed = kev("pcie_aer", None, level="fatal", device="nvidia")
    [f] = run("kernel_log", node(), kernel=(unnamed,))
    assert (f.severity, f.action) == (Severity.WARN, Action.RECORD)


# -- what a finding tells the operator: its message and evidence ----------------------------------
def test_an_xid_finding_names_the_line_process_and_time_it_came_from() -> None:
    raw = "NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=python3, GPU has fallen off " + "x" * 400
    first = XidEvent(79, "0000:18:00.0", "m", raw, ts=1_700_000_000.5, pid=4242,
                     process_name="python3")  # fmt: skip
    later = dataclasses.replace(first, ts=1_700_000_009.0, pid=7, process_name="other")
    [f] = run("xid", node(), (first, later))
    info = classify(79)
    assert f == Finding(
        check="xid", severity=info.severity, gpu=0, uuid="GPU-0", action=Action.RESET,
        message=f"Xid 79 {info.name} (x2) on 0000:18:00.0", hint=info.hint,
        evidence={"xid": 79, "pci_bus_id": "0000:18:00.0", "count": 2, "pid": 4242,
                  "process": "python3", "ts": 1_700_000_000.5, "line": raw[:300],
                  "basis": "catalog", "caused_by": None},
    )  # fmt: skip
    [once] = run("xid", node(), (first,))
    assert once.message == f"Xid 79 {info.name} on 0000:18:00.0" and once.evidence["count"] == 1


# the name confirms neither intrInfo encoding, so the node's driver picks it (R575 and later: V2)
NVLINK5_ODD = "NVRM: Xid (PCI:0000:18:00): 144, SAW Fatal XC0 i0 Link 1 (0x00000021 0x00000002)"


@pytest.mark.parametrize(
    ("driver", "version", "bucket"), [("580.65.06", "V2", None), ("570.124.06", "V1", "RESET_GPU")]
)
def test_an_nvlink5_xid_is_judged_and_decoded_by_the_nodes_driver(
    driver: str, version: str, bucket: str | None
) -> None:
    snap = dataclasses.replace(node(), driver_version=driver)
    [f] = run("xid", snap, (XidEvent(144, "0000:18:00.0", "m", NVLINK5_ODD),))
    assert (f.severity, f.action, f.evidence["basis"]) == (Severity.FAIL, Action.RESET, "decode")
    assert f.hint.startswith(f"SAW link 1, status 0x00000002, {version} decode: ")
    assert f.evidence["nvlink5"] == {
        "sub_component": "SAW", "link": 1, "intr_info": "0x00000021",
        "error_status": "0x00000002", "decode": version, "bucket": bucket,
        "line_says": "fatal", "link_down_reason": None,
    }  # fmt: skip


def test_an_nvlink5_xid_without_its_status_fields_has_nothing_decoded() -> None:
    line = "NVRM: Xid (PCI:0000:18:00): 149, pid=1, name=x, NVLink error"
    [f] = run("xid", node(), (XidEvent(149, "0000:18:00.0", "m", line),))
    assert f.evidence["basis"] == "catalog" and "nvlink5" not in f.evidence


@pytest.mark.parametrize("code", [144, 150])
def test_the_decoded_fields_of_the_first_and_last_nvlink5_xid(code: int) -> None:
    line = (f"NVRM: Xid (PCI:0000:18:00): {code}, MSE Fatal XC0 i0 Link 3 "
            "(0x00000000 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)")  # fmt: skip
    [f] = run("xid", node(), (XidEvent(code, "0000:18:00.0", "m", line),))
    assert f.evidence["nvlink5"]["link"] == 3 and f.evidence["nvlink5"]["line_says"] == "fatal"
    assert (f.evidence["basis"], f.action) == ("decode", Action.RESET)  # not the catalog's row
    [plain] = run("xid", node(), (on("18", 143),))  # before the NVLink5 range: nothing decoded
    assert "nvlink5" not in plain.evidence


def mig_node() -> NodeSnapshot:
    instances = tuple(
        model.MigDevice(index=i, uuid=f"MIG-{gi}", gpu_instance_id=gi, compute_instance_id=0)
        for i, gi in enumerate((9, 10))
    )
    return node(mig_mode=True, mig_devices=instances)


def test_a_contained_xid_on_a_mig_instance_names_that_instance_only() -> None:
    [f] = run("xid", mig_node(), (on("18", 43, gpu_instance="GPU-I:10"),))
    assert f.message.endswith(" on 0000:18:00.0 GPU-I:10") and not f.action.takes_node_out
    assert {k: f.evidence[k] for k in ("mig_uuid", "gpu_instance", "compute_instance")} == {
        "mig_uuid": "MIG-10", "gpu_instance": 10, "compute_instance": 0,
    }  # fmt: skip
    [gone] = run("xid", mig_node(), (on("18", 43, gpu_instance="GPU-I:11"),))  # not on the GPU
    assert gone.evidence["gpu_instance"] == 11 and "mig_uuid" not in gone.evidence
    [plain] = run("xid", mig_node(), (on("18", 43),))
    assert "gpu_instance" not in plain.evidence and plain.message.endswith(" on 0000:18:00.0")


def test_an_xid_that_takes_the_gpu_out_on_a_mig_instance_is_the_whole_gpus() -> None:
    [f] = run("xid", mig_node(), (on("18", 79, gpu_instance="GPU-I:09"),))
    assert f.action is Action.RESET and f.gpu == 0
    assert f.evidence["gpu_instance"] == 9 and "mig_uuid" not in f.evidence
    two = run("xid", mig_node(), (on("18", 43, gpu_instance="GPU-I:09"),
                                  on("18", 43, gpu_instance="GPU-I:10")))  # fmt: skip
    assert [g.evidence["mig_uuid"] for g in two] == ["MIG-9", "MIG-10"]


def test_a_kernel_fault_names_its_line_code_and_count() -> None:
    raw = "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 30 " + "y" * 400
    sxid = KernelEvent("sxid", "m", raw, ts=5.0, pci_bus_id="0000:c3:00.0", code=24007,
                       level="fatal")  # fmt: skip
    [f] = run("kernel_log", node(), kernel=(sxid, dataclasses.replace(sxid, ts=6.0)))
    assert f == Finding(
        check="kernel_log", severity=Severity.FAIL, gpu=None, uuid=None, action=Action.DRAIN,
        message="fatal NVSwitch error 24007 (x2) on 0000:c3:00.0",
        hint="a fatal SXid needs the NVSwitch and its GPUs reset: drain and reboot the node; "
        "check the fabric manager log",
        evidence={"kind": "sxid", "level": "fatal", "pci_bus_id": "0000:c3:00.0",
                  "gpu_number": None, "code": 24007, "count": 2, "ts": 5.0, "line": raw[:300]},
    )  # fmt: skip
    [by_number] = run("kernel_log", node(), kernel=(kev("gsp_timeout", gpu_number=1, ts=3.0),))
    assert (by_number.evidence["gpu_number"], by_number.evidence["pci_bus_id"]) == (1, None)
    assert by_number.message == "GSP firmware timeout on GPU1"
    [nowhere] = run("kernel_log", node(), kernel=(kev("init_failed", ""),))  # no bus, no number
    assert nowhere.message == "NVIDIA driver could not initialize the GPU"
    assert nowhere.evidence["pci_bus_id"] is None and nowhere.evidence["code"] is None


def test_corrected_errors_are_judged_by_their_kind_alone() -> None:
    corrected = kev("pcie_aer", "0000:18:00.0", level="corrected", device="nvidia")
    [f] = run("kernel_log", node(), kernel=(corrected,))
    assert (f.message, f.evidence["level"]) == ("PCIe corrected errors on 0000:18:00.0", None)
    [f] = run("kernel_log", node(), kernel=(kev("sxid", "0000:c3:00.0", level="corrected"),))
    assert (f.severity, f.evidence["level"]) == (Severity.WARN, None)


def test_a_fatal_aer_on_another_device_is_a_non_fatal_warning() -> None:
    nic = kev("pcie_aer", "0000:c1:00.0", level="fatal")
    [f] = run("kernel_log", node(), kernel=(nic,))
    assert f.message == "PCIe uncorrectable non-fatal error on 0000:c1:00.0"
    assert (f.severity, f.action, f.evidence["level"]) == (
        Severity.WARN,
        Action.RECORD,
        "non-fatal",
    )


def test_a_gpu_line_names_the_report_of_a_banner_without_one() -> None:
    banner = kev("gsp_timeout")  # "*** GSP Timeout ***": names no GPU
    for named in (kev("gsp_timeout", "0000:18:00.0"), kev("gsp_timeout", gpu_number=0)):
        [f] = run("kernel_log", node(), kernel=(named, banner))
        assert f.gpu == 0 and f.evidence["count"] == 1
    [alone] = run("kernel_log", node(), kernel=(banner,))
    assert alone.gpu is None


def test_every_fault_after_one_skipped_is_still_judged() -> None:
    """A skipped line (the network's, a banner, a fault an acting Xid covers, an error on
    another device) never hides the GPU faults read after it."""
    after = kev("init_failed", "0000:2a:00.0")
    skipped = [
        kev("ib_kernel_log", "0000:c1:00.0"),
        kev("gsp_timeout"),  # a banner of a fault the next line names on a GPU
        kev("pcie_aer", "0000:c1:00.0", level="non-fatal"),
    ]
    for first in skipped:
        named = kev("gsp_timeout", "0000:2a:00.0") if first.kind == "gsp_timeout" else after
        found = run("kernel_log", node(), kernel=(first, named, after))
        assert {(f.evidence["kind"], f.gpu) for f in found} >= {("init_failed", 1)}, first
    covered = run(
        "kernel_log", node(), (on("18", 79),), (kev("gsp_timeout", "0000:18:00.0"), after)
    )
    assert [(f.evidence["kind"], f.gpu) for f in covered] == [("init_failed", 1)]


def test_an_acting_xid_covers_the_gpus_other_faults_but_not_switch_or_pcie_errors() -> None:
    kernel = (kev("gsp_timeout", "0000:18:00.0"), kev("sxid", "0000:18:00.0", level="fatal"),
              kev("pcie_aer", "0000:18:00.0", level="fatal", device="nvidia"))  # fmt: skip
    found = run("kernel_log", node(), (on("18", 79),), kernel)
    assert sorted(f.evidence["kind"] for f in found) == ["pcie_aer", "sxid"]
    assert len(run("kernel_log", node(), (on("18", 43),), kernel)) == 3  # 43 does not act
