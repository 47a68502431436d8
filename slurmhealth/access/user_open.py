"""Open files under a job's user's folders with that user's rights, as Slurm opens a job's
output files (DESIGN.md 5b).

Root following a user's path can be pointed anywhere: a job's NCCL-log folder made a
symlink to a root-only folder would have root list it. So the names are expanded (globs)
and opened by a short-lived child that runs as the job's uid, gid and groups; the child
hands the open file descriptors back over a Unix socket (``SCM_RIGHTS``) and the parent
checks each with :func:`slurmhealth.access.safe_read.check_fd` before reading (regular file, the
job's uid, at most a cap). Whatever the user could not open, the child cannot either.

The child is a fresh interpreter (``subprocess``, no fork of a threaded process), bounded
by a deadline and a file count; it is killed when the deadline passes. When the reader is
not root, or the job's uid is the reader's own, there are no rights to drop: the files are
opened in-process with the same flags.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

from slurmhealth.access.safe_read import OPEN_FLAGS

MAX_MSG = 8192
PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")  # tried when ours is not runnable

_CHILD = r"""
import glob, itertools, json, os, socket, sys
sock = socket.socket(fileno=int(sys.argv[1]))
req = json.loads(sock.recv(1 << 20))
flags, left = req["flags"], req["max"]
def send(name, fd=None, error=None):
    data = json.dumps({"path": name, "error": error}).encode()[:8000]
    socket.send_fds(sock, [data], [] if fd is None else [fd])
for item in req["items"]:
    names = itertools.islice(glob.iglob(item), left * 4) if glob.has_magic(item) else [item]
    for name in sorted(names)[:left]:
        try:
            fd = os.open(name, flags)
        except OSError as exc:
            send(name, error=exc.strerror or str(exc))
            continue
        send(name, fd)
        os.close(fd)
        left -= 1
    if left <= 0:
        break
"""


@dataclass(frozen=True)
class Rights:
    """Whose rights a user path is opened with (the job's user)."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()

    @classmethod
    def of(cls, uid: int, user: str = "") -> Rights:
        """The job's uid with its passwd entry's gid and its supplementary groups (an
        unknown uid: its own number as gid, no groups)."""
        try:
            pw = pwd.getpwnam(user) if user else pwd.getpwuid(uid)
            if pw.pw_uid != uid:
                pw = pwd.getpwuid(uid)
        except KeyError:
            return cls(uid, uid)
        try:
            groups = tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
        except OSError:
            groups = (pw.pw_gid,)
        return cls(uid, pw.pw_gid, groups)


@dataclass(frozen=True)
class Opened:
    """One name the child tried: its fd (the caller closes it), or why it did not open."""

    path: str
    fd: int | None
    error: str | None = None


def must_drop(rights: Rights | None) -> bool:
    """Whether opening as ``rights`` needs a child: we are root and they are not ours."""
    return rights is not None and os.geteuid() == 0 and rights.uid != 0


def open_paths(
    items: list[str], rights: Rights | None, *, max_files: int, timeout_s: float
) -> tuple[list[Opened], str | None]:
    """Each of ``items`` (a path, or a glob pattern expanded with the same rights) opened
    read-only, without following a final symlink, never blocking; at most ``max_files``
    opened. Returns what was tried and a one-line note when the child failed."""
    if not must_drop(rights):
        return _open_here(items, max_files), None
    assert rights is not None
    return _open_as(items, rights, max_files, timeout_s)


def _open_here(items: list[str], max_files: int) -> list[Opened]:
    import glob
    import itertools

    out: list[Opened] = []
    for item in items:
        names = [item]
        if glob.has_magic(item):
            names = list(itertools.islice(glob.iglob(item), max_files * 4))
        for name in sorted(names):
            if len([o for o in out if o.fd is not None]) >= max_files:
                return out
            try:
                out.append(Opened(name, os.open(name, OPEN_FLAGS)))
            except OSError as exc:
                out.append(Opened(name, None, exc.strerror or str(exc)))
    return out


def _start(child: socket.socket, rights: Rights) -> subprocess.Popen[bytes]:
    """The child, from the first interpreter the user may run (this one, wherever it is
    installed, else the system's: the child needs the standard library only)."""
    error: OSError | None = None
    for python in dict.fromkeys((os.path.realpath(sys.executable), *PYTHONS)):
        try:
            return subprocess.Popen(
                [python, "-I", "-S", "-c", _CHILD, str(child.fileno())],
                pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, user=rights.uid,
                group=rights.gid, extra_groups=list(rights.groups), cwd="/", env={},
                start_new_session=True,
            )  # fmt: skip
        except (PermissionError, FileNotFoundError) as exc:
            error = exc
    raise error or OSError("no Python interpreter to run the reader")


def _open_as(
    items: list[str], rights: Rights, max_files: int, timeout_s: float
) -> tuple[list[Opened], str | None]:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    out: list[Opened] = []
    note = None
    deadline = time.monotonic() + timeout_s
    try:
        proc = _start(child, rights)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        parent.close()
        return [], f"cannot start a reader as uid {rights.uid}: {exc}"
    finally:
        child.close()
    try:
        req = {"items": items, "max": max_files, "flags": OPEN_FLAGS}
        parent.sendall(json.dumps(req).encode())
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                note = f"reader as uid {rights.uid} did not finish in time"
                break
            parent.settimeout(left)
            try:
                data, fds, _flags, _addr = socket.recv_fds(parent, MAX_MSG, 1)
            except TimeoutError:
                continue
            if not data:
                break  # the child is done
            msg = json.loads(data)
            out.append(Opened(str(msg["path"]), fds[0] if fds else None, msg.get("error")))
    except (OSError, ValueError, KeyError) as exc:
        note = f"reader as uid {rights.uid} failed: {exc}"
    finally:
        parent.close()
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, 9)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1.0)
    return out, note
