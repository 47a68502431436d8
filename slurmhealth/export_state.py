"""How a job's sidecar hands its series to the node's one scrape target.

Each sidecar writes its current families as one JSON file, ``job-<id>.json``, in a
root-owned directory (``<run_dir>/export``, mode 0750), atomically (a new file, then
``rename``), never following a symlink. ``slurmhealth exporter`` reads the directory on each
scrape, bounded in file count and size, and keeps a job's series only while its file is
fresh and its sidecar alive: a job's series go with its file (the sidecar removes it when
it stops, the epilog when it stops the sidecar), with its sidecar's process (a crash), or
once the file is older than :func:`stale_after` (a hung sidecar).

A finished job leaves one more file, ``done-<id>.json`` (same format), written by its
epilog: the job's per-GPU stats (:mod:`slurmhealth.final_series`), served for
``Limits.linger_s`` after it was written and then removed (by the exporter, or by the next
epilog that publishes one).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slurmhealth import safe_read

if TYPE_CHECKING:  # not at import: the prolog imports this module to start a sidecar
    from prometheus_client.core import Metric

FORMAT = 1
_JOB_ID = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]{0,63}\Z")
_STATE_FILE = re.compile(r"job-([A-Za-z0-9_+-][A-Za-z0-9_.+-]{0,63})\.json\Z")
_FINAL_FILE = re.compile(r"done-([A-Za-z0-9_+-][A-Za-z0-9_.+-]{0,63})\.json\Z")
_PID_FILE = re.compile(r"sidecar-([A-Za-z0-9_+-][A-Za-z0-9_.+-]{0,63})\.pid\Z")


class UnsafeDir(OSError):
    """A directory root would write into or read from is not root's own."""


def state_dir(run_dir: str) -> str:
    return os.path.join(run_dir, "export")


def state_path(run_dir: str, job_id: str) -> str:
    if not _JOB_ID.match(job_id):
        raise ValueError(f"not a job id usable in a file name: {job_id!r}")
    return os.path.join(state_dir(run_dir), f"job-{job_id}.json")


def final_path(run_dir: str, job_id: str) -> str:
    """Where a finished job's stats are published (:func:`write_final`)."""
    if not _JOB_ID.match(job_id):
        raise ValueError(f"not a job id usable in a file name: {job_id!r}")
    return os.path.join(state_dir(run_dir), f"done-{job_id}.json")


def stale_after(interval_s: float) -> float:
    """A state file older than this is a hung sidecar's: two intervals, at least 5 s more
    than one (a scrape never sees a healthy job's series blink)."""
    return max(2.0 * interval_s, interval_s + 5.0)


def check_dir(path: str, *, create: bool) -> None:
    """``path`` is a real directory of ours, not writable by others (created 0750)."""
    if create:
        os.makedirs(path, mode=0o750, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDir(f"{path}: not a directory")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise UnsafeDir(f"{path}: owned by uid {st.st_uid} or writable by others")


def write_atomic(directory: str, name: str, data: bytes, mode: int = 0o640) -> None:
    """``directory/name`` replaced at once by ``data``: a new file written next to it (a
    name no collector reads: a dot, no ``.json``/``.prom`` end), then renamed."""
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, os.path.join(directory, name))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def encode(metrics: Iterable[Metric], job_id: str, pid: int, ts: float) -> bytes:
    """A sidecar's families as its state file holds them."""
    fams = [
        {
            "name": m.name,
            "type": m.type,
            "help": m.documentation,
            "samples": [[s.name, s.labels, s.value] for s in m.samples],
        }
        for m in metrics
    ]
    return encode_families(fams, job_id, pid, ts)


def encode_families(fams: list[dict[str, Any]], job_id: str, pid: int, ts: float) -> bytes:
    """Families already in the state file's form (``name``, ``type``, ``help``,
    ``samples`` as ``[name, labels, value]``)."""
    doc = {"format": FORMAT, "job_id": job_id, "pid": pid, "ts": ts, "families": fams}
    return json.dumps(doc, separators=(",", ":")).encode()


def write_state(run_dir: str, job_id: str, data: bytes) -> None:
    """Publish a job's state file (what the exporter serves for it)."""
    path = state_path(run_dir, job_id)
    check_dir(os.path.dirname(path), create=True)
    write_atomic(os.path.dirname(path), os.path.basename(path), data)


def write_final(run_dir: str, job_id: str, data: bytes, linger_s: float, now: float) -> None:
    """Publish a finished job's stats file, and remove the ones older than ``linger_s``."""
    path = final_path(run_dir, job_id)
    directory = os.path.dirname(path)
    check_dir(directory, create=True)
    write_atomic(directory, os.path.basename(path), data)
    remove_expired_finals(run_dir, linger_s, now, keep=os.path.basename(path))


def remove_expired_finals(run_dir: str, linger_s: float, now: float, keep: str = "") -> None:
    """Remove the finished jobs' stats files older than ``linger_s`` (all of them at 0): the
    node's exporter removes them too; the epilog does it so that the directory stays
    bounded without one, and after publishing was turned off."""
    directory = state_dir(run_dir)
    try:
        check_dir(directory, create=False)
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if _FINAL_FILE.match(name) and name != keep:
            old = os.path.join(directory, name)
            with contextlib.suppress(OSError):
                if now - os.lstat(old).st_mtime > linger_s:
                    os.unlink(old)


