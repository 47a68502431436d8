"""Where a job's sidecar leaves traces on the node, and how it writes them: imported by
the prolog to start the sidecar and by the epilog to stop it, so it stays small."""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

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
        from slurmhealth.export_state import state_path

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
