"""The one way root reads a file a job's user could have touched (DESIGN.md 5b).

Summaries, manifests, bundle files, logs, step files, state files: anything under a folder
a job's user can write, or named by a job's user, is opened with ``O_NOFOLLOW`` (a planted
symlink is refused, not followed), ``O_NONBLOCK`` (a FIFO never stalls the reader) and
``O_NOCTTY``; the open file is checked with ``fstat`` to be a regular file (so
``/dev/zero`` or a device path reads nothing), optionally of a given owner and not
hard-linked, before one byte is read; at most a cap per kind is read. Whatever goes wrong
is one :class:`Unsafe` with a one-line reason, never a traceback, never a hang.

``tests/unit/test_safe_read.py`` greps the package for plain ``open()`` on such paths.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any

OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

# caps per kind of file (bytes); a file over its cap is refused whole (JSON) or cut (tails)
SUMMARY_MAX = 16 << 20  # a node's summary.json: ~100 KiB for 8 GPUs and a day of events
MANIFEST_MAX = 4 << 20  # manifest.json: a few hundred entries
STATE_MAX = 8 << 20  # a sidecar's state file (metrics.max_state_bytes caps it tighter)
HASH_MAX = 1 << 30  # a bundle file hashed to check the manifest (its writer capped it)
_CHUNK = 1 << 20


class Unsafe(Exception):
    """A file that was not read: a symlink, FIFO, device, another owner's, too big,
    unreadable or not parseable. ``str()`` is one line naming the path."""


def open_checked(
    path: str,
    *,
    dir_fd: int | None = None,
    uid: int | None = None,
    single_link: bool = False,
    label: str | None = None,
) -> tuple[int, os.stat_result]:
    """An fd of the regular file ``path`` (relative to ``dir_fd`` when given) and its
    ``fstat``; raises :class:`Unsafe` (naming ``label``, default ``path``). ``uid``: it
    must be owned by that uid; ``single_link``: not hard-linked (a link to a file
    elsewhere). The caller closes."""
    label = label or path
    try:
        fd = os.open(path, OPEN_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise Unsafe(f"cannot open {label}: {exc.strerror or exc}") from None
    try:
        st = check_fd(fd, label, uid=uid, single_link=single_link)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def check_fd(
    fd: int, path: str, *, uid: int | None = None, single_link: bool = False
) -> os.stat_result:
    """``fstat`` of an open file, raising :class:`Unsafe` unless it passes the checks of
    :func:`open_checked` (for fds opened elsewhere, e.g. by a child with a user's rights)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise Unsafe(f"{path} is not a regular file")
    if uid is not None and st.st_uid != uid:
        raise Unsafe(f"{path} belongs to uid {st.st_uid}, not uid {uid}")
    if single_link and st.st_nlink != 1:
        raise Unsafe(f"{path} has {st.st_nlink} hard links")
    return st


def read_fd(fd: int, st: os.stat_result, path: str, cap: int, *, tail: bool = False) -> bytes:
    """The file's bytes up to its size at ``fstat`` time: all of them when at most ``cap``,
    else the last ``cap`` (``tail``) or :class:`Unsafe`."""
    size = st.st_size
    if size > cap and not tail:
        raise Unsafe(f"{path} is {size} bytes, over the {cap}-byte limit for it")
    start = max(0, size - cap)
    parts, off = [], start
    try:
        while off < size:  # a file that still grows is read up to its size at open
            chunk = os.pread(fd, min(_CHUNK, size - off), off)
            if not chunk:
                break
            parts.append(chunk)
            off += len(chunk)
    except OSError as exc:
        raise Unsafe(f"cannot read {path}: {exc.strerror or exc}") from None
    return b"".join(parts)


def read_bytes(
    path: str,
    cap: int,
    *,
    dir_fd: int | None = None,
    uid: int | None = None,
    tail: bool = False,
    single_link: bool = False,
) -> bytes:
    """The regular file ``path`` (see :func:`open_checked`), at most ``cap`` bytes."""
    fd, st = open_checked(path, dir_fd=dir_fd, uid=uid, single_link=single_link)
    try:
        return read_fd(fd, st, path, cap, tail=tail)
    finally:
        os.close(fd)


def read_json(path: str, cap: int, *, dir_fd: int | None = None, uid: int | None = None) -> Any:
    """The JSON document in ``path`` (whole, at most ``cap`` bytes); :class:`Unsafe` with
    a one-line reason when it cannot be read or parsed."""
    data = read_bytes(path, cap, dir_fd=dir_fd, uid=uid)
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise Unsafe(f"{path}: not JSON ({str(exc).splitlines()[0][:120]})") from None


def read_json_or_none(path: str, cap: int, notes: list[str] | None = None) -> Any:
    """:func:`read_json`, None on any failure (its reason appended to ``notes``)."""
    try:
        return read_json(path, cap)
    except Unsafe as exc:
        if notes is not None and os.path.lexists(path):
            notes.append(str(exc))
        return None
