"""Whether a bundle's ``summary.json`` can be trusted before a report uses it.

A summary stands in for a node's history in ``slurmhealth report`` (DESIGN.md 5b): it is
trusted only when its bundle's manifest, written by root and writable by nobody else, lists
it with the sha256 of exactly the bytes read, and the summary itself is a regular file of
root's (or of this reader's, for a bundle a user wrote for themselves) that nobody else may
write. Anything else is "tampered", with the reason, and the report falls back to the
node's history. Every read goes through :mod:`slurmhealth.safe_read`: no symlink followed,
no FIFO waited on, at most ``SUMMARY_MAX`` bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any, NamedTuple

from slurmhealth import safe_read
from slurmhealth.evidence import bundle

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Checked(NamedTuple):
    data: Any  # the parsed summary when trusted, else None
    tampered: str | None  # why it is not trusted (None: trusted, or simply absent)


def _trusted_owner(st: os.stat_result) -> bool:
    return st.st_uid in (0, os.geteuid()) and not st.st_mode & 0o022


def check_summary(path: str) -> Checked:
    """The summary at ``<bundle>/summary.json`` when its manifest vouches for it."""
    folder, name = os.path.split(path)
    try:
        dir_fd = os.open(folder, _DIR_FLAGS)
    except OSError as exc:
        return Checked(None, f"bundle folder cannot be opened ({exc.strerror or exc})")
    try:
        if not _trusted_owner(os.fstat(dir_fd)):
            return Checked(None, "bundle folder is writable by someone other than root")
        try:
            fd, st = safe_read.open_checked(name, dir_fd=dir_fd, single_link=True)
        except safe_read.Unsafe as exc:
            return Checked(None, str(exc))
        try:
            if not _trusted_owner(st):
                return Checked(None, f"{path} is uid {st.st_uid}'s or writable by others")
            raw = safe_read.read_fd(fd, st, path, safe_read.SUMMARY_MAX)
        except safe_read.Unsafe as exc:
            return Checked(None, str(exc))
        finally:
            os.close(fd)
        why = _vouched(dir_fd, name, raw)
        if why:
            return Checked(None, why)
    finally:
        os.close(dir_fd)
    try:
        return Checked(json.loads(raw), None)
    except (ValueError, RecursionError):
        return Checked(None, f"{path}: not JSON")


def _vouched(dir_fd: int, name: str, raw: bytes) -> str | None:
    """None when the trusted manifest lists ``name`` with ``raw``'s sha256 and size."""
    manifest = bundle.trusted_manifest(dir_fd)
    if manifest is None:
        return "no root-written manifest vouches for it"
    files: list[Any] = manifest["files"]
    entry = next((e for e in files if isinstance(e, dict) and e.get("name") == name), None)
    if entry is None:
        return "the manifest does not list it"
    if entry.get("sha256") != hashlib.sha256(raw).hexdigest() or entry.get("size") != len(raw):
        return "its sha256 differs from the manifest's"
    return None
