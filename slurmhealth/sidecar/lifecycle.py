"""Start a job's sidecar from the prolog (detached) and stop it from the epilog.

The prolog writes the sidecar's pid file itself, before it returns: a job that ends at once
(``sbatch --wrap true``) gets its epilog while the sidecar is still starting, and the
epilog must find it then. It also marks the sidecar's environment with the node's run
directory, so the epilog finds every sidecar of the job on the node even without a pid
file (overwritten by a second start, or never written on a full disk).
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import Any

from slurmhealth.config import Config
from slurmhealth.metrics.export_state import sidecar_alive as _is_our_sidecar
from slurmhealth.metrics.export_state import write_atomic
from slurmhealth.model_records import Job
from slurmhealth.sidecar.files import SidecarFiles, make_job_dir, release_job_dir

log = logging.getLogger("slurmhealth.sidecar")
LABELS_ENV = "SLURMHEALTH_SIDECAR_LABELS"
RUN_DIR_ENV = "SLURMHEALTH_SIDECAR_RUN_DIR"  # which node's sidecar this is (stop finds it)
KILL_WAIT_S = 0.5  # after SIGKILL, for the process to be gone
EXEC_WAIT_S = 1.0  # after the start, for its command line to show


def sidecar_launch(cfg: Config, job: Job) -> dict[str, Any]:
    """Make the job's task-metrics channel and say how to start its sidecar: ``cmd``, the
    ``env`` to add, the ``pid_file`` (the node agent hands this to the prolog's client,
    which starts it in slurmd's session, not the agent's service). Raises OSError."""
    files = SidecarFiles.of(cfg, job.node, job.job_id)
    make_job_dir(files.job_dir, job.uid, cfg.sidecar.job_dir_max_bytes)  # task channel
    cmd = [sys.executable, "-m", "slurmhealth", "sidecar", "--job", job.job_id]
    if job.gpus:
        cmd += ["--gpus", ",".join(map(str, job.gpus))]
    env = {LABELS_ENV: json.dumps(asdict(job)), RUN_DIR_ENV: files.run_dir}
    return {"cmd": cmd, "env": env, "pid_file": files.pid, "job_id": job.job_id}


def start_sidecar(cfg: Config, job: Job, env: Mapping[str, str] | None = None) -> int | None:
    """Launch ``slurmhealth sidecar`` in its own session, outliving the prolog (DESIGN.md
    section 4: verified with proctrack/linuxproc), with ``env`` (default: ours) and its
    launch's variables. Returns its pid; never raises."""
    files = SidecarFiles.of(cfg, job.node, job.job_id)
    try:
        launch = sidecar_launch(cfg, job)
        log_path = os.environ.get("SLURMHEALTH_LOG_FILE") or os.devnull
        env = {**(os.environ if env is None else env), **launch["env"]}
        cmd = launch["cmd"]
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
    try:  # before the job can end: the epilog reads it (the sidecar rewrites the same)
        write_atomic(files.run_dir, os.path.basename(files.pid), f"{proc.pid}\n".encode(), 0o644)
    except OSError as exc:  # the epilog still finds it by its environment
        log.warning("job %s: sidecar pid file not written: %s", job.job_id, exc)
    _until_recognisable(proc, job.job_id)
    return proc.pid


def _until_recognisable(proc: subprocess.Popen[bytes], job_id: str) -> None:
    """Wait (bounded) until the new process shows its command line: Popen returns while
    the kernel is still setting up the exec, with ``/proc/PID/cmdline`` empty, and an
    epilog right then would take the sidecar for a dead one."""
    deadline = time.monotonic() + EXEC_WAIT_S
    while not _is_our_sidecar(proc.pid, job_id) and proc.poll() is None:
        if time.monotonic() > deadline:
            log.warning("job %s: sidecar %d not recognisable after %g s", job_id, proc.pid,
                        EXEC_WAIT_S)  # fmt: skip
            return
        time.sleep(0.001)


def _record_death(cfg: Config, node: str, job_id: str, pid: int) -> None:
    """A ``sidecar_died`` event: its pid file is there, its process is not (SIGKILL, OOM
    killer, a crash). Writing it also ingests what the dead sidecar had buffered."""
    from slurmhealth.history import History, records

    message = f"sidecar {pid} died while the job ran (killed or crashed)"
    log.warning("job %s node %s: %s", job_id, node, message)
    row = {"ts": time.time(), "node": node, "job_id": job_id, "kind": "sidecar_died",
           "severity": "warn", "message": message}  # fmt: skip
    with History.for_node(cfg, node, busy_timeout_ms=1000) as history:
        history.write(records.batch([records.event(row)]))


