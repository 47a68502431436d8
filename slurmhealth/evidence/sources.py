"""Bounded readers for the evidence bundle: every source has a deadline and a byte cap.

A source writes into a :class:`Sink`; the capture closes the sink when it stops waiting, so
a source that hangs or floods costs at most its cap and its time. Commands run with
argument lists (never a shell) in their own session and are killed, with their children,
at the deadline. Deadlines are ``time.monotonic()`` values.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from slurmhealth.access import safe_read
from slurmhealth.access.user_open import Opened, Rights, open_paths

if TYPE_CHECKING:
    from slurmhealth.config import Config

_CHUNK = 65536


class Sink:
    """At most ``cap`` bytes a source produced; ignores writes once closed."""

    def __init__(self, cap: int) -> None:
        self.cap = max(0, cap)
        self.truncated = False
        self.timed_out = False
        self.error: str | None = None
        self._parts: list[bytes] = []
        self._size = 0
        self._closed = False
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        return self._size

    def write(self, data: bytes) -> bool:
        """Keep what fits; False when the sink is full or closed (stop producing)."""
        with self._lock:
            if self._closed:
                return False
            room = self.cap - self._size
            if len(data) > room:
                data = data[:room]
                self.truncated = True
            if data:
                self._parts.append(data)
                self._size += len(data)
            return not self.truncated

    def fail(self, error: str) -> None:
        with self._lock:
            if not self._closed and self.error is None:
                self.error = error[:500]

    def time_out(self, error: str) -> None:
        """The source ran out of time: what it wrote is cut short, ``error`` says why."""
        self.timed_out = self.truncated = True
        self.fail(error)

    def close(self) -> bytes:
        with self._lock:
            self._closed = True
            return b"".join(self._parts)


def run_command(argv: Sequence[str], sink: Sink, deadline: float) -> int | None:
    """Run ``argv`` (stdout and stderr together) into ``sink`` until it exits, the sink is
    full or ``deadline`` passes; then kill its process group. Return the exit status, or
    None when it was cut (``sink.timed_out`` / ``sink.truncated`` say why)."""
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        sink.fail(f"cannot run {argv[0]}: {exc.strerror or exc}")
        return None
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    rc: int | None = None
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    sink.time_out(f"{argv[0]} did not finish in time; killed")
                    break
                if not sel.select(min(left, 0.5)):
                    continue
                try:
                    chunk = os.read(fd, _CHUNK)
                except BlockingIOError:
                    continue
                if not chunk:
                    break  # end of output
                if not sink.write(chunk):
                    sink.fail(f"{argv[0]}: output over {sink.cap} bytes; cut")
                    break
        if not sink.timed_out and not sink.truncated:
            with contextlib.suppress(subprocess.TimeoutExpired):
                rc = proc.wait(timeout=max(0.01, deadline - time.monotonic()))
            if rc is None:
                sink.time_out(f"{argv[0]} did not exit in time; killed")
            elif rc != 0:
                sink.fail(f"{argv[0]} exited with status {rc}")
    finally:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=1.0)
        proc.stdout.close()
    return rc


def tail_file(
    path: str, sink: Sink, nbytes: int, uid: int | None = None, rights: Rights | None = None
) -> None:
    """The last ``min(nbytes, sink.cap)`` bytes of the regular file ``path``.

    Opened with ``rights`` (the job's user: :mod:`slurmhealth.access.user_open`) when given, never
    following a final symlink nor blocking on a FIFO; when ``uid`` is known it must own the
    file (a job's user must not get root to copy someone else's file into the bundle)."""
    opened, note = open_paths([path], rights, max_files=1, timeout_s=2.0)
    if note:
        sink.fail(note)
    for one in opened:
        tail_opened(one, sink, nbytes, uid)
    if not opened and not note:
        sink.fail(f"cannot open {path}")


def tail_opened(one: Opened, sink: Sink, nbytes: int, uid: int | None) -> None:
    """Into ``sink``: the tail of a file :func:`open_paths` opened (closes its fd)."""
    if one.fd is None:
        sink.fail(f"cannot open {one.path}: {one.error}")
        return
    try:
        st = safe_read.check_fd(one.fd, one.path, uid=uid)
        data = safe_read.read_fd(one.fd, st, one.path, min(nbytes, sink.cap), tail=True)
    except safe_read.Unsafe as exc:
        note = str(exc)
        if "belongs to uid" in note:
            note += " (the job's uid); not copied"
        sink.fail(note)
        return
    finally:
        os.close(one.fd)
    sink.write(data)
    if st.st_size > len(data):
        sink.truncated = True


def history_rows(
    db_path: str, table: str, job_id: str, node: str, sink: Sink, deadline: float
) -> None:
    """The job's rows of ``table`` as JSON lines, oldest first; when over the cap the newest
    rows are kept (the end of a job is what explains its death)."""
    from slurmhealth.history.read import Reader, job_node_rows

    if not os.path.exists(db_path):
        sink.fail(f"no history at {db_path}")
        return
    with Reader(db_path, busy_timeout_s=max(0.05, deadline - time.monotonic())) as db:
        lines: list[bytes] = []
        size = 0
        for n, row in enumerate(job_node_rows(db, table, job_id, node, newest_first=True)):
            line = (json.dumps(row, default=str) + "\n").encode()
            if size + len(line) > sink.cap:
                sink.truncated = True
                break
            lines.append(line)
            size += len(line)
            if n % 256 == 0 and time.monotonic() > deadline:
                sink.time_out("history read did not finish in time")
                break
        sink.write(b"".join(reversed(lines)))


def find_py_spy(configured: str) -> str | None:
    """``configured`` on PATH (or as a path), else the one installed beside this Python."""
    import shutil
    import sys

    found = shutil.which(configured)
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if configured == "py-spy" and os.access(beside, os.X_OK) else None


def py_spy_dumps(
    py_spy: str, pids: Sequence[int], sink: Sink, timeout_s: float, deadline: float
) -> None:
    """``py-spy dump --pid P`` for each pid, each under its own timeout, into one sink."""
    errors = []
    for pid in pids:
        if time.monotonic() >= deadline:
            sink.timed_out = sink.truncated = True
            errors.append(f"no time left for pid {pid}")
            break
        if not sink.write(f"==== py-spy dump --pid {pid}\n".encode()):
            break
        one = Sink(sink.cap - sink.size)
        run_command([py_spy, "dump", "--pid", str(pid)], one,
                    min(deadline, time.monotonic() + timeout_s))  # fmt: skip
        sink.write(one.close() + b"\n")
        sink.truncated = sink.truncated or one.truncated
        sink.timed_out = sink.timed_out or one.timed_out
        if one.error:
            errors.append(f"pid {pid}: {one.error}")
    if errors:
        sink.fail("; ".join(errors))


RDMA_COMMANDS = (
    ("ibstat", "ibstat.txt", ("ibstat",)),
    ("ibv_devinfo", "ibv_devinfo.txt", ("ibv_devinfo", "-v")),
    ("rdma-link", "rdma-link.txt", ("rdma", "-d", "link", "show")),
)
"""The RDMA tools whose output joins the bundle where they are installed (source, file,
argv): ``ibstat`` (infiniband-diags), ``ibv_devinfo -v`` (ibverbs-utils), ``rdma link``
(iproute2)."""


def rdma_sysfs(root: str, sink: Sink, deadline: float = 0.0) -> None:
    """Every RDMA port's state, rate and counters (``counters/*`` and ``hw_counters/*``)
    as the kernel shows them under ``<root>/class/infiniband``, as JSON."""
    import dataclasses

    from slurmhealth.rdma.sysfs import read_rdma

    rdma = read_rdma(root)
    if rdma.error:
        sink.fail(rdma.error)
    data = json.dumps(dataclasses.asdict(rdma), indent=1, default=str) + "\n"
    if not sink.write(data.encode()):
        sink.fail(f"RDMA counters over {sink.cap} bytes; cut")


def rdma_sources(
    cfg: Config, node: str, skipped: dict[str, str]
) -> list[tuple[str, str, Callable[[Any, float], None]]]:
    """The RDMA evidence as (source, file, run) for the capture (``run(task, deadline)``
    writes into ``task.out()``): the ports' sysfs state and counters, and the RDMA tools'
    output where they are installed (the missing ones in ``skipped``); none on a node
    without RDMA devices (``[rdma]``): nothing to capture, nothing skipped."""
    import functools
    import shutil

    if not cfg.has_rdma(node):
        return []
    root = cfg.rdma_root(node)
    out = [("rdma-sysfs", "rdma-sysfs.json", into_task(functools.partial(rdma_sysfs, root)))]
    for source, name, argv in RDMA_COMMANDS:
        found = shutil.which(argv[0])
        if not found:
            skipped[source] = f"{argv[0]} not found"
            continue
        command = functools.partial(run_command, [found, *argv[1:]])
        out.append((source, name, into_task(command)))
    return out


def into_task(read: Callable[..., object]) -> Callable[[Any, float], None]:
    """``read(sink, deadline)`` as the capture runs a source: into ``task.out()``."""

    def run(task: Any, deadline: float) -> None:
        read(task.out(), deadline)

    return run
