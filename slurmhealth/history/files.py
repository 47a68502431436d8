"""The history's files on disk: private to root and the admin group, never followed.

The database, its ``-wal``/``-shm``, the spool and the folder holding them are created
``root:<admin group>`` (folder 0750, files 0640), so a job's user can neither read them nor
plant anything beside them. Every file root opens here is opened with ``O_NOFOLLOW`` and
its owner checked: a symlink, a FIFO or a file owned by someone else is refused, loudly.
A folder that is not owned by us, or that others may write, is refused as a whole: anyone
could have planted or swapped the files in it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import threading
import time
from collections.abc import Iterator

log = logging.getLogger("slurmhealth.history")
DIR_MODE, FILE_MODE = 0o750, 0o640
# the fix, in the refusal of a folder anyone may write (/tmp, /dev/shm)
OWN_FOLDER = "give the history a folder of its own (--db /var/lib/slurmhealth/history/history.db)"


class UnsafeFile(OSError):
    """A file or folder of the history that root must not trust (the message names it)."""

    def __init__(self, path: str, why: str, fix: str = "") -> None:
        super().__init__(errno.EPERM, f"{path}: {why}; refused" + (f": {fix}" if fix else ""))
        self.path = path

    def __str__(self) -> str:  # the message alone, without OSError's "[Errno 1]"
        return str(self.strerror)


def admin_gid(group: str) -> int:
    """The gid of ``group`` (a name or a number), or -1 (leave the group as it is)."""
    if not group:
        return -1
    if group.isdigit():
        return int(group)
    import grp

    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        log.error("history: admin group %r does not exist; files keep their group", group)
        return -1


def _why_untrusted(st: os.stat_result, kind: str) -> str | None:
    """Why a file or folder with status ``st`` cannot be trusted by this process, or None."""
    if st.st_uid != os.geteuid():
        return f"{kind} owned by uid {st.st_uid}, not {os.geteuid()}"
    if st.st_mode & 0o022:
        return f"{kind} writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def check_dir(folder: str) -> None:
    """Raise :class:`UnsafeFile` unless ``folder`` is ours and only we may write it."""
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFile(folder, "not a folder")
    why = _why_untrusted(st, "folder")
    if why:
        raise UnsafeFile(folder, why, OWN_FOLDER if st.st_mode & 0o002 else "")


def make_dir(folder: str, gid: int) -> None:
    """Create ``folder`` (and its parents) ``0750`` with group ``gid``; then check it."""
    if not os.path.isdir(folder):
        os.makedirs(folder, mode=DIR_MODE, exist_ok=True)
        with contextlib.suppress(OSError):  # not ours to fix when made by someone else
            if gid >= 0:
                os.chown(folder, -1, gid)
            os.chmod(folder, DIR_MODE)
    check_dir(folder)


def _checked(fd: int, path: str) -> int:
    st = os.fstat(fd)
    why = None if stat.S_ISREG(st.st_mode) else "not a regular file"
    why = why or _why_untrusted(st, "file")
    if why:
        os.close(fd)
        raise UnsafeFile(path, why)
    return fd


def open_private(path: str, flags: int, gid: int = -1) -> int:
    """``os.open`` of a history file: never through a symlink, never a FIFO or device, only
    a regular file we own and only we may write. A file it creates is ``0640`` with group
    ``gid``. Raises :class:`UnsafeFile` (an ``OSError``) for anything else."""
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a FIFO must not hang us
    try:
        fd = os.open(path, flags, FILE_MODE)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFile(path, "a symlink") from None
        if exc.errno == errno.ENXIO:
            raise UnsafeFile(path, "a FIFO or socket") from None
        raise
    fd = _checked(fd, path)
    fix_file(fd, gid)
    return fd


def fix_file(fd: int, gid: int) -> None:
    """Make our file ``fd`` 0640 with group ``gid`` (a db made 0644 by an older version)."""
    st = os.fstat(fd)
    with contextlib.suppress(OSError):  # EPERM: a non-root run, not in the admin group
        if gid >= 0 and st.st_gid != gid:
            os.fchown(fd, -1, gid)
        if stat.S_IMODE(st.st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)


def prepare_db(path: str, gid: int) -> None:
    """Before sqlite opens ``path``: its folder made and checked, the file created (or
    fixed) private, as are an existing ``-wal``/``-shm`` (sqlite gives new ones the
    database's mode and owner). Raises ``OSError`` (:class:`UnsafeFile` when refused).

    None of the three is opened for reading or writing: closing such a descriptor drops
    every POSIX lock this process holds on the file, SQLite's included (its connections in
    other threads: a daemon's held connection, the agent's concurrent hooks). With the
    ``-shm`` lock gone, the next process to open the history takes itself for the first,
    truncates the ``-shm`` under this one's mapping (SIGBUS) and may write while this one
    does. An ``O_PATH`` descriptor holds no lock and drops none."""
    make_dir(os.path.dirname(path) or ".", gid)
    if not os.path.lexists(path):
        _create_private(path, gid)
    _fix_in_place(path, gid)
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            _fix_in_place(path + suffix, gid)


def _create_private(path: str, gid: int) -> None:
    """An empty ``path``, 0640 with group ``gid``, made under a private name and linked
    into place: no other thread can have opened (and locked) it while it is made."""
    tmp = f"{path}.new-{os.getpid()}-{threading.get_ident()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 FILE_MODE)  # fmt: skip
    try:
        fix_file(fd, gid)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass  # made meanwhile by another hook: theirs is checked like any other
    finally:
        os.unlink(tmp)


def _fix_in_place(path: str, gid: int) -> None:
    """:func:`open_private`'s checks and :func:`fix_file`'s fix through an ``O_PATH``
    descriptor (it refers to a symlink itself, and opens no FIFO)."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeFile(path, "a symlink")
        why = None if stat.S_ISREG(st.st_mode) else "not a regular file"
        why = why or _why_untrusted(st, "file")
        if why:
            raise UnsafeFile(path, why)
        through = f"/proc/self/fd/{fd}"  # fchmod/fchown refuse an O_PATH descriptor
        with contextlib.suppress(OSError):  # EPERM: a non-root run, not in the admin group
            if gid >= 0 and st.st_gid != gid:
                os.chown(through, -1, gid)
            if stat.S_IMODE(st.st_mode) != FILE_MODE:
                os.chmod(through, FILE_MODE)
    finally:
        os.close(fd)


def move_aside(path: str) -> str:
    """Rename a corrupt database (and its ``-wal``/``-shm``) to ``<path>.corrupt-<UTC
    time>``, kept for forensics; return the new name."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target, n = f"{path}.corrupt-{stamp}", 1
    while os.path.lexists(target):
        n += 1
        target = f"{path}.corrupt-{stamp}.{n}"
    os.rename(path, target)
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.rename(path + suffix, target + suffix)
    return target


@contextlib.contextmanager
def folder_lock(folder: str) -> Iterator[None]:
    """An exclusive ``flock`` on ``folder`` itself: one process at a time moves files."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
