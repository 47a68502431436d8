"""The GPU faults that come without an Xid, one line (or three) at a time.

Lines follow the formats the drivers print (nvidia, nvidia-nvswitch, the kernel's AER driver)
and excerpts posted publicly from real nodes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.kernel_log import parse_xid, split_line
from slurmhealth.kernel_log.patterns import (
    EventJoiner,
    parse_event,
    parse_events,
    resolve_gpu_numbers,
)
from slurmhealth.model import KERNEL_EVENT_KINDS

XID = "NVRM: Xid (PCI:0000:53:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


# -- GPU fallen off the bus -------------------------------------------------------------------
FALLEN = [
    "NVRM: The NVIDIA GPU 0000:b3:00.0",
    "NVRM: (PCI ID: 10de:2330) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
]


def test_fallen_off_the_bus_one_record_per_line() -> None:
    events = parse_events(FALLEN)
    assert [(e.kind, e.pci_bus_id) for e in events] == [("fallen_off_bus", "0000:b3:00.0")]
    assert "not responding" in events[0].raw


def test_fallen_off_the_bus_one_record_with_newlines() -> None:
    events = EventJoiner().feed("\n".join(FALLEN), ts=5.0, seq=3)
    assert [(e.kind, e.pci_bus_id, e.ts, e.seq) for e in events] == [
        ("fallen_off_bus", "0000:b3:00.0", 5.0, 3)
    ]


def test_fallen_off_the_bus_single_line_forms() -> None:
    ev = parse_event("NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.")
    assert ev is not None and (ev.kind, ev.pci_bus_id) == ("fallen_off_bus", "0000:01:00.0")
    line = "NVRM: The NVIDIA GPU 0000:05:00.0 installed in this system has fallen off the bus"
    ev = parse_event(line)
    assert ev is not None and ev.pci_bus_id == "0000:05:00.0"


def test_unsupported_gpu_message_is_not_a_fault() -> None:
    lines = [
        "NVRM: The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:2330)",
        "NVRM: installed in this system is not supported by the",
        "NVRM: NVIDIA 470.82.01 driver release.",
        "NVRM: fallen off the bus and is not responding to commands.",  # far too late
        "NVRM: something else",
        "NVRM: and more",
    ]
    assert [e.pci_bus_id for e in parse_events(lines)] == [None]  # only the orphan, node-level


# -- GSP firmware timeouts -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "bus", "number"),
    [
        ("NVRM: _kgspIsHeartbeatTimedOut: Heartbeat timed out, timeout 5200", None, None),
        ("NVRM: GPU0 _kgspIsHeartbeatTimedOut: Heartbeat timed out ... timeout 5200", None, 0),
        ("NVRM: GPU1 _kgspRpcRecvPoll: GSP RM heartbeat timed out", None, 1),
        ("NVRM: _kgspRpcRecvPoll: LibOS heartbeat timed out", None, None),
        (
            "NVRM: GPU0 _kgspLogXid119: ********************************* GSP Timeout "
            "**********************************",
            None,
            0,
        ),
        (
            "NVRM: GPU3 GSP RPC buffer contains function 76 (GSP_RM_CONTROL) and data "
            "0x0000000090cc0301 0x000000000000000c.",
            None,
            3,
        ),
        ("NVRM: GPU 0000:c1:00.0: GSP RPC timed out waiting for RM_CONTROL", "0000:c1:00.0", None),
    ],
)
def test_gsp_timeouts(line: str, bus: str | None, number: int | None) -> None:
    ev = parse_event(line)
    assert ev is not None
    assert (ev.kind, ev.pci_bus_id, ev.gpu_number) == ("gsp_timeout", bus, number)


def test_gpu_number_takes_the_bus_of_the_xid_119_naming_it() -> None:
    xid = parse_xid(
        "NVRM: Xid (PCI:0000:07:00): 119, pid=2357, name=nv-hostengine, Timeout waiting for "
        "RPC from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x90cc0301 0xc)."
    )
    assert xid is not None
    ev = parse_event("NVRM: GPU0 GSP RPC buffer contains function 76 (GSP_RM_CONTROL)")
    other = parse_event("NVRM: GPU1 _kgspRpcRecvPoll: GSP RM heartbeat timed out")
    assert ev is not None and other is not None
    resolved = resolve_gpu_numbers([ev, other], [xid])
    assert [(e.pci_bus_id, e.gpu_number) for e in resolved] == [("0000:07:00.0", 0), (None, 1)]


# -- init / probe failures ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "bus"),
    [
        ("NVRM: GPU 0000:00:06.0: RmInitAdapter failed! (0x11:0x45:2540)", "0000:00:06.0"),
        ("NVRM: GPU 0000:4f:00.0: rm_init_adapter failed, device minor number 0", "0000:4f:00.0"),
        ("NVRM: RmInitAdapter failed! (0x30:0xffff:660)", None),
        ("NVRM: rm_init_adapter failed for device bearing minor number 0", None),
        ("NVRM: rm_init_adapter(0) failed", None),
        ("nvidia 0000:02:00.0: probe with driver nvidia failed with error -1", "0000:02:00.0"),
        ("nvidia: probe of 0000:02:00.0 failed with error -1", "0000:02:00.0"),
        ("NVRM: The NVIDIA probe routine failed for 1 device(s).", None),
        ("NVRM: None of the NVIDIA devices were initialized.", None),
    ],
)
def test_init_failures(line: str, bus: str | None) -> None:
    ev = parse_event(line)
    assert ev is not None and (ev.kind, ev.pci_bus_id) == ("init_failed", bus)


# -- NVSwitch SXid -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "code", "level"),
    [
        (
            "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress "
            "non-posted PRIV error (First)",
            12028,
            "non-fatal",
        ),
        (
            "nvidia-nvswitch0: SXid (PCI:0000:c3:00.0): 24007, Fatal, Link 30 sourcetrack "
            "timeout error",
            24007,
            "fatal",
        ),
    ],
)
def test_sxid(line: str, code: int, level: str | None) -> None:
    ev = parse_event(line)
    assert ev is not None
    assert (ev.kind, ev.code, ev.level, ev.device) == ("sxid", code, level, line.split(":")[0])
    assert ev.pci_bus_id is not None and ev.gpu_number is None


@pytest.mark.parametrize(
    "line",
    [
        "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Data {0x00000000}",
        "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60 "
        "Sub-engine instance 00",
    ],
)
def test_sxid_detail_lines_are_not_more_errors(line: str) -> None:
    """The lines after an SXid carry its details: counting them made one fatal SXid also
    read as two non-fatal ones."""
    assert parse_event(line) is None


# -- PCIe AER ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "bus", "level", "device"),
    [
        (
            "pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:b3:00.0",
            "0000:b3:00.0",
            "fatal",
            None,
        ),
        (
            "pcieport 0000:00:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:b3:00.0",
            "0000:b3:00.0",
            "non-fatal",
            None,
        ),
        (
            "pcieport 0000:00:01.0: AER: Correctable error message received from 0000:b3:00.0",
            "0000:b3:00.0",
            "corrected",
            None,
        ),
        (
            "nvidia 0000:b3:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, "
            "(Receiver ID)",
            "0000:b3:00.0",
            "corrected",
            "nvidia",
        ),
        (
            "nvidia 0000:b3:00.0: AER: PCIe Bus Error: severity=Uncorrectable (Fatal), "
            "type=Inaccessible, (Unregistered Agent ID)",
            "0000:b3:00.0",
            "fatal",
            "nvidia",
        ),
        (
            "pcieport 0000:00:01.0: PCIe Bus Error: severity=Uncorrected (Fatal), "
            "type=Transaction Layer, id=0008(Requester ID)",
            "0000:00:01.0",
            "fatal",
            "pcieport",
        ),
    ],
)
def test_pcie_aer(line: str, bus: str, level: str, device: str | None) -> None:
    ev = parse_event(line)
    assert ev is not None
    assert (ev.kind, ev.pci_bus_id, ev.level, ev.device) == ("pcie_aer", bus, level, device)


@pytest.mark.parametrize(
    "line",
    [
        XID,
        "NVRM: GPU at PCI:0000:07:00: GPU-c9696075-b0f8-0e72-1ab7-13e7bdf9b678",
        "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.129.03  Thu Oct 19 18:56:32 UTC 2023",
        "NVRM: GPU0 _kgspLogXid119: Note: Please also check logs above.",
        "nvidia 0000:b3:00.0: enabling device (0000 -> 0003)",
        "pcieport 0000:00:01.0:   device [8086:1901] error status/mask=00004000/00000000",
        "mlx5_core 0000:3b:00.0: firmware version: 28.39.1002",
        "",
    ],
)
def test_ordinary_lines_are_not_faults(line: str) -> None:
    assert parse_event(line) is None


@settings(max_examples=300)
@given(st.lists(st.text(), max_size=8))
def test_arbitrary_lines_never_raise(lines: list[str]) -> None:
    joiner = EventJoiner()
    for line in lines:
        parts = split_line(line)
        assert isinstance(parts.text, str)
        for ev in joiner.feed(parts.text):
            assert ev.kind in KERNEL_EVENT_KINDS


@settings(max_examples=300)
@given(st.text(), st.sampled_from(["NVRM: The NVIDIA GPU ", "SXid (PCI:", "AER: Correctable "]))
def test_arbitrary_tails_after_a_marker_never_raise(tail: str, head: str) -> None:
    parse_events([head + tail, tail, "NVRM: fallen off the bus"])
    split_line("[Tue Dec  1 01:02:03 2026] " + tail)
    split_line("Dec  1 01:02:03 host kernel: " + tail)
