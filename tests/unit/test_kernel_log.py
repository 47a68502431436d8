from __future__ import annotations

import errno
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from slurmhealth.kernel_log import (
    KernelLogReader,
    ReadResult,
    format_kmsg_record,
)
from slurmhealth.model import normalize_pci_bus_id

NVML_B7 = normalize_pci_bus_id("00000000:B7:00.0")
NVML_53 = normalize_pci_bus_id("00000000:53:00.0")
BOOT = 1_700_000_000.0  # injected boot time, UTC seconds
XID79 = "NVRM: Xid (PCI:0000:53:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


# -- file source ----------------------------------------------------------------------------
def xid_line(seq: int, usec: int, bus: str = "53", xid: int = 79) -> str:
    text = f"NVRM: Xid (PCI:0000:{bus}:00): {xid}, pid=1, name=p, seq {seq}"
    return format_kmsg_record(seq, usec, text) + "\n"


NOW = BOOT + 10_000.0  # 10,000 s after boot


def reader(path: Path | str, **kw: Any) -> KernelLogReader:
    return KernelLogReader(str(path), boot_time=BOOT, **kw)


def seqs(res: ReadResult) -> list[int | None]:
    return [e.seq for e in res.events]


def old_seqs(res: ReadResult) -> list[int | None]:
    """Records a read without a readable position found: logged before it, never acted on."""
    return [e.seq for e in res.old_events]


def test_file_cursor_reads_only_new_records(tmp_path: Path) -> None:
    log = tmp_path / "kmsg.log"
    log.write_text(xid_line(1, 9_000_000_000) + " SUBSYSTEM=pci\n" + xid_line(2, 9_001_000_000))
    r = reader(log)
    first = r.read_new(None, NOW)
    assert (first.available, first.error, first.rebuilt, seqs(first)) == (True, None, True, [])
    assert old_seqs(first) == [1, 2]
    assert first.old_events[0].ts == pytest.approx(BOOT + 9_000.0)
    assert json.loads(json.dumps(first.cursor)) == first.cursor
    with log.open("a") as f:
        f.write(xid_line(3, 9_002_000_000))
    second = r.read_new(first.cursor, NOW)
    assert (seqs(second), old_seqs(second), second.rebuilt) == ([3], [], False)
    third = r.read_new(second.cursor, NOW)
    assert (third.events, third.cursor) == ((), second.cursor)


def test_file_partial_last_line_waits(tmp_path: Path) -> None:
    log = tmp_path / "kmsg.log"
    full = xid_line(1, 9_000_000_000)
    log.write_text(full[:20])
    res = reader(log).read_new(None, NOW)
    assert res.events == () and res.cursor["offset"] == 0
    log.write_text(full)
    assert seqs(reader(log).read_new(res.cursor, NOW)) == [1]


def test_replaced_file_restarts_with_lookback(tmp_path: Path) -> None:
    log = tmp_path / "kmsg.log"
    log.write_text(xid_line(1, 9_000_000_000) + xid_line(2, 9_001_000_000))
    r = reader(log)
    cur = r.read_new(None, NOW).cursor
    new = tmp_path / "new.log"
    # old record (outside the hour), a recent one, then a record the old cursor "passed"
    new.write_text(xid_line(1, 1_000_000) + xid_line(5, 9_500_000_000) + xid_line(6, 9_600_000_000))
    os.replace(new, log)
    res = r.read_new(cur, NOW)
    assert seqs(res) == [5, 6]
    assert res.cursor["inode"] == log.stat().st_ino


def test_truncated_file_restarts(tmp_path: Path) -> None:
    log = tmp_path / "kmsg.log"
    log.write_text(xid_line(1, 9_000_000_000) + xid_line(2, 9_001_000_000))
    r = reader(log)
    cur = r.read_new(None, NOW).cursor
    with log.open("r+") as f:
        f.truncate(0)
    log.write_text(xid_line(1, 9_900_000_000))
    assert seqs(r.read_new(cur, NOW)) == [1]


