"""Files under a job's user's folders copied into its evidence bundle: the NCCL debug files
and the user's drop folder (``evidence.drop_globs``, docs/threat-model.md).

Found and opened with the job's user's rights (:mod:`slurmhealth.access.user_open`), never
following a final symlink nor blocking on a FIFO; only regular files of the job's uid, at
most ``max_files`` of them, the last ``tail_bytes`` of each (:func:`tail_opened`).
"""

from __future__ import annotations

import glob
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from slurmhealth.access import safe_read
from slurmhealth.access.user_open import Rights, open_paths
from slurmhealth.evidence.sources import Sink, tail_opened
from slurmhealth.model_records import Job

_SAFE_CHARS = re.compile(r"[^A-Za-z0-9_.+-]")


class Task(Protocol):
    """The capture's task a copy writes into (``slurmhealth.evidence.registry.Task``)."""

    skip: str | None
    outputs: dict[str, Sink]

    def out(self, name: str | None = None) -> Sink: ...


def _home(user: str, uid: int | None) -> str:
    import pwd

    try:
        if user:
            return pwd.getpwnam(user).pw_dir
        if uid is not None:
            return pwd.getpwuid(uid).pw_dir
    except KeyError:
        pass
    return ""


def job_patterns(globs: Sequence[str], job: Job) -> list[str]:
    """``globs`` with ``{job_id}``, ``{user}`` and ``{home}`` filled in (escaped); a glob
    naming a value the job lacks (``{home}`` of an unknown user) is left out."""
    values = {"{job_id}": job.job_id, "{user}": job.user, "{home}": _home(job.user, job.uid)}
    patterns: list[str] = []
    for pattern in globs:
        if any(key in pattern and not value for key, value in values.items()):
            continue
        for key, value in values.items():
            pattern = pattern.replace(key, glob.escape(value))
        patterns.append(pattern)
    return patterns


def read_heads(
    globs: Sequence[str], job: Job, max_files: int, nbytes: int, timeout_s: float = 2.0
) -> list[bytes]:
    """The first ``nbytes`` of each file matching ``globs`` (at most ``max_files``), found
    and opened with the job's user's rights like the capture's copies: regular files of the
    job's uid only (the sidecar's NCCL watch reads the init lines at a file's start)."""
    rights = None if job.uid is None else Rights.of(job.uid, job.user)
    opened, _note = open_paths(job_patterns(globs, job), rights, max_files=max_files,
                               timeout_s=timeout_s)  # fmt: skip
    out: list[bytes] = []
    for one in opened:
        if one.fd is None:
            continue
        try:
            safe_read.check_fd(one.fd, one.path, uid=job.uid)
            out.append(os.pread(one.fd, nbytes, 0))
        except (safe_read.Unsafe, OSError):
            continue
        finally:
            os.close(one.fd)
    return out


@dataclass(frozen=True)
class UserFiles:
    """Files under the job's user's folders copied into ``<folder>/`` of the bundle."""

    what: str  # for the notes: "NCCL debug", "user-supplied"
    key: str  # the config key of the globs, for the skip note
    globs: Sequence[str]
    folder: str
    max_files: int
    tail_bytes: int


def copy_user_files(
    job: Job, rights: Rights | None, task: Task, deadline: float, spec: UserFiles
) -> None:
    """Files matching ``spec.globs`` (``{job_id}``, ``{user}``, ``{home}``), found and opened
    with the job's user's rights: a folder made a symlink to one the user cannot read
    yields nothing (root lists nothing for them); regular files of the job's uid only."""
    left = max(0.1, deadline - time.monotonic())
    opened, note = open_paths(job_patterns(spec.globs, job), rights,
                              max_files=spec.max_files + 1, timeout_s=left)  # fmt: skip
    if note:
        task.out().fail(note)
    files = [o for o in opened if o.fd is not None]
    if not files:
        task.skip = f"no {spec.what} file matched {spec.key}"
        return
    if len(files) > spec.max_files:
        task.out().write(f"over {spec.max_files} files matched; first ones kept\n".encode())
    for n, one in enumerate(files):
        if n >= spec.max_files or time.monotonic() >= deadline:
            if n < spec.max_files:
                task.out().fail(f"no time left for the remaining {spec.what} files")
            os.close(one.fd)  # type: ignore[arg-type]  # files holds opened ones only
            continue
        name = _SAFE_CHARS.sub("_", os.path.basename(one.path)).lstrip(".") or "log"
        while f"{spec.folder}/{name}" in task.outputs:
            name = f"_{name}"
        tail_opened(one, task.out(f"{spec.folder}/{name}"), spec.tail_bytes, job.uid)