def job_sidecars(job_id: str, run_dir: str, proc: str = "/proc") -> list[int]:
    """The sidecars of ``job_id`` that a prolog started for ``run_dir`` (this node's)."""
    needle = f"{RUN_DIR_ENV}={run_dir}".encode()
    found = []
    for entry in os.listdir(proc):
        if not entry.isdigit() or not _is_our_sidecar(int(entry), job_id, proc):
            continue
        try:
            with open(f"{proc}/{entry}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue  # gone since
    return sorted(found)


def _terminate(pids: list[int], job_id: str, grace_s: float) -> str:
    """SIGTERM ``pids``, ``grace_s`` for their final flush, then SIGKILL those left and
    wait (bounded) until they are gone. Returns what happened, for the log."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    left = _wait_gone(pids, job_id, grace_s)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    stuck = _wait_gone(left, job_id, KILL_WAIT_S)
    outcomes = []
    for pid in pids:
        if pid in stuck:
            outcomes.append(f"sidecar {pid} still there {KILL_WAIT_S:g} s after SIGKILL")
        elif pid in left:
            outcomes.append(f"sidecar {pid} killed after {grace_s:g} s")
        else:
            outcomes.append(f"sidecar {pid} stopped")
    if left:  # a sidecar that does not stop when asked: someone should look
        log.warning("job %s: %s", job_id, "; ".join(outcomes))
    return "; ".join(outcomes)


def _wait_gone(pids: list[int], job_id: str, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    left = [p for p in pids if _is_our_sidecar(p, job_id)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if _is_our_sidecar(p, job_id)]
    return left


def _read_pid(path: str) -> int:
    try:
        with open(path, encoding="ascii") as fh:
            return int(fh.read(32).strip() or 0)
    except (OSError, ValueError):
        return 0


def _sidecar_pids(cfg: Config, node: str, job_id: str) -> tuple[int, list[int]]:
    """The pid file's pid and every live sidecar of the job on this node."""
    files = SidecarFiles.of(cfg, node, job_id)
    pid = _read_pid(files.pid)
    pids = set(job_sidecars(job_id, files.run_dir))
    if pid and _is_our_sidecar(pid, job_id):
        pids.add(pid)
    return pid, sorted(pids)


def signal_sidecar(cfg: Config, node: str, job_id: str) -> str:
    """The epilog's part: SIGTERM the job's sidecars and return at once; they flush while
    the epilog decides, and the after-work (hooks/finish.py) waits for them with
    :func:`stop_sidecar`."""
    pid, pids = _sidecar_pids(cfg, node, job_id)
    for each in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGTERM)
    if pid in pids:  # ended by us, not dead: stop_sidecar still finds it by its environment
        with contextlib.suppress(FileNotFoundError):
            os.unlink(SidecarFiles.of(cfg, node, job_id).pid)
    return f"SIGTERM to sidecar {','.join(map(str, pids))}" if pids else "no live sidecar"


def stop_sidecar(cfg: Config, node: str, job_id: str) -> str:
    """Stop every sidecar of the job on this node (its pid file's, and any other the
    prolog started here: :func:`job_sidecars`): SIGTERM, ``stop_grace_s`` for the final
    flush, then SIGKILL. Then remove what they left, so the exporter drops the job's
    series at its next scrape. A pid file without its process is a dead sidecar: recorded
    as a ``sidecar_died`` event. Returns what happened, for the log."""
    files = SidecarFiles.of(cfg, node, job_id)
    pid, pids = _sidecar_pids(cfg, node, job_id)
    if pids:
        outcome = _terminate(pids, job_id, cfg.sidecar.stop_grace_s)
    elif pid:
        outcome = f"sidecar {pid} died before the epilog"
        _record_death(cfg, node, job_id, pid)
    else:
        outcome = "no sidecar"
    for path in (files.pid, files.export, *_leftovers(cfg, node, job_id)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a killed sidecar's series go with its file
    release_job_dir(files.job_dir)
    return outcome


def _leftovers(cfg: Config, node: str, job_id: str) -> list[str]:
    """What a killed sidecar may have left besides its pid and series files: half-written
    temporary files and dcgm-exporter job-mapping files that still name the job."""
    files = SidecarFiles.of(cfg, node, job_id)
    export_dir, job = os.path.dirname(files.export), glob.escape(job_id)
    found = glob.glob(os.path.join(glob.escape(export_dir), f".job-{job}.json.*.tmp"))
    found += glob.glob(f"{glob.escape(files.pid)}.tmp.*")
    found += glob.glob(os.path.join(glob.escape(files.run_dir), f".sidecar-{job}.pid.*.tmp"))
    return found + _mapping_files(cfg, node, job_id)


def _mapping_files(cfg: Config, node: str, job_id: str) -> list[str]:
    """The dcgm-exporter job-mapping files that still name the job (a killed sidecar's)."""
    if not cfg.sidecar.dcgm_job_mapping_dir:
        return []
    directory = cfg.expand(cfg.sidecar.dcgm_job_mapping_dir, node)
    try:
        names = [n for n in os.listdir(directory) if n.isdigit()]
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(directory, name)
        with contextlib.suppress(OSError), open(path, encoding="ascii", errors="replace") as fh:
            if fh.read(128).strip() == job_id:
                found.append(path)
    return found


def publish_final(cfg: Config, job: Job, gpus: Iterable[Mapping[str, Any]]) -> bool:
    """Serve the finished job's per-GPU stats (``gpus``: as ``NodeFacts.to_dict()`` holds
    them) through the node's exporter for ``metrics.final_linger_s`` (final_series); whether
    they were published. Never raises."""
    from slurmhealth.metrics.export_state import encode_families, remove_expired_finals, write_final
    from slurmhealth.metrics.final_series import families

    mc = cfg.metrics
    gpus = list(gpus)
    now = time.time()
    try:
        files = SidecarFiles.of(cfg, job.node, job.job_id)
        if not gpus or mc.final_linger_s <= 0:  # (the exporter's port may come from argv)
            remove_expired_finals(files.run_dir, mc.final_linger_s, now)  # (turned off?)
            return False
        fams = families(job, job.node, gpus, mc.job_labels)
        data = encode_families(fams, job.job_id, os.getpid(), now)
        write_final(files.run_dir, job.job_id, data, mc.final_linger_s, now)
    except Exception as exc:  # best effort, like the evidence: the epilog's verdict stands
        log.warning("the job's stats were not published for Prometheus: %s: %s",
                    type(exc).__name__, exc)  # fmt: skip
        return False
    return True