def test_lookback_filters_old_records_on_first_read(tmp_path: Path) -> None:
    log = tmp_path / "kmsg.log"
    log.write_text(
        xid_line(1, 1_000_000)  # 9,999 s ago
        + xid_line(2, 6_000_000_000)  # 4,000 s ago
        + "NVRM: Xid (PCI:0000:53:00): 48, untimed in a timed source\n"
        + xid_line(3, 7_000_000_000)  # 3,000 s ago
    )
    assert old_seqs(reader(log).read_new(None, NOW)) == [3]
    assert old_seqs(reader(log, lookback_s=5000).read_new(None, NOW)) == [2, 3]


def test_untimed_file_returns_all_on_first_read(tmp_path: Path) -> None:
    log = tmp_path / "plain.log"
    log.write_text(f"{XID79}\nsomething else\nNVRM: Xid (0000:b7:00): 13, x\n")
    res = reader(log).read_new(None, NOW)
    assert [(e.xid, e.pci_bus_id, e.ts) for e in res.old_events] == [
        (79, NVML_53, None),
        (13, NVML_B7, None),
    ]
    assert res.cursor["line"] == 3


def test_max_records_caps_and_resumes(tmp_path: Path) -> None:
    log = tmp_path / "kmsg.log"
    log.write_text("".join(xid_line(i, 9_000_000_000 + i) for i in range(1, 6)))
    r = reader(log, max_records=2)
    res = r.read_new(None, NOW)
    assert old_seqs(res) == [1, 2] and res.error and "partial" in res.error
    # a rebuilt position still catching up: records logged before the rebuild stay old
    res = r.read_new(res.cursor, NOW + 1)
    assert (seqs(res), old_seqs(res)) == ([], [3, 4])
    with log.open("a") as f:
        f.write(xid_line(6, int((NOW + 2 - BOOT) * 1e6)))
    res = r.read_new(res.cursor, NOW + 3)
    assert (seqs(res), old_seqs(res)) == ([6], [5])
    res = r.read_new(res.cursor, NOW + 4)
    assert (res.events, res.error) == ((), None) and "old_before" not in res.cursor  # caught up


def test_budget_caps_the_read(tmp_path: Path) -> None:
    log = tmp_path / "kmsg.log"
    log.write_text("".join(xid_line(i, 9_000_000_000 + i) for i in range(1, 4)))
    r = reader(log, budget_s=0.0)
    res = r.read_new(None, NOW)
    assert res.available and old_seqs(res) == [1]
    assert res.error is not None and "budget" in res.error
    assert old_seqs(r.read_new(res.cursor, NOW)) == [2]


def test_missing_file_is_unavailable(tmp_path: Path) -> None:
    cur = {"source": "file", "path": "x", "inode": 1, "dev": 1, "offset": 5, "line": 1}
    res = reader(tmp_path / "missing.log").read_new(cur, NOW)
    assert (res.available, res.events, res.cursor) == (False, (), cur)
    assert res.error and "\n" not in res.error


def test_unreadable_path_is_unavailable(tmp_path: Path) -> None:
    res = reader(tmp_path).read_new(None, NOW)  # a directory: open() fails even for root
    assert (res.available, res.events, res.cursor) == (False, (), {})
    assert res.error and str(tmp_path) in res.error


def test_none_source() -> None:
    res = KernelLogReader("none").read_new({"a": 1}, NOW)
    assert (res.available, res.events, res.cursor) == (False, (), {"a": 1})


# -- /dev/kmsg ------------------------------------------------------------------------------
@pytest.fixture
def fake_kmsg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    kmsg = tmp_path / "kmsg"
    boot_id = tmp_path / "boot_id"
    boot_id.write_text("boot-a\n")
    monkeypatch.setattr(KernelLogReader, "kmsg_path", str(kmsg))
    monkeypatch.setattr(KernelLogReader, "boot_id_path", str(boot_id))
    return kmsg


