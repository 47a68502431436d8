"""Where the kernel-log reader stopped: decoding a stored position, choosing the newer of
two copies, and the root-owned state file that keeps a copy outside the history.

A position is the JSON-able cursor of :class:`~slurmhealth.kernel_log.sources.KernelLogReader`:
``{"source": "kmsg", "boot_id": ..., "seq": ...}`` and the like, plus ``saved`` (UTC seconds
of the read that produced it) and, while a rebuilt position is still catching up, ``old_before``
(UTC seconds: records logged before it predate the position). Anything else -- wrong types,
a number where a string belongs, garbage JSON -- is unreadable (``None``), never an exception.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
from typing import Any

SCHEMA = "slurmhealth.kernel-position/1"
STATE_SUFFIX = ".kernel-position.json"
_MAX_BYTES = 64 * 1024
_MAX_INT = 2**63 - 1
_MAX_STR = 4096
REFRESH_S = 3600.0  # the state file is rewritten at least this often while the log moves

# per source: field -> (kind, required); kinds: "str", "int" (>= -1), "uint" (>= 0)
_FIELDS: dict[str, dict[str, tuple[str, bool]]] = {
    "kmsg": {"boot_id": ("str", True), "seq": ("int", True)},
    "dmesg": {"boot_id": ("str", True), "usec": ("int", True), "n_at": ("uint", True)},
    "journalctl": {"cursor": ("str", False)},
    "file": {
        "path": ("str", True),
        "inode": ("uint", True),
        "dev": ("uint", True),
        "offset": ("uint", True),
        "line": ("uint", True),
        "seq": ("uint", False),
    },
}
_TIMES = ("saved", "old_before")


def _valid(kind: str, value: Any) -> bool:
    if kind == "str":
        return isinstance(value, str) and 0 < len(value) <= _MAX_STR and "\0" not in value
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return (-1 if kind == "int" else 0) <= value <= _MAX_INT


def _time(value: Any) -> bool:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return ok and math.isfinite(value) and 0 <= value < 1e11


def decode(value: Any) -> dict[str, Any] | None:
    """The position ``value`` holds, with only the known keys, or ``None`` when it is not a
    readable position (any malformed field makes the whole position unreadable)."""
    if not isinstance(value, dict):
        return None
    fields = _FIELDS.get(value["source"]) if isinstance(value.get("source"), str) else None
    if fields is None:
        return None
    out: dict[str, Any] = {"source": value["source"]}
    for key, (kind, required) in fields.items():
        v = value.get(key)
        if v is None and not required:
            out[key] = None
        elif _valid(kind, v):
            out[key] = v
        else:
            return None
    for key in _TIMES:
        if value.get(key) is not None:
            if not _time(value[key]):
                return None
            out[key] = float(value[key])
    return out


def _journal_progress(cursor: Any) -> tuple[str, int] | None:
    """journald cursors read ``s=<seqnum id>;i=<seqnum hex>;b=...``: order within one id."""
    if not isinstance(cursor, str):
        return None
    parts = dict(p.split("=", 1) for p in cursor.split(";") if "=" in p)
    try:
        return parts["s"], int(parts["i"], 16)
    except (KeyError, ValueError):
        return None


def _progress(pos: dict[str, Any]) -> tuple[tuple[Any, ...], tuple[int, ...]] | None:
    """(the stream a position is in, how far along it is), or None if not comparable."""
    src = pos["source"]
    if src == "kmsg":
        return (src, pos["boot_id"]), (pos["seq"],)
    if src == "dmesg":
        return (src, pos["boot_id"]), (pos["usec"], pos["n_at"])
    if src == "file":
        return (src, pos["path"], pos["inode"], pos["dev"]), (pos["offset"],)
    jp = _journal_progress(pos.get("cursor"))
    return None if jp is None else ((src, jp[0]), (jp[1],))


def newest(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    """The newer of two decoded positions: in the same stream (same boot, same file) the one
    further along; otherwise the one saved later; on a tie ``a``."""
    if a is None or b is None:
        return b if a is None else a
    pa, pb = _progress(a), _progress(b)
    if pa is not None and pb is not None and pa[0] == pb[0]:
        return b if pb[1] > pa[1] else a
    sa, sb = a.get("saved"), b.get("saved")
    return b if sb is not None and (sa is None or sb > sa) else a


def still_good(kept: dict[str, Any] | None, new: dict[str, Any] | None, quiet: bool) -> bool:
    """Whether the state file's ``kept`` position may stand in for ``new`` (so the file need
    not be rewritten, an fsync saved on most runs): the same stream, at most ``REFRESH_S``
    behind, and only ``quiet`` records (no fault lines) read since it."""
    if kept is None or new is None or not quiet or "old_before" in new:
        return False
    pk, pn = _progress(kept), _progress(new)
    if pk is None or pn is None or pk[0] != pn[0] or pk[1] > pn[1]:
        return False
    return float(new.get("saved") or 0.0) - float(kept.get("saved") or 0.0) < REFRESH_S


def state_path(db_path: str) -> str | None:
    """The state file that keeps the position next to the history ``db_path`` (in the same
    root-owned directory), or None for an in-memory history."""
    if not db_path or db_path == ":memory:" or db_path.startswith("file:"):
        return None
    return db_path + STATE_SUFFIX


def _unsafe(st: os.stat_result) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not {os.geteuid()}"
    if st.st_mode & 0o022:
        return f"writable by others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def load(path: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the position in the state file ``path``, None) or (None, why it was ignored); a missing
    file is (None, None). Never follows a symlink; the file must be ours and not writable by
    anyone else."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        why = "a symlink" if os.path.islink(path) else (e.strerror or str(e))
        return None, f"kernel-log state file {path} ignored: {why}"
    try:
        problem = _unsafe(os.fstat(fd))
        data = b"" if problem else os.read(fd, _MAX_BYTES + 1)
    except OSError as e:
        problem = e.strerror or str(e)
    finally:
        os.close(fd)
    if problem is None and len(data) > _MAX_BYTES:
        problem = f"larger than {_MAX_BYTES} bytes"
    if problem is None:
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            obj = None
        pos = decode(obj.get("position")) if isinstance(obj, dict) else None
        if pos is not None:
            return pos, None
        problem = "not a readable kernel-log position"
    return None, f"kernel-log state file {path} ignored: {problem}"


def save(path: str, position: dict[str, Any]) -> str | None:
    """Write ``position`` to the state file ``path`` atomically (a new file beside it, never
    following a symlink, fsync'ed, renamed over); return why it failed, or None."""
    directory, name = os.path.split(path)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    data = json.dumps({"schema": SCHEMA, "position": position}, sort_keys=True).encode()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)  # replaces a symlink itself, never its target
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return f"cannot write kernel-log state file {path}: {e.strerror or e}"
    return None
