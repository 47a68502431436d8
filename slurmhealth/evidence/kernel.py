"""The kernel-log lines that explain a job's death, for its window (``dmesg -T | grep``).

Reads the same sources as :mod:`slurmhealth.kernel_log` (``/dev/kmsg``, ``journalctl -k``,
``dmesg``, a file of kmsg-format or plain lines) but keeps every line matching a pattern
(Xid, NVRM, mlx5, OOM, hung tasks) between ``start`` and ``end`` (UTC seconds), not only
Xids, and needs no cursor. Lines without a time are kept: they cannot be ruled out.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterable, Sequence

from slurmhealth.evidence.sources import Sink, run_command
from slurmhealth.kernel_log import parse_line

SCAN_BYTES = 64 * 1024 * 1024  # at most this much of a log is read to find the lines


def _boot_time(now: float) -> float | None:
    try:
        with open("/proc/uptime", encoding="ascii") as fh:
            return now - float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _stamp(ts: float | None) -> str:
    if ts is None:
        return "-"
    frac = f"{ts % 1:.6f}"[1:]
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + frac + "Z"


def _emit(
    lines: Iterable[str],
    sink: Sink,
    deadline: float,
    start: float,
    end: float,
    regex: re.Pattern[str],
    boot: float | None,
) -> None:
    for n, raw in enumerate(lines):
        if n % 1024 == 0 and time.monotonic() > deadline:
            sink.time_out("kernel log scan did not finish in time")
            return
        _, usec, text = parse_line(raw)
        if not text or not regex.search(text):
            continue
        ts = None if boot is None or usec is None else boot + usec / 1e6
        if ts is not None and not start <= ts <= end:
            continue
        if not sink.write(f"{_stamp(ts)} {text}\n".encode(errors="replace")):
            sink.fail(f"kernel log excerpt over {sink.cap} bytes; cut")
            return


def _read_file(path: str, sink: Sink) -> list[str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block
        with open(fd, "rb") as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                sink.fail(f"kernel log {path} is not a regular file")
                return []
            size = st.st_size
            if size > SCAN_BYTES:
                fh.seek(size - SCAN_BYTES)
                fh.readline()  # drop the cut line
            data = fh.read(SCAN_BYTES)
    except OSError as exc:
        sink.fail(f"cannot read kernel log {path}: {exc.strerror or exc}")
        return []
    return data.decode("utf-8", "replace").splitlines()


def _read_kmsg(path: str, sink: Sink, deadline: float) -> list[str]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        sink.fail(f"cannot open {path}: {exc.strerror or exc}")
        return []
    out: list[str] = []
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except BrokenPipeError:
                continue  # records overwritten while we read
            if not chunk:
                break
            out.extend(chunk.decode("utf-8", "replace").split("\n"))
    except OSError as exc:
        sink.fail(f"cannot read {path}: {exc.strerror or exc}")
    finally:
        os.close(fd)
    return out


def _read_command(argv: Sequence[str], sink: Sink, deadline: float) -> list[str]:
    raw = Sink(SCAN_BYTES)
    run_command(argv, raw, deadline)
    if raw.error:
        sink.fail(raw.error)
    sink.timed_out = raw.timed_out
    sink.truncated = raw.truncated
    return raw.close().decode("utf-8", "replace").splitlines()


def kernel_excerpt(
    source: str,
    sink: Sink,
    deadline: float,
    start: float,
    end: float,
    pattern: str,
    *,
    kmsg_path: str = "/dev/kmsg",
    journalctl: Sequence[str] = ("journalctl",),
    dmesg: Sequence[str] = ("dmesg",),
) -> None:
    """Write the matching lines of ``source`` (kmsg | journalctl | dmesg | a file path)."""
    regex = re.compile(pattern)
    now = time.time()
    boot = _boot_time(now)
    if source == "kmsg":
        lines = _read_kmsg(kmsg_path, sink, deadline)
    elif source == "journalctl":
        since, until = f"@{int(start)}", f"@{int(end) + 1}"
        argv = [*journalctl, "-k", "-o", "short-iso-precise", "--no-pager", "-q"]
        lines = _read_command([*argv, "--since", since, "--until", until], sink, deadline)
        boot = None  # journal lines carry their own date; the window is journalctl's
    elif source == "dmesg":
        lines = _read_command([*dmesg, "--raw"], sink, deadline)
    else:
        lines = _read_file(source, sink)
    _emit(lines, sink, deadline, start, end, regex, boot)
