"""A prolog the wrapper had to kill still leaves a record.

The prolog's own budget ends it well before the wrapper's timeout; should the wrapper kill
it anyway (a node so overloaded that even the fail-open could not be written), nothing
after the kill runs. So each prolog keeps a small marker in the node's run dir while it
runs (``prolog.<job>.inflight``: its pid, start and the stage it is in), and removes it on
the way out. The next prolog on the node turns every marker whose process is gone into a
``failopen`` check run naming the stage, written with its own record.

The markers are root's own files in the root-only run dir, opened without following
symlinks; a marker that is not ours, or not one, is left alone and never trusted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
import time
from typing import Any

log = logging.getLogger("slurmhealth.hooks")

_SUFFIX = ".inflight"
_MAX_BYTES = 4096
STALE_S = 60.0  # no prolog outlives the wrapper's timeout: an older marker's pid is reused


def _path(run_dir: str, job_id: str) -> str:
    return os.path.join(run_dir, f"prolog.{job_id}{_SUFFIX}")


class InFlight:
    """The marker of this prolog run (a no-op when the run dir is not usable)."""

    def __init__(self, run_dir: str, job_id: str, node: str) -> None:
        self.path = _path(run_dir, job_id)
        self.doc: dict[str, Any] = {
            "job_id": job_id, "node": node, "pid": os.getpid(), "started": time.time(),
            "stage": "start", "elapsed": 0.0,
        }  # fmt: skip
        self.fd: int | None = None
        self._width = 0
        try:
            os.makedirs(run_dir, mode=0o700, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(self.path, flags, 0o600)
            if os.fstat(fd).st_uid != os.geteuid():
                os.close(fd)
                raise PermissionError(f"{self.path} is not ours")
            self.fd = fd
            self.stage("start", 0.0)
        except OSError as exc:
            log.warning("prolog marker %s not written: %s", self.path, exc)

    def stage(self, stage: str, elapsed: float) -> None:
        if self.fd is None:
            return
        self.doc.update(stage=stage, elapsed=round(elapsed, 3))
        data = json.dumps(self.doc).encode()
        # rewritten in place, padded to the longest so far (JSON ignores the spaces):
        # no truncate, whose freed blocks made an ext4 write stall for milliseconds
        self._width = max(self._width, len(data))
        with contextlib.suppress(OSError):
            os.pwrite(self.fd, data.ljust(self._width), 0)

    def done(self) -> None:
        if self.fd is None:
            return
        os.close(self.fd)
        self.fd = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read(path: str) -> dict[str, Any] | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        doc = json.loads(os.read(fd, _MAX_BYTES))
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    return doc if isinstance(doc, dict) else None


def killed_runs(run_dir: str, backend: str) -> list[dict[str, Any]]:
    """``check_runs`` rows for the prologs of this node that were killed (their marker is
    left and their process gone); the markers are removed as they are read."""
    try:
        names = [n for n in os.listdir(run_dir) if n.startswith("prolog.") and n.endswith(_SUFFIX)]
    except OSError:
        return []
    rows = []
    for name in names:
        path = os.path.join(run_dir, name)
        doc = _read(path)
        if doc is None:
            continue
        try:
            pid, job_id = int(doc["pid"]), str(doc["job_id"])[:64]
            started, elapsed = float(doc["started"]), float(doc["elapsed"])
            stage, node = str(doc["stage"])[:64], str(doc["node"])[:128]
        except (TypeError, KeyError, ValueError, OverflowError):
            continue
        if pid <= 0 or pid == os.getpid() or (_alive(pid) and time.time() - started < STALE_S):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        rows.append({
            "run_id": os.urandom(16).hex(), "ts": started, "node": node, "job_id": job_id,
            "phase": "prolog", "gpus": [], "status": "failopen", "exit_code": 0,
            "duration_s": elapsed, "backend": backend,
            "error": f"fail open: killed by the prolog wrapper's timeout in stage {stage!r} "
                     f"({elapsed:.2f} s in); recorded by a later prolog",
        })  # fmt: skip
    return rows
