"""Fuzzing the kernel-log parser: 10,000 mutated lines in every time-prefix form the reader
meets (/dev/kmsg records, dmesg raw and -T, ISO, syslog, journalctl short-iso/-precise/-unix)
around real-looking driver messages (Xid lines of every vintage, fallen off the bus, GSP
timeouts, SXid, PCIe AER) and garbage. The parse functions document that they never raise:
here they must not, and what they return must be well formed. The file reader, which would
swallow an exception as "unavailable", must read all of it."""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

from slurmhealth.kernel_log import KernelLogReader, split_line
from slurmhealth.kernel_log.parse import parse_xid
from slurmhealth.kernel_log.patterns import EventJoiner, parse_event
from slurmhealth.model import KERNEL_EVENT_KINDS

N = 10_000
BUS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
NOW = 1_764_550_923.0

MESSAGES = [
    "NVRM: Xid (PCI:0000:53:00): 79, pid=1234, name=python3, GPU has fallen off the bus.",
    "NVRM: Xid (0000:3b:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): "
    "Out Of Range Address",
    "NVRM: Xid (PCI:0000:00:08 GPU-I:05 GPU-CI:01): 94, pid='<unknown>', name=<unknown>, "
    "Contained: SM (0x1). RST: No, D-RST: No",
    "NVRM: Xid (PCI:0000:b3:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 "
    "(Node Reboot Required)",
    "NVRM: Xid (PCI:0000:1a:00): 45, pid=2211, name=python, Ch 00000010, caused by previous "
    "Xid 149",
    "NVRM: Xid (PCI:0000:1a:00): 119, pid=9, name=nvidia-smi, Timeout waiting for RPC from "
    "GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20801348 0x4).",
    "NVRM: Xid (PCI:0000:c1:00): 48, pid=77, name=train, An uncorrectable double bit error "
    "(DBE) has been detected on GPU in the framebuffer at partition 2, subpartition 0.",
    "NVRM: Xid (PCI:0000:18:00): 74, pid=5, name=a, NVLink: fatal error detected on link 3"
    "(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    "NVRM: Xid (PCI:0000:18:00): 140, Uncontained: ECC. RST: Yes, D-RST: Yes",
    "NVRM: GPU 0000:b3:00.0: GPU has fallen off the bus.",
    "NVRM: The NVIDIA GPU 0000:b3:00.0",
    "NVRM: (PCI ID: 10de:2330) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
    "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:2330) installed in this system "
    "has\nNVRM: fallen off the bus and is not responding to commands.",
    "NVRM: _kgspIsHeartbeatTimedOut: Heartbeat timed out, GPU1",
    "NVRM: GPU0 GSP RPC buffer contains function 76 (GSP_RM_CONTROL) and data 0x20800a6a",
    "NVRM: RmInitAdapter failed! (0x22:0x56:667)",
    "NVRM: rm_init_adapter(0) failed",
    "NVRM: None of the NVIDIA devices were initialized.",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted "
    "PRIV error (First)",
    "nvidia-nvswitch3: SXid (PCI:0000:8a:00.0): 20034, Fatal, Link 09 LTSSM Fault Up",
    "nvidia-nvswitch3: SXid (PCI:0000:8a:00.0): 20034, Severity 1 Engine instance 60 Sub",
    "pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:b3:00.0",
    "pcieport 0000:00:01.0: AER: Multiple Corrected error received: 0000:b3:00.0",
    "nvidia 0000:b3:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
    "nvidia 0000:b3:00.0: probe with driver nvidia failed with error -1",
    "nvidia: probe of 0000:b3:00.0 failed with error -1",
    "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
    "EXT4-fs (sda1): mounted filesystem with ordered data mode.",
    "",
]
PREFIXES = [
    "{prio},{seq},{usec},-;",
    "{prio},{seq},{usec},-,caller=T{n};",
    "[{up}] ",
    "<{prio}>[{up}] ",
    "kern  :err   : [{up}] ",
    "[{dow} {mon} {day:>2} {hh}:{mm}:{ss} {year}] ",
    "{year}-{mo}-{dd}T{hh}:{mm}:{ss},{frac}{tz} ",
    "{year}-{mo}-{dd}T{hh}:{mm}:{ss}.{frac}{tz} gpu01 kernel: ",
    "{mon} {day:>2} {hh}:{mm}:{ss} gpu01 kernel: ",
    "{mon} {dd} {hh}:{mm}:{ss}.{frac} gpu01 kernel[0]: ",
    "{unix}.{frac} gpu01 kernel: ",
    " DEVICE=+pci:0000:b3:00.0",
    "",
]
ODD_NUMBERS = [
    "0",
    "-1",
    "9" * 30,
    "99999999999999999999",
    "00",
    "1e30",
    "٣",
    "18446744073709551616",
]
MONTHS = ["Jan", "Feb", "Dec", "Foo", ""]
JUNK = "[]():,;=-.'\"<>\\x0a \t\n\r\x00\x7fé٣\u2028\ufffd\ud800GSPXidNVRM0123456789abcdef"


