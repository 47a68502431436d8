"""One kernel-log line: Xid fields, the driver's verdict, every time prefix.

Lines follow the formats the tools document (dmesg(1), journalctl(1), rsyslog, /dev/kmsg)
and excerpts posted publicly from real nodes."""

from __future__ import annotations

import calendar
import os
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.kernel_log import format_kmsg_record, parse_line, parse_xid, split_line
from slurmhealth.model import normalize_pci_bus_id

NVML_B7 = normalize_pci_bus_id("00000000:B7:00.0")
NVML_53 = normalize_pci_bus_id("00000000:53:00.0")
XID79 = "NVRM: Xid (PCI:0000:53:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
XID = XID79
UTC_0102 = calendar.timegm((2026, 12, 1, 1, 2, 3, 0, 0, 0))  # 2026-12-01T01:02:03Z
NOW = UTC_0102 + 3600


@pytest.fixture
def cet() -> Iterator[None]:
    """The node's local time zone is UTC+1 (POSIX TZ, no tzdata needed)."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "CET-1"
    time.tzset()
    yield
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


# -- parse_xid ------------------------------------------------------------------------------
def test_current_format() -> None:
    ev = parse_xid(XID79, seq=7, ts=12.5)
    assert ev is not None
    assert (ev.xid, ev.pci_bus_id, ev.pid, ev.process_name) == (79, NVML_53, 1234, "python3")
    assert ev.message == "GPU has fallen off the bus."
    assert (ev.seq, ev.ts, ev.raw, ev.gpu_instance) == (7, 12.5, XID79, None)


def test_old_format_without_pid_and_name() -> None:
    ev = parse_xid("NVRM: Xid (PCI:0000:B7:00): 79, GPU has fallen off the bus.")
    assert ev is not None
    assert (ev.xid, ev.pci_bus_id, ev.pid, ev.process_name) == (79, NVML_B7, None, None)
    assert ev.message == "GPU has fallen off the bus."


def test_very_old_format_without_pci_prefix() -> None:
    ev = parse_xid("NVRM: Xid (0000:b7:00): 13, 0001 00000000 0000c5c0 00000000")
    assert ev is not None
    assert (ev.xid, ev.pci_bus_id) == (13, NVML_B7)
    assert ev.message == "0001 00000000 0000c5c0 00000000"


def test_unknown_pid_and_name() -> None:
    ev = parse_xid("NVRM: Xid (PCI:0000:b7:00): 31, pid=<unknown>, name=<unknown>, Ch 0000000a")
    assert ev is not None
    assert (ev.pid, ev.process_name, ev.message) == (None, None, "Ch 0000000a")
    ev = parse_xid("NVRM: Xid (PCI:0000:b7:00): 45, pid='<unknown>', name=<unknown>, Ch 01")
    assert ev is not None
    assert (ev.xid, ev.pid, ev.process_name, ev.message) == (45, None, None, "Ch 01")


@pytest.mark.parametrize(
    "gi",
    ["GPU-I:05", "GPU-I:05 GPU-CI:01"],
)
def test_mig_lines(gi: str) -> None:
    line = f"NVRM: Xid (PCI:0000:b7:00 {gi}): 43, pid=99, name=python, Ch 00000008"
    ev = parse_xid(line)
    assert ev is not None
    assert (ev.xid, ev.pci_bus_id, ev.gpu_instance) == (43, NVML_B7, "GPU-I:05")
    assert (ev.pid, ev.process_name, ev.message) == (99, "python", "Ch 00000008")


def test_xid_followed_directly_by_rest_and_prefixes() -> None:
    ev = parse_xid("[  12.345] NVRM: Xid (PCI:0000:01:00): 62, 223b6a66 00002100")
    assert ev is not None
    assert (ev.xid, ev.message, ev.pci_bus_id) == (62, "223b6a66 00002100", "0000:01:00.0")
    ev = parse_xid("NVRM: Xid (PCI:0000:01:00): 154")
    assert ev is not None and (ev.xid, ev.message) == (154, "")
    ev = parse_xid("NVRM: Xid (PCI:0000:01:00): 79, pid=7, name=nvc:[driver], GPU has fallen")
    assert ev is not None and ev.process_name == "nvc:[driver]" and ev.message == "GPU has fallen"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "NVRM: GPU at PCI:0000:53:00: GPU-0b11d014",
        "NVRM: Xid (PCI:zzzz:53:00): 79, x",
        "NVRM: Xid (PCI:0000:53:20): 79, x",  # device > 0x1f
        "NVRM: Xid (PCI:0000:53:00): 1234567, absurd",
        "NVRM: Xid (PCI:0000:53:00): , no number",
        "NVRM: Xid (PCI:0000:53:00 GPU-I:zz!): 43",
        "NVRM: Xid (",
        "nvrm xid 79",
    ],
)
def test_not_an_xid_line(text: str) -> None:
    assert parse_xid(text) is None


@settings(max_examples=300)
@given(st.text())
def test_parse_never_raises_on_any_text(text: str) -> None:
    parse_xid(text)
    seq, usec, out = parse_line(text)
    assert isinstance(out, str)
    assert seq is None or seq >= 0
    assert usec is None or usec >= 0


@settings(max_examples=300)
@given(st.text(), st.sampled_from(["", "PCI:0000:53:00): ", "0000:53:00 GPU-I:"]))
def test_parse_never_raises_after_the_xid_marker(tail: str, middle: str) -> None:
    text = "NVRM: Xid (" + middle + tail
    ev = parse_xid(text)
    assert ev is None or ev.pci_bus_id == NVML_53
    parse_line("6,1,2,-;" + text)
    parse_line("[1.5] " + text)


# -- parse_line -----------------------------------------------------------------------------
def test_kmsg_record() -> None:
    assert parse_line(f"6,1234,5678901,-;{XID79}\n") == (1234, 5678901, XID79)
    assert parse_line("4,55,100,-,caller=T123;text; with semicolon") == (
        55,
        100,
        "text; with semicolon",
    )


def test_kmsg_dictionary_lines_are_ignored() -> None:
    assert parse_line(" SUBSYSTEM=pci") == (None, None, "")
    assert parse_line(" DEVICE=+pci:0000:53:00.0\n") == (None, None, "")


def test_dmesg_lines() -> None:
    assert parse_line(f"[12345.678901] {XID79}") == (None, 12_345_678_901, XID79)
    assert parse_line(f"[    1.5] {XID79}") == (None, 1_500_000, XID79)
    assert parse_line(f"<4>[   12.000001] {XID79}") == (None, 12_000_001, XID79)


def test_journal_short_lines() -> None:
    assert parse_line(f"Nov 30 07:00:00 host kernel: {XID79}") == (None, None, XID79)
    line = f"Jan  8 11:38:05 gpu-01 kernel: [ 269.516977] {XID79}"
    assert parse_line(line) == (None, 269_516_977, XID79)


def test_plain_text() -> None:
    assert parse_line(XID79 + "\n") == (None, None, XID79)


def test_format_kmsg_record_round_trip() -> None:
    line = format_kmsg_record(42, 3_000_000, XID79)
    assert line == f"3,42,3000000,-;{XID79}"
    assert parse_line(line) == (42, 3_000_000, XID79)
    assert "\n" not in format_kmsg_record(1, 1, "a\nb")
    with pytest.raises(ValueError):
        format_kmsg_record(-1, 0, "x")


# -- every time prefix ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "wall"),
    [
        # dmesg --time-format iso (comma before the fraction)
        (f"2026-12-01T01:02:03,123456+00:00 {XID}", UTC_0102 + 0.123456),
        (f"2026-12-01T02:02:03,500000+01:00 {XID}", UTC_0102 + 0.5),
        # rsyslog RFC 3339, journalctl -o short-iso-precise / short-iso
        (f"2026-12-01T01:02:03.123456+00:00 gpu-07 kernel: {XID}", UTC_0102 + 0.123456),
        (f"2026-11-30T20:02:03-0500 gpu-07 kernel: {XID}", UTC_0102),
        (f"2026-12-01T01:02:03Z gpu-07 kernel: {XID}", UTC_0102),
        # journalctl -o short-unix
        (f"{UTC_0102}.250000 gpu-07 kernel: {XID}", UTC_0102 + 0.25),
    ],
)
def test_zoned_prefixes_give_utc(line: str, wall: float) -> None:
    parts = split_line(line)
    assert parts.text == XID
    assert parts.wall == pytest.approx(wall)


@pytest.mark.parametrize(
    "line",
    [
        f"[Tue Dec  1 02:02:03 2026] {XID}",  # dmesg -T / --ctime, local time
        f"Dec  1 02:02:03 gpu-07 kernel: {XID}",  # syslog, local time, no year
        f"Dec 01 02:02:03 gpu-07 kernel: {XID}",  # journalctl -o short
        f"Dec 01 02:02:03.000000 gpu-07 kernel: {XID}",  # journalctl -o short-precise
    ],
)
def test_local_time_prefixes_use_the_node_time_zone(cet: None, line: str) -> None:
    parts = split_line(line, now=NOW)
    assert (parts.text, parts.wall) == (XID, pytest.approx(UTC_0102))


def test_syslog_year_is_the_one_before_now(cet: None) -> None:
    # a December line read on 2 January belongs to last year
    jan2 = calendar.timegm((2027, 1, 2, 0, 0, 0, 0, 0, 0))
    parts = split_line(f"Dec  1 02:02:03 gpu-07 kernel: {XID}", now=jan2)
    assert parts.wall == pytest.approx(UTC_0102)


def test_syslog_with_kernel_timestamp_keeps_both() -> None:
    parts = split_line(f"Jan  8 11:38:05 gpu-01 kernel: [ 269.516977] {XID}", now=NOW)
    assert (parts.text, parts.usec) == (XID, 269_516_977)
    assert parts.wall is not None


@pytest.mark.parametrize(
    ("line", "usec"),
    [
        (f"[ 1843.308145] {XID}", 1_843_308_145),  # dmesg
        (f"<3>[ 1843.308145] {XID}", 1_843_308_145),  # dmesg --raw
        (f"kern  :err   : [ 1843.308145] {XID}", 1_843_308_145),  # dmesg -x
    ],
)
def test_boot_relative_prefixes(line: str, usec: int) -> None:
    parts = split_line(line)
    assert (parts.text, parts.usec, parts.wall) == (XID, usec, None)


def test_kmsg_escapes_are_undone() -> None:
    rec = format_kmsg_record(9, 5, "NVRM: a\nNVRM: b \\ c")
    parts = split_line(rec)
    assert (parts.seq, parts.usec, parts.text) == (9, 5, "NVRM: a\nNVRM: b \\ c")


def test_impossible_dates_keep_the_text_without_a_time() -> None:
    parts = split_line(f"2026-13-45T99:02:03+00:00 gpu-07 kernel: {XID}")
    assert parts.wall is None


# -- the driver's verdict on the Xid line ---------------------------------------------------------
@pytest.mark.parametrize(
    ("line", "fields"),
    [
        (
            "NVRM: Xid (PCI:0000:00:08): 94, pid='<unknown>', name=<unknown>, "
            "Contained: SM (0x1). RST: No, D-RST: No",
            (True, False, False, None, None),
        ),
        (
            "NVRM: Xid (PCI:0000:01:00): 95, pid=7062, Uncontained: LTC TAG (0x2,0x1). "
            "RST: Yes, D-RST: No",
            (False, True, False, None, None),
        ),
        ("NVRM: Xid (PCI:0000:37:00): 95, pid=5171, Uncontained: FBHUB. RST: Yes, D-RST: No",
         (False, True, False, None, None)),
        (
            "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to "
            "0x2 (Node Reboot Required)",
            (None, None, None, 2, None),
        ),
        (
            "NVRM: Xid (PCI:0000:19:00): 45, pid=2864945, name=kit, Ch 0000000b caused by "
            "previous Xid 149",
            (None, None, None, None, 149),
        ),
        (XID79, (None, None, None, None, None)),
    ],
)  # fmt: skip
def test_driver_verdict_fields(line: str, fields: tuple[object, ...]) -> None:
    ev = parse_xid(line)
    assert ev is not None
    got = (ev.contained, ev.reset_required, ev.drain_reset_required)
    assert (*got, ev.recovery_action, ev.caused_by) == fields
