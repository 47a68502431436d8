"""Where bundles live and how their files are written: paths, permissions, safe writes.

A bundle is ``<evidence_dir>/<job_id>/<node>/`` (``evidence_dir`` may hold ``{node}``).
It belongs to root, so the party a report judges cannot rewrite its evidence (DESIGN.md
5b): directories ``0750``, files ``0640``, owner root, group the admin group
(``evidence.admin_group``; empty = root), and a POSIX ACL entry that lets the job's user
read it (``user:<uid>:r-x`` on directories, ``user:<uid>:r--`` on files). Every write
still goes through directory file descriptors opened with ``O_NOFOLLOW``, so a symlink in
a bundle (one left by an older version, which gave bundles to the job's user) never
redirects a root write elsewhere; an old bundle's folders are taken back by root.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from slurmhealth.access import safe_read
from slurmhealth.access.trust import _ACL_XATTR, acl_granting
from slurmhealth.access.trust import captured as captured  # re-exported for the evidence writers
from slurmhealth.access.trust import reader_of as reader_of
from slurmhealth.access.trust import trusted_manifest as trusted_manifest
from slurmhealth.errors import UsageError

if TYPE_CHECKING:
    from slurmhealth.config import Config

DIR_MODE = 0o750
FILE_MODE = 0o640
ROOT_MODE = 0o711  # the evidence root: traverse only, so nobody lists other jobs
MANIFEST = "manifest.json"
SUMMARY = "summary.json"
SCHEMA = "slurmhealth.evidence/1"
_NAME_RE = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]{0,127}")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def safe_name(value: str, what: str) -> str:
    """``value`` if it is usable as one path component (a job id, a node name)."""
    if not _NAME_RE.fullmatch(value):
        raise UsageError(f"{what} {value!r} cannot name an evidence directory")
    return value


def evidence_root(cfg: Config, node: str | None = None) -> str:
    return cfg.expand(cfg.paths.evidence_dir, node)


def bundle_path(cfg: Config, job_id: str, node: str) -> str:
    """``<evidence_dir>/<job_id>/<node>`` (``{node}`` in evidence_dir expanded)."""
    root = evidence_root(cfg, node)
    return os.path.join(root, safe_name(job_id, "job id"), safe_name(node, "node name"))


def admin_gid(group: str) -> tuple[int, str | None]:
    """The admin group's gid (0 when none is configured) and a note when it is unknown."""
    if not group:
        return 0, None
    if group.isdigit():
        return int(group), None
    try:
        return grp.getgrnam(group).gr_gid, None
    except KeyError:
        return 0, f"evidence.admin_group {group!r} does not exist; group root used"


class Owner:
    """Who a bundle's directories and files belong to: root (the writer), the admin group,
    and ``reader`` (the job's uid, when known) through an ACL entry."""

    def __init__(self, reader: int | None, gid: int) -> None:
        self.reader = reader
        self.gid = gid
        self.notes: list[str] = []

    def apply(self, fd: int, mode: int) -> None:
        try:
            os.fchown(fd, os.geteuid(), self.gid)
        except PermissionError as exc:  # not root: the files keep the writer's group
            self._note(f"cannot chgrp evidence files ({exc.strerror}); they keep the writer's")
        os.fchmod(fd, mode)
        if self.reader is None or self.reader == os.geteuid():
            return
        try:
            os.setxattr(fd, _ACL_XATTR, acl_granting(mode, self.reader))
        except OSError as exc:
            self._note(f"cannot give uid {self.reader} read access by ACL ({exc.strerror}): "
                       "only root and the admin group can read this bundle")  # fmt: skip

    def _note(self, note: str) -> None:
        if note not in self.notes:
            self.notes.append(note)


def subdir(parent_fd: int, name: str, owner: Owner) -> int:
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, DIR_MODE, dir_fd=parent_fd)
    fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    owner.apply(fd, DIR_MODE)
    return fd


@contextlib.contextmanager
def open_dir(base: str, parts: Sequence[str], owner: Owner) -> Iterator[int]:
    """Create ``base/parts...`` (each part ``0750``, owned per ``owner``); yield the last
    one's file descriptor. ``base`` is created ``0711`` when missing and left alone else."""
    if not os.path.isdir(base):
        os.makedirs(base, mode=ROOT_MODE, exist_ok=True)
    fds = [os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    try:
        for part in parts:
            fds.append(subdir(fds[-1], part, owner))
        yield fds[-1]
    finally:
        for fd in reversed(fds):
            os.close(fd)


@contextlib.contextmanager
def open_bundle(cfg: Config, job_id: str, node: str, owner: Owner) -> Iterator[int]:
    root = evidence_root(cfg, node)
    parts = [safe_name(job_id, "job id"), safe_name(node, "node name")]
    with open_dir(root, parts, owner) as fd:
        yield fd


def write_file(dir_fd: int, name: str, data: bytes, owner: Owner) -> None:
    """Write ``name`` (no slashes) in the directory ``dir_fd`` atomically, mode ``0640``."""
    tmp = f".{name}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dir_fd)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, FILE_MODE, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        owner.apply(fd, FILE_MODE)
    finally:
        os.close(fd)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def read_tail(dir_fd: int, name: str, nbytes: int) -> bytes | None:
    """The last ``nbytes`` of a regular, singly linked file in ``dir_fd``; None otherwise."""
    try:
        return safe_read.read_bytes(name, nbytes, dir_fd=dir_fd, tail=True, single_link=True)
    except safe_read.Unsafe:
        return None


@contextlib.contextmanager
def open_existing(path: str, dir_fd: int | None = None) -> Iterator[int | None]:
    """A directory fd for ``path`` (relative to ``dir_fd`` when given; its last component
    not a symlink), or None."""
    try:
        fd = os.open(path, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        yield None
        return
    try:
        yield fd
    finally:
        os.close(fd)


def file_entry(name: str, data: bytes, source: str) -> dict[str, object]:
    import hashlib

    return {"name": name, "source": source, "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest()}  # fmt: skip


def vouch(dir_fd: int, entry: dict[str, object], owner: Owner, job_id: str, node: str) -> None:
    """Put ``entry`` (a file just written, see :func:`file_entry`) into the manifest, or
    start one that lists it (a summary written for a job whose bundle was not captured)."""
    doc = trusted_manifest(dir_fd)
    if doc is None:
        doc = {"schema": SCHEMA, "job_id": job_id, "node": node, "reason": "summary only",
               "uid": owner.reader, "files": []}  # fmt: skip
    name = entry["name"]
    files = [e for e in doc["files"] if not (isinstance(e, dict) and e.get("name") == name)]
    doc["files"] = [*files, entry]
    data = (json.dumps(doc, indent=1, default=str) + "\n").encode()
    write_file(dir_fd, MANIFEST, data, owner)
