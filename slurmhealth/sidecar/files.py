"""Where a job's sidecar leaves traces on the node, and how it writes them: imported by
the prolog to start the sidecar and by the epilog to stop it, so it stays small."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from slurmhealth.config import Config


@dataclass(frozen=True)
class SidecarFiles:
    """Where a job's sidecar leaves traces on the node (all removed when it stops)."""

    pid: str
    export: str  # the job's series for the exporter (export_state)
    job_dir: str
    run_dir: str

    @classmethod
    def of(cls, cfg: Config, node: str, job_id: str) -> SidecarFiles:
        from slurmhealth.metrics.export_state import state_path

        run = cfg.expand(cfg.paths.run_dir, node)
        return cls(
            pid=os.path.join(run, f"sidecar-{job_id}.pid"),
            export=state_path(run, job_id),
            job_dir=os.path.join(run, "jobs", job_id),
            run_dir=run,
        )


def write_atomic(path: str, text: str) -> None:
    """``text`` into ``path`` whole or not at all; no temporary file left behind (a full
    disk) and none followed (``O_EXCL`` never opens a planted symlink)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # left by an earlier process with our pid
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        try:
            data = text.encode()
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, f"short write to {tmp}")
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# -- the job's step folder (the task channel), written by the job's user, on /run (RAM) -----

_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_MNT_DETACH = 2


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def make_job_dir(path: str, uid: int | None, max_bytes: int) -> str:
    """Create the job's step folder for ``uid`` and bound it: a tmpfs of ``max_bytes``
    mounted there (nosuid, nodev, noexec; the kernel refuses writes past it), else a plain
    folder the sidecar's reader keeps under ``max_bytes`` (:func:`sweep`). Returns which."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    if uid is not None and os.geteuid() == 0 and not os.path.ismount(path):
        opts = f"size={max(4096, max_bytes)},mode=0700,uid={uid},nr_inodes=4096".encode()
        flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        with contextlib.suppress(OSError, AttributeError):
            if _libc().mount(b"tmpfs", path.encode(), b"tmpfs", flags, opts) == 0:
                return "tmpfs"
    if uid is not None:
        os.chown(path, uid, -1)
    return "plain"


def release_job_dir(path: str) -> None:
    """Unmount the step folder's tmpfs (when it has one) and remove the folder."""
    import shutil

    if os.path.ismount(path):
        with contextlib.suppress(OSError, AttributeError):
            _libc().umount2(path.encode(), _MNT_DETACH)
    shutil.rmtree(path, ignore_errors=True)


def sweep(dir_fd: int, keep: set[str], max_bytes: int) -> int:
    """Keep the folder under ``max_bytes`` (for a folder without its own tmpfs): when the
    files in it take more, everything but the followed rank files ``keep`` goes, then
    the rank files are emptied (their writers append, so they go on at the start). Never
    follows a link (unlink and ``rmtree(dir_fd=)`` act on the names). Returns bytes freed."""
    import shutil

    sizes: dict[str, tuple[int, bool]] = {}
    with os.scandir(dir_fd) as entries:
        for n, entry in enumerate(entries):
            if n >= 65536:
                break
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                sizes[entry.name] = (st.st_blocks * 512, entry.is_dir(follow_symlinks=False))
    total = sum(size for size, _ in sizes.values())
    if total <= max_bytes:
        return 0
    freed = 0
    for name, (size, is_dir) in sorted(sizes.items(), key=lambda kv: kv[0] in keep):
        if name in keep and total - freed <= max_bytes:
            break  # the rest only when the rank files alone are over
        with contextlib.suppress(OSError):
            if name in keep:
                truncate(dir_fd, name, None)
            elif is_dir:
                shutil.rmtree(name, dir_fd=dir_fd)
            else:
                os.unlink(name, dir_fd=dir_fd)
            freed += size
    return freed


def truncate(dir_fd: int, name: str, read_to: tuple[int, int] | None) -> bool:
    """Empty the regular file ``name``; with ``read_to`` (inode, size) only while it is that
    file and has not grown since it was read (no step lost). True when emptied."""
    flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    fd = os.open(name, flags, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return False
        if read_to is not None and (st.st_ino, st.st_size) != read_to:
            return False
        os.ftruncate(fd, 0)
        return True
    finally:
        os.close(fd)
