"""Read GPU faults from the kernel log: Xid lines and the patterns of :mod:`.patterns`.

An adapter: it reads ``/dev/kmsg``, ``journalctl -k``, ``dmesg`` or a file, remembers where
it stopped in a JSON-able cursor so an old fault never fires twice, and never raises on odd
input or an unreadable source (it says so in :class:`ReadResult` instead).
Times are UTC seconds since the epoch; kernel timestamps are microseconds since boot.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from slurmhealth.kernel_log.parse import might_be_fault, might_be_net, parse_xid, split_line
from slurmhealth.kernel_log.position import decode
from slurmhealth.model import XidEvent

if TYPE_CHECKING:
    from slurmhealth.model_records import KernelEvent  # built only where a fault was read

_XID_MARK = "NVRM: Xid ("
_MAX_LINE = 65536
_SUBPROCESS_MIN_S = 0.5


class ReadResult(NamedTuple):  # a tuple: cheaper to define than a frozen dataclass
    """What one :meth:`KernelLogReader.read_new` call found.

    ``events`` are the Xids, ``kernel_events`` the other GPU faults (fallen off the bus
    without an Xid, GSP timeouts, init failures, SXids, PCIe AER). ``cursor`` is JSON-able;
    pass it to the next call. ``available`` is False when the source could not be read at
    all (then ``cursor`` is the one passed in). ``error`` is one line: why the source is
    unavailable, or that the read was partial (capped).

    ``rebuilt`` is True when the position passed in was unreadable (none, malformed, another
    source's): the position was rebuilt from the end of the log, and what the lookback window
    held is in ``old_events`` / ``old_kernel_events``, logged before the position: to record,
    never to act on.
    """

    events: tuple[XidEvent, ...]
    cursor: dict[str, Any]
    available: bool
    error: str | None = None
    kernel_events: tuple[KernelEvent, ...] = ()
    old_events: tuple[XidEvent, ...] = ()
    old_kernel_events: tuple[KernelEvent, ...] = ()
    rebuilt: bool = False


class _Record(NamedTuple):  # a tuple: cheaper to define than a frozen dataclass
    text: str
    ts: float | None  # UTC seconds
    seq: int | None
    mark: dict[str, Any]  # the cursor just after this record


@dataclass
class _Scan:
    """One read in progress. A source sets ``cursor``/``first`` before its first record."""

    cursor: dict[str, Any]
    first: bool = True
    error: str | None = None  # a source's own "partial read" note
    old_before: float | None = None  # records logged before this (UTC s) predate the position


class _Unavailable(Exception):
    """The source cannot be read; the message becomes ``ReadResult.error``."""


def _kernel_events(
    recs: list[_Record], xids: tuple[XidEvent, ...], net: bool
) -> tuple[KernelEvent, ...]:
    """The non-Xid faults in ``recs``, the GPUs' and (``net``) the RDMA network's (mlx5
    lines); each pattern module loads only when a line needs it."""
    from slurmhealth.kernel_log.patterns import EventJoiner, resolve_gpu_numbers

    joiner = EventJoiner()
    events = [e for r in recs for e in joiner.feed(r.text, seq=r.seq, ts=r.ts)]
    if net and (mlx5 := [r for r in recs if might_be_net(r.text)]):
        from slurmhealth.kernel_log.net_patterns import parse_net_event

        found = (parse_net_event(r.text, seq=r.seq, ts=r.ts) for r in mlx5)
        events += [e for e in found if e is not None]
        events.sort(key=lambda e: (e.seq is None, e.seq or 0, e.ts or 0.0))
    return tuple(resolve_gpu_numbers(events, xids))


def _faults(recs: list[_Record], net: bool) -> tuple[tuple[XidEvent, ...], tuple[KernelEvent, ...]]:
    """The Xids and the other faults in ``recs`` (``net``: the RDMA network's too)."""
    xids = [parse_xid(r.text, seq=r.seq, ts=r.ts) for r in recs if _XID_MARK in r.text]
    found = tuple(x for x in xids if x is not None)
    rest = [r for r in recs if _XID_MARK not in r.text]
    return found, (_kernel_events(rest, found, net) if rest else ())


def _ts(boot: float | None, usec: int | None) -> float | None:
    return None if boot is None or usec is None else boot + usec / 1e6


def _read_first_line(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.readline().strip() or None
    except OSError:
        return None


_Records = Iterator[_Record | None]  # None: an already-seen record, skipped


class KernelLogReader:
    """Read new Xid events from the kernel log, from a stored cursor.

    ``source``: ``"kmsg"`` (``/dev/kmsg``), ``"journalctl"`` (``journalctl -k``), ``"dmesg"``
    (``dmesg --raw``), ``"none"`` (disabled) or a path to a file of kmsg-format or plain lines.
    ``net``: the mlx5 driver's RDMA faults too (a node with RDMA devices).
    With a cursor from another boot or file only records from the last ``lookback_s``
    seconds count; with no readable cursor they come back as old (never to act on) and the
    new cursor is the end of the log. One read stops after ``max_records`` new records or
    ``budget_s`` seconds. ``boot_time`` (UTC seconds) overrides ``now - /proc/uptime``.
    """

    kmsg_path = "/dev/kmsg"
    boot_id_path = "/proc/sys/kernel/random/boot_id"
    uptime_path = "/proc/uptime"
    journalctl_cmd: tuple[str, ...] = ("journalctl",)
    dmesg_cmd: tuple[str, ...] = ("dmesg",)

    def __init__(
        self,
        source: str,
        *,
        lookback_s: float = 3600.0,
        max_records: int = 100_000,
        budget_s: float = 1.0,
        boot_time: float | None = None,
        net: bool = True,
    ) -> None:
        self.source = source
        self.net = net  # also the RDMA network's (mlx5) lines: a node with RDMA devices
        self.lookback_s = lookback_s
        self.max_records = max(1, max_records)
        self.budget_s = budget_s
        self.boot_time = boot_time

    def read_new(self, cursor: Any, now: float) -> ReadResult:
        """Return the Xid events logged after ``cursor`` and the cursor to store next.

        ``cursor`` may be whatever a store held: one that is not a readable position of this
        source is rebuilt from the end of the log (see :class:`ReadResult`).
        """
        kept = dict(cursor) if isinstance(cursor, dict) else {}
        if self.source == "none":
            return ReadResult((), kept, False, None)
        pos = decode(cursor)
        rebuild = pos is None or pos["source"] != self.kind
        deadline = time.monotonic() + self.budget_s
        scan = _Scan({} if rebuild or pos is None else pos)
        scan.old_before = now if rebuild or pos is None else pos.get("old_before")
        try:
            with contextlib.ExitStack() as stack:
                if self.source == "kmsg":
                    recs = self._kmsg(scan, now, stack)
                elif self.source == "journalctl":
                    recs = self._journalctl(scan, now, deadline)
                elif self.source == "dmesg":
                    recs = self._dmesg(scan, now, deadline)
                else:
                    recs = self._file(scan, now, stack)
                return self._drain(recs, scan, now, deadline, rebuild)
        except _Unavailable as e:
            return ReadResult((), kept, False, str(e))
        except Exception as e:  # an adapter never raises: report and keep the cursor
            return ReadResult((), kept, False, f"kernel log ({self.source}): {e!r}"[:300])

    @property
    def kind(self) -> str:
        """The source kind a position of this reader names: kmsg, journalctl, dmesg or file."""
        return self.source if self.source in ("kmsg", "journalctl", "dmesg") else "file"

    def _drain(
        self, recs: _Records, scan: _Scan, now: float, deadline: float, rebuild: bool
    ) -> ReadResult:
        candidates: list[_Record] = []
        any_time = False
        n = 0
        for rec in recs:
            if rec is not None:
                n += 1
                scan.cursor = rec.mark
                any_time = any_time or rec.ts is not None
                if might_be_fault(rec.text) or (self.net and might_be_net(rec.text)):
                    candidates.append(rec)
                if n >= self.max_records:
                    scan.error = f"partial read: stopped after {n} records (max_records)"
                    break
            if time.monotonic() >= deadline:
                scan.error = f"partial read: {self.budget_s:g} s budget spent after {n} records"
                break
        cutoff = now - self.lookback_s

        def recent(r: _Record) -> bool:  # untimed records count only if nothing has times
            return not (any_time if r.ts is None else r.ts < cutoff)

        if scan.first:
            candidates = [r for r in candidates if recent(r)]
        before = scan.old_before
        if rebuild or before is None:
            old, new = (candidates, []) if rebuild else ([], candidates)
        else:  # a rebuild still catching up: what was logged before it is old too
            old = [r for r in candidates if (r.ts is None or r.ts < before) and recent(r)]
            new = [r for r in candidates if not (r.ts is None or r.ts < before)]
        cursor = {**scan.cursor, "saved": now}
        if before is not None and scan.error is not None:
            cursor["old_before"] = before  # partial: the next read goes on catching up
        xids, kernel = _faults(new, self.net)
        old_xids, old_kernel = _faults(old, self.net)
        return ReadResult(xids, cursor, True, scan.error, kernel, old_xids, old_kernel, rebuild)

    def _boot(self, now: float) -> float | None:
        """Boot time in UTC seconds: ``boot_time`` if given, else now - /proc/uptime."""
        if self.boot_time is None:
            with contextlib.suppress(ValueError, IndexError):
                return now - float((_read_first_line(self.uptime_path) or "").split()[0])
        return self.boot_time

    def _kmsg(self, scan: _Scan, now: float, stack: contextlib.ExitStack) -> _Records:
        boot_id = _read_first_line(self.boot_id_path) or "unknown"
        cur = scan.cursor
        scan.first = not (cur.get("source") == "kmsg" and cur.get("boot_id") == boot_id)
        last = cur["seq"] if not scan.first and isinstance(cur.get("seq"), int) else -1
        scan.cursor = {"source": "kmsg", "boot_id": boot_id, "seq": last}
        try:
            fd = os.open(self.kmsg_path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            raise _Unavailable(f"cannot open {self.kmsg_path}: {e.strerror or e}") from None
        stack.callback(os.close, fd)
        boot = self._boot(now)
        while True:
            try:
                chunk = os.read(fd, 8192)  # one record per read on the real /dev/kmsg
            except BlockingIOError:
                return  # EAGAIN: no more records
            except BrokenPipeError:
                continue  # EPIPE: records were overwritten before we read them
            except OSError as e:
                raise _Unavailable(f"cannot read {self.kmsg_path}: {e.strerror or e}") from None
            if not chunk:
                return
            for raw in chunk.decode("utf-8", "replace").split("\n"):
                parts = split_line(raw)
                seq, usec, text = parts.seq, parts.usec, parts.text
                if seq is None:
                    continue  # dictionary lines
                if seq <= last:
                    yield None
                    continue
                last = seq
                mark = {"source": "kmsg", "boot_id": boot_id, "seq": seq}
                yield _Record(text, _ts(boot, usec), seq, mark)

    def _file(self, scan: _Scan, now: float, stack: contextlib.ExitStack) -> _Records:
        """A file of kmsg-format or plain lines; the cursor holds its inode and byte offset."""
        path, cur = self.source, scan.cursor
        try:
            f = stack.enter_context(open(path, "rb"))  # noqa: SIM115
            st = os.fstat(f.fileno())
        except OSError as e:
            raise _Unavailable(f"cannot read kernel log file {path}: {e.strerror or e}") from None
        ident = {"source": "file", "path": path, "inode": st.st_ino, "dev": st.st_dev}
        off, line, seq = cur.get("offset"), cur.get("line"), cur.get("seq")
        scan.first = not (
            all(cur.get(k) == v for k, v in ident.items())
            and isinstance(off, int)
            and 0 <= off <= st.st_size
            and isinstance(line, int)
        )
        if scan.first or not isinstance(off, int) or not isinstance(line, int):
            off, line, seq = 0, 0, None
        scan.cursor = {**ident, "offset": off, "line": line, "seq": seq}
        f.seek(off)
        boot = self._boot(now)
        while True:
            raw = f.readline(_MAX_LINE)
            if not raw or (not raw.endswith(b"\n") and len(raw) < _MAX_LINE):
                return  # end of file, or a line still being written
            off += len(raw)
            line += 1
            parts = split_line(raw.decode("utf-8", "replace"), now=now)
            seq = parts.seq if parts.seq is not None else seq
            mark = {**ident, "offset": off, "line": line, "seq": seq}
            ts = parts.wall if parts.wall is not None else _ts(boot, parts.usec)
            yield _Record(parts.text, ts, parts.seq, mark)

    def _run(self, argv: list[str], deadline: float, scan: _Scan) -> tuple[int, str, str]:
        """Run ``argv`` under the budget; return (rc, stdout, first stderr line)."""
        import subprocess  # only journalctl/dmesg need it; kmsg and files stay fast

        timeout = max(deadline - time.monotonic(), _SUBPROCESS_MIN_S)
        try:
            p = subprocess.run(
                argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False
            )
        except (FileNotFoundError, PermissionError) as e:
            raise _Unavailable(f"cannot run {argv[0]}: {e.strerror or e}") from None
        except subprocess.TimeoutExpired as e:
            scan.error = f"partial read: {argv[0]} ran past the time budget"
            text = (e.stdout if isinstance(e.stdout, bytes) else b"").decode("utf-8", "replace")
            return 0, text[: text.rfind("\n") + 1], ""  # drop a cut-off last line
        err = p.stderr.decode("utf-8", "replace").strip().splitlines()
        return p.returncode, p.stdout.decode("utf-8", "replace"), err[0] if err else ""

    def _journalctl(self, scan: _Scan, now: float, deadline: float) -> _Records:
        argv = [*self.journalctl_cmd, "-k", "-o", "json", "--no-pager", "-q"]
        since = ["--since", f"@{max(0, int(now - self.lookback_s))}"]
        jc = scan.cursor.get("cursor") if scan.cursor.get("source") == "journalctl" else None
        scan.first = not (isinstance(jc, str) and jc)
        rc, out, err = self._run(
            argv + (since if scan.first else ["--after-cursor", str(jc)]), deadline, scan
        )
        if rc != 0 and not scan.first:  # the stored cursor is gone (journal vacuumed)
            scan.first, jc = True, None
            rc, out, err = self._run(argv + since, deadline, scan)
        if rc != 0:
            raise _Unavailable(f"journalctl exited {rc}: {err or 'no message'}"[:300])
        scan.cursor = mark = {"source": "journalctl", "cursor": jc}
        for line in out.splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            msg = obj.get("MESSAGE")
            if isinstance(msg, list):  # non-UTF-8 messages come as a list of byte values
                msg = bytes(b & 0xFF for b in msg if isinstance(b, int)).decode("utf-8", "replace")
            if isinstance(obj.get("__CURSOR"), str):
                mark = {"source": "journalctl", "cursor": obj["__CURSOR"]}
            try:
                ts: float | None = int(obj["__REALTIME_TIMESTAMP"]) / 1e6
            except (KeyError, TypeError, ValueError):
                ts = None
            yield _Record(msg if isinstance(msg, str) else "", ts, None, mark)

    def _dmesg(self, scan: _Scan, now: float, deadline: float) -> _Records:
        """``dmesg`` has no sequence numbers: a record is new if (usec, n-th at usec) is."""
        rc, out, err = self._run([*self.dmesg_cmd, "--raw"], deadline, scan)
        if rc != 0:
            raise _Unavailable(f"dmesg exited {rc}: {err or 'no message'}"[:300])
        boot_id = _read_first_line(self.boot_id_path) or "unknown"
        cur = scan.cursor
        last, n_at = cur.get("usec"), cur.get("n_at")
        scan.first = not (
            cur.get("source") == "dmesg"
            and cur.get("boot_id") == boot_id
            and isinstance(last, int)
            and isinstance(n_at, int)
        )
        if scan.first or not isinstance(last, int) or not isinstance(n_at, int):
            last, n_at = -1, 0
        scan.cursor = {"source": "dmesg", "boot_id": boot_id, "usec": last, "n_at": n_at}
        seen_at_last, cur_usec, cur_n, boot = 0, last, n_at, self._boot(now)
        prev: _Record | None = None  # the last new record: continuation lines belong to it
        for line in out.splitlines():
            parts = split_line(line)
            usec = parts.usec
            if usec is None:  # a continuation line of a multi-line message
                if prev is not None:
                    yield _Record(parts.text.strip(), prev.ts, None, prev.mark)
                continue
            prev = None
            if usec == last:
                seen_at_last += 1
            if usec < last or (usec == last and seen_at_last <= n_at):
                yield None
                continue
            cur_n = cur_n + 1 if usec == cur_usec else 1
            cur_usec = usec
            mark = {"source": "dmesg", "boot_id": boot_id, "usec": usec, "n_at": cur_n}
            prev = _Record(parts.text, _ts(boot, usec), None, mark)
            yield prev
