"""After a job, off its node's path: the epilog decides (drain or not, evidence or not) and
returns; what is left (the sidecar's final flush, the evidence bundle, the node's
``summary.json``, the published stats, retention, and on the job's first node its
AdminComment in slurmdbd) runs here, detached and bounded.

Journal: the epilog writes ``<run_dir>/pending/<job>.<node>.json`` (root-only: the folder
is 0700, the file 0600) before it detaches :func:`finish`; the worker holds an exclusive
``flock`` on it while it works and removes it when done. A worker killed (kill -9, OOM, a
crash) leaves the entry unlocked: the node agent's next start (or the next epilog on the
node) runs :func:`finish_pending`, which finishes every unlocked entry. Every step may run
twice (a capture rewrites its bundle, a summary and an AdminComment are overwritten).

The prolog leaves ``<job>.<node>.start.json``, its snapshot's sample rows: a job shorter
than one sample interval has no sidecar samples, and its summary is made of the prolog's
and the epilog's snapshots.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from slurmhealth.config import Config
from slurmhealth.model import NodeSnapshot
from slurmhealth.model_records import Job
from slurmhealth.slurm import SlurmBackend, expand_hostlist

if TYPE_CHECKING:
    from slurmhealth.history import History

log = logging.getLogger("slurmhealth.hooks")
VERSION = 1
ADMIN_COMMENT_TIMEOUT_S = 30.0  # the sacctmgr call, detached
_NAME = re.compile(r"([0-9]{1,12}(?:[_+][0-9]{1,12})?)\.([A-Za-z0-9._-]{1,64})\.json")


@dataclass(frozen=True)
class Pending:
    """One job's work left after its epilog on one node (the journal entry)."""

    job: Job
    evidence_why: str = ""  # the epilog's reason for a full bundle; "" unless events show
    samples: list[dict[str, Any]] = field(default_factory=list)  # the epilog's snapshot
    ts: float = 0.0

    def to_json(self) -> bytes:
        return json.dumps({"version": VERSION, "job": asdict(self.job),
                           "evidence_why": self.evidence_why, "samples": self.samples,
                           "ts": self.ts}).encode()  # fmt: skip

    @staticmethod
    def from_json(data: bytes) -> Pending:
        raw = json.loads(data)
        job = dict(raw["job"])
        job["gpus"] = tuple(job.get("gpus") or ())
        return Pending(Job(**job), str(raw.get("evidence_why", "")),
                       list(raw.get("samples") or []), float(raw.get("ts", 0.0)))  # fmt: skip


def pending_dir(cfg: Config, node: str) -> str:
    return os.path.join(cfg.expand(cfg.paths.run_dir, node), "pending")


def _own_dir(cfg: Config, node: str) -> str:
    path = pending_dir(cfg, node)
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise OSError(f"{path} is not ours alone (owner {st.st_uid}, mode {st.st_mode & 0o777:o})")
    return path


def _write(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def record_start(cfg: Config, job: Job, snapshot: NodeSnapshot) -> None:
    """The prolog's snapshot, for a job too short for the sidecar; never raises."""
    from slurmhealth.history.rows import sample_rows

    try:
        path = os.path.join(_own_dir(cfg, job.node), f"{job.job_id}.{job.node}.start.json")
        _write(path, json.dumps(sample_rows(snapshot, job.job_id)).encode())
    except (OSError, ValueError) as exc:
        log.warning("the job's start snapshot was not kept: %s", exc)


def journal(cfg: Config, job: Job, evidence_why: str, snapshot: NodeSnapshot | None) -> str:
    """Write the job's journal entry (durable before the epilog returns); its path."""
    from slurmhealth.history.rows import sample_rows

    samples = sample_rows(snapshot, job.job_id) if snapshot is not None else []
    path = os.path.join(_own_dir(cfg, job.node), f"{job.job_id}.{job.node}.json")
    _write(path, Pending(job, evidence_why, samples, time.time()).to_json())
    return path


def detach(path: str) -> int | None:
    """Start ``slurmhealth epilog-finish PATH`` in its own session, niced, outliving the
    epilog; its pid, or None (the entry stays for :func:`finish_pending`)."""
    from slurmhealth.hooks.wrapper_log import child_env

    log_path = os.environ.get("SLURMHEALTH_LOG_FILE") or os.devnull
    cmd = [sys.executable, "-m", "slurmhealth", "epilog-finish", path]
    try:
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    start_new_session=True, close_fds=True, cwd="/",
                                    env=child_env(os.environ))  # fmt: skip
    except OSError as exc:
        log.warning("the job's after-work was not started (%s): the agent finishes it", exc)
        return None
    return proc.pid