def _field(rng: random.Random, normal: str) -> str:
    return rng.choice(ODD_NUMBERS) if rng.random() < 0.1 else normal


def _prefix(rng: random.Random) -> str:
    def f(normal: str) -> str:
        return _field(rng, normal)

    return rng.choice(PREFIXES).format(
        prio=f(str(rng.randint(0, 191))),
        seq=f(str(rng.randint(0, 10**7))),
        usec=f(str(rng.randint(0, 10**13))),
        n=rng.randint(1, 9999),
        up=f"{rng.randint(0, 10**6):>5}.{rng.randint(0, 999999):06d}",
        dow=rng.choice(["Tue", "Sun", "Xyz"]),
        mon=rng.choice(MONTHS),
        day=f(str(rng.randint(0, 32))),
        dd=f(f"{rng.randint(0, 32):02d}"),
        mo=f(f"{rng.randint(0, 13):02d}"),
        year=f(str(rng.choice([2026, 1970, 0, 9999, 2038]))),
        hh=f(f"{rng.randint(0, 25):02d}"),
        mm=f(f"{rng.randint(0, 61):02d}"),
        ss=f(f"{rng.randint(0, 61):02d}"),
        frac=f(str(rng.randint(0, 10**9))),
        tz=rng.choice(["Z", "+00:00", "+0000", "-05:30", "+99:99", "+2400"]),
        unix=f(str(rng.randint(10**8, 10**11))),
    )


def _message(rng: random.Random) -> str:
    text = rng.choice(MESSAGES)
    if rng.random() < 0.3:  # a number of the message made odd (Xid code, pid, bus id, SXid)
        numbers = list(re.finditer(r"[0-9a-f]+", text))
        if numbers:
            m = rng.choice(numbers)
            text = text[: m.start()] + rng.choice(ODD_NUMBERS) + text[m.end() :]
    return text


def fuzz_line(rng: random.Random) -> str:
    if rng.random() < 0.05:
        return "".join(rng.choice(JUNK) for _ in range(rng.randint(0, 200)))
    line = list(_prefix(rng) + _message(rng))
    for _ in range(rng.choice([0, 0, 0, 1, 2, 5])):  # flip, drop or insert a character
        at = rng.randrange(len(line) + 1)
        op = rng.randrange(3)
        if op == 0 and at < len(line):
            line[at] = rng.choice(JUNK)
        elif op == 1 and at < len(line):
            del line[at]
        else:
            line.insert(at, rng.choice(JUNK))
    if rng.random() < 0.05:
        line = line[: rng.randrange(len(line) + 1)]  # truncated record
    return "".join(line)


def test_kernel_log_parse_fuzz_ten_thousand_lines() -> None:
    rng = random.Random(20261211)
    seen = {"kmsg": 0, "usec": 0, "wall": 0, "xid": 0, "event": 0}
    joiner = EventJoiner()
    for _ in range(N):
        line = fuzz_line(rng)
        parts = split_line(line, now=NOW)
        assert isinstance(parts.text, str)
        assert parts.seq is None or parts.seq >= 0
        assert parts.usec is None or parts.usec >= 0
        assert parts.wall is None or math.isfinite(parts.wall)
        seen["kmsg"] += parts.seq is not None
        seen["usec"] += parts.usec is not None
        seen["wall"] += parts.wall is not None
        xid = parse_xid(parts.text, seq=parts.seq, ts=parts.wall)
        if xid is not None:
            seen["xid"] += 1
            assert 0 <= xid.xid < 100_000 and BUS.fullmatch(xid.pci_bus_id), xid
            assert xid.pid is None or xid.pid >= 0
        event = parse_event(parts.text)
        for e in [event, *joiner.feed(parts.text, seq=parts.seq, ts=parts.wall)]:
            if e is not None:
                seen["event"] += 1
                assert e.kind in KERNEL_EVENT_KINDS
                assert e.pci_bus_id is None or BUS.fullmatch(e.pci_bus_id), e
    assert min(seen.values()) > N // 20, seen  # every path was exercised


def test_kernel_log_file_reader_reads_fuzzed_lines_to_the_end(tmp_path: Path) -> None:
    """The reader turns any exception into "unavailable": none may happen on odd lines."""
    rng = random.Random(5)
    lines = [fuzz_line(rng).replace("\n", " ") for _ in range(N)]
    log = tmp_path / "kern.log"
    data = b"".join(line.encode("utf-8", "surrogatepass") + b"\n" for line in lines)
    data += rng.randbytes(300) + b"\n"
    log.write_bytes(data)
    reader = KernelLogReader(str(log), lookback_s=10**9, budget_s=60, boot_time=NOW - 3600)
    res = reader.read_new(None, NOW)
    assert res.available and res.error is None, res.error
    assert res.cursor["line"] == data.count(b"\n")  # read to the end
    assert res.events or res.old_events
