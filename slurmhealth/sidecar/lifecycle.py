"""Start a job's sidecar from the prolog (detached) and stop it from the epilog."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict

from slurmhealth.config import Config
from slurmhealth.export_state import sidecar_alive as _is_our_sidecar
from slurmhealth.model import Job
from slurmhealth.sidecar.run import SidecarFiles

log = logging.getLogger("slurmhealth.sidecar")
LABELS_ENV = "SLURMHEALTH_SIDECAR_LABELS"


def start_sidecar(cfg: Config, job: Job) -> int | None:
    """Launch ``slurmhealth sidecar`` in its own session, outliving the prolog (DESIGN.md
    section 4: verified with proctrack/linuxproc). Returns its pid; never raises."""
    files = SidecarFiles.of(cfg, job.node, job.job_id)
    try:
        os.makedirs(files.job_dir, mode=0o700, exist_ok=True)  # the task-metrics channel
        if job.uid is not None:
            os.chown(files.job_dir, job.uid, -1)
        log_path = os.environ.get("SLURMHEALTH_LOG_FILE") or os.devnull
        env = {**os.environ, LABELS_ENV: json.dumps(asdict(job))}
        cmd = [sys.executable, "-m", "slurmhealth", "sidecar", "--job", job.job_id]
        if job.gpus:
            cmd += ["--gpus", ",".join(map(str, job.gpus))]
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                close_fds=True,
                env=env,
                cwd="/",
            )
    except OSError as exc:
        log.warning("job %s: sidecar not started: %s", job.job_id, exc)
        return None
    return proc.pid


def _record_death(cfg: Config, node: str, job_id: str, pid: int) -> None:
    """A ``sidecar_died`` event: its pid file is there, its process is not (SIGKILL, OOM
    killer, a crash). Writing it also ingests what the dead sidecar had buffered."""
    from slurmhealth.history import Batch, History

    message = f"sidecar {pid} died while the job ran (killed or crashed)"
    log.warning("job %s node %s: %s", job_id, node, message)
    row = {"ts": time.time(), "node": node, "job_id": job_id, "kind": "sidecar_died",
           "severity": "warn", "message": message}  # fmt: skip
    with History.for_node(cfg, node, busy_timeout_ms=1000) as history:
        history.write(Batch(inserts=[("events", row)]))


def stop_sidecar(cfg: Config, node: str, job_id: str) -> str:
    """SIGTERM the job's sidecar, give it ``stop_grace_s`` for its final flush, then
    SIGKILL; remove whatever it left. A pid file without its process is a dead sidecar:
    recorded as a ``sidecar_died`` event. Returns what happened, for the log."""
    files = SidecarFiles.of(cfg, node, job_id)
    outcome = "no sidecar"
    try:
        with open(files.pid, encoding="ascii") as fh:
            pid = int(fh.read().strip() or 0)
    except (OSError, ValueError):
        pid = 0
    if pid and _is_our_sidecar(pid, job_id):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + cfg.sidecar.stop_grace_s
        while time.monotonic() < deadline and _is_our_sidecar(pid, job_id):
            time.sleep(0.05)
        if _is_our_sidecar(pid, job_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            outcome = f"sidecar {pid} killed after {cfg.sidecar.stop_grace_s:g} s"
        else:
            outcome = f"sidecar {pid} stopped"
    elif pid:
        outcome = f"sidecar {pid} died before the epilog"
        _record_death(cfg, node, job_id, pid)
    for path in (files.pid, files.export):  # a killed sidecar's series go with its file
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    shutil.rmtree(files.job_dir, ignore_errors=True)
    return outcome