def test_kmsg_cursor_and_reboot(fake_kmsg: Path) -> None:
    fake_kmsg.write_text(
        xid_line(10, 9_000_000_000) + " DEVICE=+pci:x\n" + xid_line(11, 9_100_000_000)
    )
    r = KernelLogReader("kmsg", boot_time=BOOT)
    res = r.read_new(None, NOW)
    assert old_seqs(res) == [10, 11] and res.cursor == {
        "source": "kmsg",
        "boot_id": "boot-a",
        "seq": 11,
        "saved": NOW,
    }
    with fake_kmsg.open("a") as f:
        f.write(xid_line(12, 9_200_000_000))
    res = r.read_new(res.cursor, NOW)
    assert seqs(res) == [12]
    assert r.read_new(res.cursor, NOW).events == ()
    # reboot: new boot id, seq restarts; only recent records count
    (fake_kmsg.parent / "boot_id").write_text("boot-b\n")
    fake_kmsg.write_text(xid_line(1, 1_000_000) + xid_line(2, 9_900_000_000))
    assert seqs(r.read_new(res.cursor, NOW)) == [2]


def test_kmsg_uptime_gives_boot_time(fake_kmsg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uptime = fake_kmsg.parent / "uptime"
    uptime.write_text("100.00 50.00\n")
    monkeypatch.setattr(KernelLogReader, "uptime_path", str(uptime))
    fake_kmsg.write_text(xid_line(1, 90_000_000))
    res = KernelLogReader("kmsg").read_new(None, NOW)
    assert [e.ts for e in res.old_events] == [pytest.approx(NOW - 10.0)]


def test_kmsg_missing_is_unavailable(fake_kmsg: Path) -> None:
    res = KernelLogReader("kmsg").read_new({"source": "kmsg", "seq": 3}, NOW)
    assert (res.available, res.cursor) == (False, {"source": "kmsg", "seq": 3})
    assert res.error and "kmsg" in res.error


def fake_read(chunks: list[bytes | int]) -> Any:
    def read(fd: int, n: int) -> bytes:
        if not chunks:
            raise BlockingIOError(errno.EAGAIN, "again")
        item = chunks.pop(0)
        if isinstance(item, int):
            raise OSError(item, os.strerror(item))
        return item

    return read


def test_kmsg_epipe_continues(fake_kmsg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_kmsg.write_text("")
    chunks: list[bytes | int] = [
        xid_line(1, 9_000_000_000).encode(),
        errno.EPIPE,
        xid_line(5, 9_000_000_001).encode(),
    ]
    monkeypatch.setattr(os, "read", fake_read(chunks))
    res = KernelLogReader("kmsg", boot_time=BOOT).read_new(None, NOW)
    assert (res.available, old_seqs(res)) == (True, [1, 5])


def test_kmsg_einval_is_unavailable(fake_kmsg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_kmsg.write_text("")
    chunks: list[bytes | int] = [xid_line(1, 9_000_000_000).encode(), errno.EINVAL]
    monkeypatch.setattr(os, "read", fake_read(chunks))
    res = KernelLogReader("kmsg", boot_time=BOOT).read_new(None, NOW)
    assert (res.available, res.events, res.cursor) == (False, (), {})


# -- journalctl and dmesg through fake binaries ----------------------------------------------
def fake_binary(tmp_path: Path, name: str, output: str, rc: int = 0) -> Path:
    out = tmp_path / f"{name}.out"
    out.write_text(output)
    script = tmp_path / name
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"open({str(tmp_path / (name + '.argv'))!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        f"sys.stdout.write(open({str(out)!r}).read())\n"
        f"sys.stderr.write('boom\\n' if {rc} else '')\n"
        f"sys.exit({rc})\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def journal_entry(cursor: str, ts: float, message: Any) -> str:
    entry = {"__CURSOR": cursor, "__REALTIME_TIMESTAMP": str(int(ts * 1e6)), "MESSAGE": message}
    return json.dumps(entry) + "\n"


def test_journalctl_cursor(tmp_path: Path) -> None:
    out = (
        journal_entry("c1", NOW - 60, XID79)
        + "not json\n"
        + journal_entry("c2", NOW - 30, list(b"NVRM: Xid (PCI:0000:b7:00): 48, DBE\xff"))
    )
    r = KernelLogReader("journalctl")
    r.journalctl_cmd = (str(fake_binary(tmp_path, "journalctl", out)),)
    res = r.read_new(None, NOW)
    assert [(e.xid, e.pci_bus_id) for e in res.old_events] == [(79, NVML_53), (48, NVML_B7)]
    assert res.old_events[0].ts == pytest.approx(NOW - 60)
    assert res.cursor == {"source": "journalctl", "cursor": "c2", "saved": NOW}
    r.read_new(res.cursor, NOW)
    argv = (tmp_path / "journalctl.argv").read_text().splitlines()
    assert argv[0].startswith("-k -o json --no-pager -q --since @")
    assert argv[1].endswith("--after-cursor c2")


def test_journalctl_failure_is_unavailable(tmp_path: Path) -> None:
    r = KernelLogReader("journalctl")
    r.journalctl_cmd = (str(fake_binary(tmp_path, "journalctl", "", rc=1)),)
    res = r.read_new({"source": "journalctl", "cursor": "c9"}, NOW)
    assert (res.available, res.cursor) == (False, {"source": "journalctl", "cursor": "c9"})
    assert res.error == "journalctl exited 1: boom"
    r.journalctl_cmd = (str(tmp_path / "no-such-journalctl"),)
    res = r.read_new(None, NOW)
    assert res.available is False and res.error and "cannot run" in res.error


def test_dmesg_uses_timestamps_as_cursor(tmp_path: Path) -> None:
    lines = [
        f"<4>[    1.000000] {XID79}",  # long ago
        f"<4>[ 9500.000000] {XID79}",
        "<4>[ 9500.000000] NVRM: Xid (PCI:0000:b7:00): 48, same usec",
        "<6>[ 9600.000000] unrelated",
    ]
    r = KernelLogReader("dmesg", boot_time=BOOT)
    r.dmesg_cmd = (str(fake_binary(tmp_path, "dmesg", "\n".join(lines) + "\n")),)
    res = r.read_new(None, NOW)
    assert [e.xid for e in res.old_events] == [79, 48]
    assert res.old_events[0].ts == pytest.approx(BOOT + 9500)
    lines.append("<4>[ 9700.000000] NVRM: Xid (PCI:0000:b7:00): 74, link")
    (tmp_path / "dmesg.out").write_text("\n".join(lines) + "\n")
    res = r.read_new(res.cursor, NOW)
    assert [e.xid for e in res.events] == [74]
    assert r.read_new(res.cursor, NOW).events == ()
    assert (tmp_path / "dmesg.argv").read_text().splitlines()[0] == "--raw"


def test_dmesg_missing_binary_is_unavailable(tmp_path: Path) -> None:
    r = KernelLogReader("dmesg")
    r.dmesg_cmd = (str(tmp_path / "no-dmesg"),)
    res = r.read_new(None, NOW)
    assert (res.available, res.events, res.cursor) == (False, (), {})


def test_file_of_dmesg_ctime_lines_gets_wall_clock_times(tmp_path: Path) -> None:
    import time

    at = time.mktime((2026, 12, 1, 1, 2, 3, 0, 0, -1))  # dmesg -T prints local time
    log = tmp_path / "dmesg-T.log"
    log.write_text(
        "[Mon Nov 30 20:00:00 2026] NVRM: Xid (PCI:0000:53:00): 48, old, before the lookback\n"
        "[Tue Dec  1 01:02:03 2026] NVRM: Xid (PCI:0000:b7:00): 79, GPU has fallen off the bus.\n"
        "[Tue Dec  1 01:02:04 2026] NVRM: GPU 0000:b7:00.0: GPU has fallen off the bus.\n"
    )
    res = KernelLogReader(str(log)).read_new(None, at + 600)
    assert [(e.xid, e.ts) for e in res.old_events] == [(79, at)]
    assert [(e.kind, e.ts) for e in res.old_kernel_events] == [("fallen_off_bus", at + 1)]
