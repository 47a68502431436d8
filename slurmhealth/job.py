"""Report training progress to the slurmhealth sidecar: call :func:`step` once per step.

    from slurmhealth import job
    for batch in loader:
        ...
        job.step(samples=len(batch), tokens=n_tokens, flops=flops_per_step)

Standard library only, so it imports in any training environment. Each call appends one JSON
line to ``$SLURMHEALTH_JOB_DIR/steps-<rank>.jsonl`` (default dir
``/run/slurmhealth/jobs/$SLURM_JOB_ID``, created by the prolog; rank ``$RANK``, else
``$SLURM_PROCID``, else 0): one file per rank, so no cross-process locking. ``samples``,
``tokens`` and ``flops`` are what *this rank* processed in the step; ``comm_seconds`` and
``data_wait_seconds`` the parts of the step spent in communication and waiting for data.

It never raises into the training loop: when the directory is missing or not writable, or
the process does not run under Slurm, it prints one warning to stderr and turns itself off.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import IO, Any

__all__ = ["Recorder", "close", "flush", "step"]

DEFAULT_ROOT = "/run/slurmhealth/jobs"


def _number(value: Any) -> float | int | None:
    """A JSON-safe number from an int, float or anything with ``__float__`` (a tensor)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int) and -(2**63) <= value < 2**63:
        return value  # a longer int is written as a float (the reader drops 400 digits)
    try:
        f = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


def _rank(env: Mapping[str, str]) -> int:
    for var in ("RANK", "SLURM_PROCID"):
        text = env.get(var, "")
        if text.strip().isdigit():
            return int(text)
    return 0


def _job_dir(env: Mapping[str, str]) -> str | None:
    explicit = env.get("SLURMHEALTH_JOB_DIR", "")
    if explicit:
        return str(explicit)
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id:
        return None
    # the node's slurmhealth run_dir when it is not /run/slurmhealth (may hold {node})
    run_dir = env.get("SLURMHEALTH_RUN_DIR", "")
    if run_dir:
        node = env.get("SLURMD_NODENAME", "")
        return os.path.join(run_dir.replace("{node}", node), "jobs", job_id)
    return os.path.join(DEFAULT_ROOT, job_id)


class Recorder:
    """Appends one line per step to ``<job_dir>/steps-<rank>.jsonl`` (line-buffered).

    ``job_dir=None`` (or a missing / unwritable directory) disables the recorder after one
    warning on ``stderr``. A forked child never writes to its parent's file.
    """

    def __init__(self, job_dir: str | None, rank: int = 0, stderr: IO[str] | None = None):
        self.job_dir = job_dir
        self.rank = rank
        self.path = None if job_dir is None else os.path.join(job_dir, f"steps-{rank}.jsonl")
        self.disabled = False
        self._stderr = stderr
        self._fh: IO[str] | None = None
        self._pid = os.getpid()
        self._step = 0
        self._last: float | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Recorder:
        env = os.environ if env is None else env
        return cls(_job_dir(env), _rank(env))

    def _disable(self, why: str) -> None:
        self.disabled = True
        fh, self._fh = self._fh, None
        if fh is not None and os.getpid() == self._pid:
            with contextlib.suppress(Exception):
                fh.close()
        try:
            out = self._stderr or sys.stderr
            out.write(f"slurmhealth.job: step reporting off: {why}\n")
            out.flush()
        except Exception:
            pass

    def _open(self) -> IO[str] | None:
        if self._fh is not None:
            return self._fh
        if self.job_dir is None or self.path is None:
            self._disable("not running under Slurm (no SLURM_JOB_ID or SLURMHEALTH_JOB_DIR)")
            return None
        if not os.path.isdir(self.job_dir):
            self._disable(f"{self.job_dir} does not exist (no slurmhealth sidecar on this node?)")
            return None
        try:
            self._fh = open(self.path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        except OSError as exc:
            self._disable(f"cannot write {self.path}: {exc.strerror or exc}")
            return None
        return self._fh

    def step(
        self,
        samples: Any = None,
        tokens: Any = None,
        flops: Any = None,
        comm_seconds: Any = None,
        data_wait_seconds: Any = None,
        step: int | None = None,
    ) -> None:
        """Record one step; ``step_seconds`` is the time since the previous call (None for
        the first). ``step`` overrides the counter (e.g. after resuming from a checkpoint)."""
        if self.disabled or os.getpid() != self._pid:
            return
        try:
            with self._lock:
                mono, now = time.monotonic(), time.time()
                since = None if self._last is None else round(mono - self._last, 6)
                self._last = mono
                self._step = step if isinstance(step, int) else self._step + 1
                fh = self._open()
                if fh is None:
                    return
                record = {
                    "ts": round(now, 6),
                    "rank": self.rank,
                    "step": self._step,
                    "step_seconds": since,
                    "samples": _number(samples),
                    "tokens": _number(tokens),
                    "flops": _number(flops),
                    "comm_seconds": _number(comm_seconds),
                    "data_wait_seconds": _number(data_wait_seconds),
                }
                fh.write(json.dumps(record, separators=(",", ":")) + "\n")
        except Exception as exc:  # never into the training loop
            self._disable(f"cannot write {self.path}: {exc}")

    def flush(self) -> None:
        try:
            if self._fh is not None and os.getpid() == self._pid:
                self._fh.flush()
        except Exception as exc:
            self._disable(f"cannot flush {self.path}: {exc}")

    def close(self) -> None:
        fh, self._fh = self._fh, None
        try:
            if fh is not None and os.getpid() == self._pid:
                fh.close()
        except Exception:
            pass


_default: Recorder | None = None
_default_lock = threading.Lock()


def _recorder() -> Recorder:
    global _default
    rec = _default
    if rec is None:
        with _default_lock:
            if _default is None:
                _default = Recorder.from_env()
                atexit.register(_default.close)
            rec = _default
    return rec


def step(
    samples: Any = None,
    tokens: Any = None,
    flops: Any = None,
    comm_seconds: Any = None,
    data_wait_seconds: Any = None,
    step: int | None = None,
) -> None:
    """Record one training step of this rank (see the module docstring). Never raises."""
    with contextlib.suppress(Exception):
        _recorder().step(samples, tokens, flops, comm_seconds, data_wait_seconds, step)


def flush() -> None:
    """Push buffered lines to the file (lines are already written as they come)."""
    if _default is not None:
        _default.flush()


def close() -> None:
    """Close the file; the next :func:`step` reads the environment again and reopens it."""
    global _default
    rec, _default = _default, None
    if rec is not None:
        rec.close()
