"""What root trusts in an evidence bundle, and whose bundle it is (DESIGN.md 5b).

A bundle (``slurmhealth/evidence/bundle.py``) is root's; the job's user reads it through
one POSIX ACL entry. Its ``manifest.json``, written by root and writable by nobody else,
vouches for every file's sha256; ``slurmhealth report`` uses a ``summary.json`` only when
the manifest lists exactly the bytes read, and the summary itself is a regular file of
root's (or of this reader's, for a bundle a user wrote for themselves) that nobody else
may write. Anything else is "tampered", with the reason, and the report falls back to the
node's history. Every read goes through :mod:`slurmhealth.access.safe_read`: no symlink followed,
no FIFO waited on, at most ``SUMMARY_MAX`` bytes. (Shared by the evidence writers and the
report, which must not import each other.)
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from typing import Any, NamedTuple

from slurmhealth.access import safe_read

MANIFEST = "manifest.json"
SUMMARY = "summary.json"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


_ACL_XATTR = "system.posix_acl_access"
_ACL_USER_OBJ, _ACL_USER, _ACL_GROUP_OBJ, _ACL_MASK, _ACL_OTHER = 1, 2, 4, 16, 32
_ACL_UNDEFINED_ID = 0xFFFFFFFF


def acl_granting(mode: int, uid: int) -> bytes:
    """The ``system.posix_acl_access`` value (the kernel's xattr format: version 2, then
    tag/perm/id entries in tag order) of ``mode`` plus read (and search, for ``0o750``
    directories) for ``uid``; the mask is the group bits, as ``setfacl`` makes it."""
    group = (mode >> 3) & 7
    entries = [(_ACL_USER_OBJ, (mode >> 6) & 7, _ACL_UNDEFINED_ID), (_ACL_USER, group, uid),
               (_ACL_GROUP_OBJ, group, _ACL_UNDEFINED_ID), (_ACL_MASK, group, _ACL_UNDEFINED_ID),
               (_ACL_OTHER, mode & 7, _ACL_UNDEFINED_ID)]  # fmt: skip
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


def reader_of(path: str) -> int | None:
    """The job's uid a bundle folder belongs to: its ACL's named user (anyone who can look
    the folder up can read its ACL), else its owner when not root (an older bundle)."""
    try:
        raw = os.getxattr(path, _ACL_XATTR, follow_symlinks=False)
    except OSError:
        raw = b""
    for off in range(4, len(raw) - 7, 8):
        tag, _perm, uid = struct.unpack_from("<HHI", raw, off)
        if tag == _ACL_USER:
            return int(uid)
    try:
        return os.lstat(path).st_uid or None
    except OSError:
        return None


def trusted_manifest(dir_fd: int) -> dict[str, Any] | None:
    """The bundle's manifest when root (or this writer) wrote it and nobody else can write
    it: the document that vouches for every file's sha256."""
    try:
        fd, st = safe_read.open_checked(MANIFEST, dir_fd=dir_fd, single_link=True)
    except safe_read.Unsafe:
        return None
    try:
        if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
            return None
        doc = json.loads(safe_read.read_fd(fd, st, MANIFEST, safe_read.MANIFEST_MAX))
    except (safe_read.Unsafe, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)
    return doc if isinstance(doc, dict) and isinstance(doc.get("files"), list) else None


def captured(manifest: dict[str, Any] | None) -> bool:
    """Whether a manifest is a capture's (not only the summary's)."""
    files = manifest.get("files") if manifest else None
    return isinstance(files, list) and any(
        isinstance(e, dict) and e.get("source") != "summary" for e in files
    )


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
            fd, st = safe_read.open_checked(name, dir_fd=dir_fd, single_link=True, label=path)
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
    manifest = trusted_manifest(dir_fd)
    if manifest is None:
        return "no root-written manifest vouches for it"
    files: list[Any] = manifest["files"]
    entry = next((e for e in files if isinstance(e, dict) and e.get("name") == name), None)
    if entry is None:
        return "the manifest does not list it"
    if entry.get("sha256") != hashlib.sha256(raw).hexdigest() or entry.get("size") != len(raw):
        return "its sha256 differs from the manifest's"
    return None