@contextlib.contextmanager
def _locked(path: str) -> Iterator[int | None]:
    """The entry's fd under an exclusive lock; None when another worker holds it or it is
    gone (finished since)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            yield None
            return
        try:  # the same file still (not finished and replaced since we opened it)
            same = os.path.samestat(os.fstat(fd), os.lstat(path))
        except OSError:
            same = False
        yield fd if same else None
    finally:
        os.close(fd)


def finish(
    cfg: Config,
    path: str,
    slurm: SlurmBackend | None = None,
    wait_s: float | None = None,
) -> str:
    """Do one journal entry's work and remove it; what happened, for the log."""
    with _locked(path) as fd:
        if fd is None:
            return "busy or done"
        with open(f"/proc/self/fd/{fd}", "rb") as fh:
            entry = Pending.from_json(fh.read(1 << 24))
        done = _work(cfg, entry, slurm, wait_s)
        for name in (path, path[: -len(".json")] + ".start.json"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)
        return done


def _work(cfg: Config, entry: Pending, slurm: SlurmBackend | None, wait_s: float | None) -> str:
    from slurmhealth.history import History
    from slurmhealth.history.retention import prune_quietly
    from slurmhealth.slurm import open_slurm

    job = entry.job
    steps = []
    if cfg.sidecar.enabled:
        from slurmhealth.sidecar.lifecycle import stop_sidecar

        steps.append(stop_sidecar(cfg, job.node, job.job_id))
    backend = slurm or open_slurm(cfg.slurm.backend, cfg.slurm.command_timeout_s)
    with History.for_node(cfg, job.node, busy_timeout_ms=5000) as history:
        steps.append(_short_job_samples(cfg, history, entry))
        written = evidence(cfg, job, backend, entry.evidence_why)
        prune_quietly(history, cfg)
    if written is not None and cfg.sidecar.enabled:
        from slurmhealth.sidecar.lifecycle import publish_final

        publish_final(cfg, job, written.summary["gpus"])
    steps.append(_admin_comment(cfg, job, backend, wait_s))
    return "; ".join(s for s in steps if s)


def _start_rows(cfg: Config, job: Job) -> list[dict[str, Any]]:
    path = os.path.join(pending_dir(cfg, job.node), f"{job.job_id}.{job.node}.start.json")
    try:
        with open(path, "rb") as fh:
            rows = json.loads(fh.read(1 << 24))
    except (OSError, ValueError):
        return []
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _short_job_samples(cfg: Config, history: History, entry: Pending) -> str:
    """A job the sidecar never sampled gets the prolog's and the epilog's snapshots."""
    from slurmhealth.history import records
    from slurmhealth.history.read import Reader, StoreError, job_row_counts

    job = entry.job
    try:
        with Reader(cfg.db_path(job.node)) as db:
            if job_row_counts(db, job.job_id, job.node)["samples"]:
                return ""
    except (StoreError, OSError):
        pass
    rows = [r for r in (*_start_rows(cfg, job), *entry.samples) if r.get("job_id") == job.job_id]
    if not rows:
        return ""
    history.write(records.batch(records.sample(r) for r in rows))
    return f"{len(rows)} samples from the prolog's and epilog's snapshots (a short job)"