def remove_state(run_dir: str, job_id: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(state_path(run_dir, job_id))


def sidecar_alive(pid: int, job_id: str, proc: str = "/proc") -> bool:
    """Whether ``pid`` is the sidecar of ``job_id`` (not a recycled pid)."""
    try:
        with open(f"{proc}/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
    except OSError:
        return False
    return b"sidecar" in argv and job_id.encode() in argv


@dataclass
class JobStates:
    """What the export directory held at one scrape."""

    live: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # job -> families
    dead: set[str] = field(default_factory=set)  # the sidecar's process is gone
    stale: set[str] = field(default_factory=set)  # alive, but its file is too old
    skipped: int = 0  # files over the limits, unreadable, or not ours
    finished: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # done-<id>.json
    expired: list[str] = field(default_factory=list)  # done files older than linger_s
    finished_ts: dict[str, float] = field(default_factory=dict)  # when each was published


@dataclass(frozen=True)
class Limits:
    max_files: int = 256
    max_bytes: int = 8 * 1024 * 1024
    stale_s: float = 25.0
    linger_s: float = 0.0  # how long a finished job's stats file is served


def _read_one(path: str, limits: Limits) -> dict[str, Any] | None:
    try:  # gone since listdir, a symlink, not ours, over the limit, not JSON: skipped
        doc = safe_read.read_json(path, limits.max_bytes, uid=os.geteuid())
    except safe_read.Unsafe:
        return None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        return None
    if not isinstance(doc.get("families"), list) or not isinstance(doc.get("pid"), int):
        return None
    return doc


def read_states(run_dir: str, now: float | None = None, limits: Limits = Limits()) -> JobStates:
    """Every job's families from the export directory, and which sidecars are dead or
    stale (also those that left only their pid file in ``run_dir``)."""
    now = time.time() if now is None else now
    out = JobStates()
    directory = state_dir(run_dir)
    try:
        check_dir(directory, create=False)
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        names = []
    for name in names:
        m = _STATE_FILE.match(name)
        if m is None:
            continue
        if len(out.live) + len(out.finished) >= limits.max_files:
            out.skipped += 1
            continue
        job_id = m.group(1)
        doc = _read_one(os.path.join(directory, name), limits)
        if doc is None or doc.get("job_id") != job_id:
            out.skipped += 1
        elif not sidecar_alive(doc["pid"], job_id):
            out.dead.add(job_id)
        elif now - float(doc.get("ts", 0)) > limits.stale_s:
            out.stale.add(job_id)
        else:
            out.live[job_id] = doc["families"]
    out.dead |= _dead_pid_files(run_dir) - set(out.live) - out.stale
    for name in names:  # after every running job's: those come first within max_files
        if (done := _FINAL_FILE.match(name)) is not None:
            _read_final(os.path.join(directory, name), done.group(1), now, limits, out)
    # the newest first (should two files hold the same series, merged() keeps the first)
    out.finished = dict(sorted(out.finished.items(), key=lambda kv: -out.finished_ts[kv[0]]))
    return out


def _read_final(path: str, job_id: str, now: float, limits: Limits, out: JobStates) -> None:
    """A finished job's stats: served while younger than ``linger_s``, then expired."""
    if len(out.live) + len(out.finished) >= limits.max_files:
        out.skipped += 1
        return
    doc = _read_one(path, limits)
    ts = doc.get("ts") if doc is not None else None
    if doc is None or doc.get("job_id") != job_id or not isinstance(ts, int | float):
        out.skipped += 1
    elif not abs(now - ts) <= limits.linger_s:  # (NaN too)
        out.expired.append(path)
    else:
        out.finished[job_id] = doc["families"]
        out.finished_ts[job_id] = float(ts)


def _dead_pid_files(run_dir: str) -> set[str]:
    """Jobs whose ``sidecar-<id>.pid`` names a process that is not their sidecar."""
    dead = set()
    try:
        names = os.listdir(run_dir)
    except OSError:
        return set()
    for name in names:
        if (m := _PID_FILE.match(name)) is None:
            continue
        try:
            with open(os.path.join(run_dir, name), encoding="ascii") as fh:
                pid = int(fh.read(32).strip() or 0)
        except (OSError, ValueError):
            continue
        if not sidecar_alive(pid, m.group(1)):
            dead.add(m.group(1))
    return dead


def merged(families: Iterable[list[dict[str, Any]]]) -> list[Metric]:
    """Families of several jobs merged by name (one ``# TYPE`` line each); malformed
    entries are left out, and so is a sample whose name and labels an earlier job's has
    (``job_labels = "info"``: two jobs sharing a GPU, or an RDMA port, export the same
    series; a scrape may hold each once)."""
    from prometheus_client.core import Metric

    by_name: dict[str, Metric] = {}
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for fams in families:
        for fam in fams:
            try:
                name, mtype, doc = str(fam["name"]), str(fam["type"]), str(fam["help"])
                metric = by_name.get(name)
                if metric is None:
                    metric = by_name[name] = Metric(name, doc, mtype)
                elif metric.type != mtype:
                    continue
                for sample_name, labels, value in fam["samples"]:
                    labels = {str(k): str(v) for k, v in labels.items()}
                    key = (str(sample_name), tuple(sorted(labels.items())))
                    if key not in seen:
                        seen.add(key)
                        metric.add_sample(str(sample_name), labels, float(value))
            except (KeyError, TypeError, ValueError, AttributeError):
                continue
    return list(by_name.values())
