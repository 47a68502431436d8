"""One GPU snapshot shared by the prologs of a burst of job starts on one node.

When a job array starts, a node runs many prologs at once; each opening NVML and reading
its GPUs would multiply the cost by the burst size on a node that is busy already. So a
prolog takes the node's lock (``snapshot.lock`` in the node's run dir, root-only), uses
what another prolog read of its GPUs less than :data:`MAX_AGE_S` ago, reads only the GPUs
missing from that, and leaves them for the others. Only GPUs that answered are shared: a
GPU that failed or hung is read again by each prolog, so no prolog judges a GPU by another
one's deadline. The kernel-log hint of the backend (where a simulated GPU logs its Xids)
is kept with them, so a prolog served from the cache does not open the GPU backend.

The files are root's own: the directory is made 0700, the files are opened without
following symlinks and read only when owned by this user; anything else is ignored (a
fresh snapshot is taken), never trusted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import stat
import time
from collections.abc import Callable, Sequence
from typing import Any

from slurmhealth.model import GpuProcess, GpuState, GpuStatus, MigDevice, NodeSnapshot, NvLink

log = logging.getLogger("slurmhealth.hooks")

MAX_AGE_S = 2.0  # a snapshot this recent stands for "now" in another job's prolog
_POLL_S = 0.01
_SCHEMA = "slurmhealth.snapshot/1"


@dataclasses.dataclass(frozen=True)
class Cached:
    """The node's last readable GPU states, each with the time it was read (UTC s)."""

    snapshot: NodeSnapshot
    taken: dict[int, float]
    hint: str | None


def _to_json(cached: Cached) -> str:
    taken = {str(i): t for i, t in cached.taken.items()}
    doc = {"schema": _SCHEMA, "taken": taken, "hint": cached.hint}
    return json.dumps({**doc, **dataclasses.asdict(cached.snapshot)})


def _gpu(doc: dict[str, Any]) -> GpuState:
    links, procs, migs = doc.get("nvlinks"), doc.get("processes"), doc.get("mig_devices")
    return GpuState(
        **{
            **doc,
            "status": GpuStatus(doc["status"]),
            "nvlinks": None if links is None else tuple(NvLink(**x) for x in links),
            "processes": _procs(procs),
            "mig_devices": None if migs is None else tuple(_mig(m) for m in migs),
        }
    )


def _procs(procs: list[dict[str, Any]] | None) -> tuple[GpuProcess, ...] | None:
    return None if procs is None else tuple(GpuProcess(**x) for x in procs)


def _mig(doc: dict[str, Any]) -> MigDevice:
    return MigDevice(**{**doc, "processes": _procs(doc.get("processes"))})


def _from_json(text: str) -> Cached:
    """Raises ValueError, TypeError or KeyError for anything but a cache we wrote."""
    doc = json.loads(text)
    if not isinstance(doc, dict) or doc.pop("schema", None) != _SCHEMA:
        raise ValueError("not a snapshot cache")
    taken = {int(i): float(t) for i, t in doc.pop("taken").items()}
    hint = doc.pop("hint")
    gpus = tuple(_gpu(g) for g in doc.pop("gpus"))
    return Cached(NodeSnapshot(**doc, gpus=gpus), taken, hint if isinstance(hint, str) else None)


def _open_private(path: str, flags: int) -> int:
    """Open ``path`` without following a symlink; refuse what is not our regular file."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise PermissionError(f"{path}: not a regular file owned by uid {os.geteuid()}")
    return fd


def _lock(path: str, wait_s: float, clock: Callable[[], float]) -> int | None:
    fd = _open_private(path, os.O_RDWR | os.O_CREAT)
    deadline = clock() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if clock() >= deadline:
                os.close(fd)
                return None
            time.sleep(_POLL_S)


def _read(path: str) -> Cached | None:
    try:
        fd = _open_private(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, encoding="utf-8") as fh:
        text = fh.read(1 << 22)
    try:
        return _from_json(text)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.warning("snapshot cache %s ignored: %s: %s", path, type(exc).__name__, exc)
        return None


def _write(path: str, cached: Cached) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = _open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(_to_json(cached))
    os.replace(tmp, path)


def _merge(old: Cached | None, now: float) -> tuple[dict[int, GpuState], dict[int, float]]:
    """The GPUs of ``old`` still fresh at ``now``."""
    if old is None:
        return {}, {}
    fresh = {
        g.index: g
        for g in old.snapshot.gpus
        if g.readable and 0 <= now - old.taken.get(g.index, -1e18) <= MAX_AGE_S
    }
    return fresh, {i: old.taken[i] for i in fresh}


Taker = Callable[[Sequence[int] | None], tuple[NodeSnapshot, str | None]]


def shared_snapshot(
    run_dir: str,
    take: Taker,
    wanted: Sequence[int],
    wait_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    now: Callable[[], float] = time.time,
) -> tuple[NodeSnapshot, str | None] | None:
    """The node's snapshot of GPUs ``wanted`` and the backend's kernel-log hint: what other
    prologs read recently, plus ``take(missing)`` for the rest, under the node's lock.
    None when the lock could not be had within ``wait_s`` seconds."""
    try:
        os.makedirs(run_dir, mode=0o700, exist_ok=True)
        fd = _lock(os.path.join(run_dir, "snapshot.lock"), wait_s, clock)
    except OSError as exc:  # no private dir: this prolog reads the GPUs on its own
        log.warning("snapshot cache unavailable (%s): reading the GPUs alone", exc)
        return take(wanted)
    if fd is None:
        return None
    path = os.path.join(run_dir, "snapshot.json")
    try:
        try:
            old = _read(path)
        except OSError as exc:
            log.warning("snapshot cache %s unreadable: %s", path, exc)
            old = None
        fresh, taken = _merge(old, now())
        missing = [i for i in wanted if i not in fresh]
        if old is not None and not missing:
            gpus = tuple(fresh[i] for i in wanted)
            return dataclasses.replace(old.snapshot, gpus=gpus), old.hint
        snapshot, hint = take(missing)
        read_at = now()
        got = {g.index: g for g in snapshot.gpus}
        for g in snapshot.gpus:
            if g.readable and snapshot.error is None:
                fresh[g.index], taken[g.index] = g, read_at
        if snapshot.error is None:
            keep = dataclasses.replace(snapshot, gpus=tuple(fresh[i] for i in sorted(fresh)))
            try:
                _write(path, Cached(keep, taken, hint))
            except OSError as exc:
                log.warning("snapshot cache %s not written: %s", path, exc)
        gpus = tuple(got.get(i) or fresh[i] for i in wanted if i in got or i in fresh)
        return dataclasses.replace(snapshot, gpus=gpus), hint
    finally:
        os.close(fd)  # releases the lock