def evidence(cfg: Config, job: Job, slurm: SlurmBackend, why: str) -> Any:
    """The full bundle when the epilog asked for one (``why``) or the sidecar recorded
    events, and always the node's summary.json; what :func:`write_summary` wrote, or None.
    Never raises: evidence is best effort, the epilog's verdict stands."""
    from slurmhealth.evidence.capture import capture
    from slurmhealth.evidence.summary import write_summary

    bundle_dir = None
    try:
        if not why and _job_had_events(cfg, job):
            why = "findings or events during the job"
        if why:
            record = slurm.show_job(job.job_id)
            result = capture(cfg, job.job_id, job.node, reason=why, gpus=job.gpus,
                             user=job.user, uid=job.uid, end_ts=time.time(),
                             stdout_path=record.get("StdOut") or None,
                             stderr_path=record.get("StdErr") or None,
                             budget_s=cfg.evidence.budget_s)  # fmt: skip
            bundle_dir = result.dir
            log.info("evidence: %s (%d files, %.2f s)", result.dir, len(result.files),
                     result.elapsed_s)  # fmt: skip
        return write_summary(cfg, job.job_id, job.node, bundle_dir=bundle_dir, uid=job.uid)
    except Exception as exc:
        log.warning("evidence capture failed: %s: %s", type(exc).__name__, exc)
        return None


def _job_had_events(cfg: Config, job: Job) -> bool:
    from slurmhealth.history.read import Reader, StoreError, job_had_events

    try:
        with Reader(cfg.db_path(job.node)) as db:
            return job_had_events(db, job.job_id)
    except StoreError:
        return False


def _admin_comment(cfg: Config, job: Job, slurm: SlurmBackend, wait_s: float | None) -> str:
    """On the job's first node: the job's summary into its AdminComment (slurmdbd), once
    every node's summary is there (bounded). ``sacctmgr modify job`` works on a finished
    job; EpilogSlurmctld is not needed for it."""
    from slurmhealth.hooks.ctld_epilog import WAIT_S, run_ctld_epilog
    from slurmhealth.slurm import SlurmCli

    nodes = expand_hostlist(job.nodes) if job.nodes else (job.node,)
    if nodes and nodes[0] != job.node:
        return ""
    if not cfg.report.admin_comment or not isinstance(slurm, SlurmCli):
        return ""
    env = {"SLURM_JOB_ID": job.job_id, "SLURM_JOB_NODELIST": job.nodes or job.node}
    if slurm.timeout_s < ADMIN_COMMENT_TIMEOUT_S:  # off the job's path: slurmdbd may be slow
        slurm = SlurmCli(ADMIN_COMMENT_TIMEOUT_S)
    try:
        result = run_ctld_epilog(cfg, env, slurm, WAIT_S if wait_s is None else wait_s)
    except Exception as exc:  # fail open, loudly
        log.error("no job summary stored: %s: %s", type(exc).__name__, exc)
        return "AdminComment not stored"
    if not result.stored:
        log.error("no job summary stored: %s", result.why)
        return "AdminComment not stored"
    return f"AdminComment stored ({result.chars} characters)"


def entries(cfg: Config, node: str) -> list[str]:
    """The node's journal entries, oldest first."""
    directory = pending_dir(cfg, node)
    try:
        names = [n for n in os.listdir(directory)
                 if _NAME.fullmatch(n) and not n.endswith(".start.json")]  # fmt: skip
    except OSError:
        return []

    def age(name: str) -> float:
        with contextlib.suppress(OSError):
            return os.lstat(os.path.join(directory, name)).st_mtime
        return 0.0

    return [os.path.join(directory, n) for n in sorted(names, key=age)]


def finish_pending(
    cfg: Config, node: str, run: Callable[[Config, str], str] | None = None
) -> dict[str, str]:
    """Finish every entry no live worker holds (after a crash, a kill, a reboot of the
    agent); path -> what happened. Never raises."""
    out = {}
    for path in entries(cfg, node):
        try:
            out[path] = (run or finish)(cfg, path)
        except Exception as exc:  # one bad entry never stops the others
            log.error("pending %s not finished: %s: %s", path, type(exc).__name__, exc)
            out[path] = f"error: {exc}"
    return out
