"""Who may read what: one decision, from root-owned config and the job's owner only.

Rights (today: the admin group) are read from the system config alone,
``/etc/slurmhealth/config.toml`` (for root: the file root named with ``--config`` or
``SLURMHEALTH_CONFIG``), and only when that file and every folder above it are owned by
root and not writable by group or others. A user's own config may change what is shown
and which files are read, never who may read them: its ``evidence.admin_group`` is
ignored here. Root may read everything, the admin group every job, a user their own jobs.

These checks mirror the file modes (history root:admin 0640, bundles job-owner:admin
0640), which are what really keeps a user out: a client can always be rewritten by the
user who runs it. They give one clear refusal (exit 4) where the files would be readable.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import stat
import tomllib
from dataclasses import dataclass
from typing import NamedTuple

from slurmhealth.config import DEFAULT_CONFIG_PATH
from slurmhealth.errors import UsageError

SYSTEM_CONFIG = DEFAULT_CONFIG_PATH  # the only file a non-root caller's rights come from
MAX_CONFIG_BYTES = 4 * 1024 * 1024


class AccessDenied(UsageError):
    """The caller may not read this. Exit 4."""

    exit_code = 4


@dataclass(frozen=True)
class Rights:
    """What the root-owned config grants: the admin group (name or gid as configured, and
    its gid when it exists) and where that was read (or why it was not)."""

    admin_group: str = ""
    admin_gid: int | None = None
    source: str = ""


@dataclass(frozen=True)
class Caller:
    uid: int
    name: str | None
    gids: frozenset[int]


def current_caller() -> Caller:
    """This process's user and groups, as the kernel sees them."""
    uid = os.getuid()
    name = None
    with contextlib.suppress(KeyError):
        name = pwd.getpwuid(uid).pw_name
    return Caller(uid, name, frozenset({os.getgid(), os.getegid(), *os.getgroups()}))


def caller_for_uid(uid: int) -> Caller:
    """Any user by uid, with the groups the user database gives them (tests, ``report``
    on another's behalf); :func:`current_caller` for this process."""
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return Caller(uid, None, frozenset())
    return Caller(uid, pw.pw_name, frozenset(os.getgrouplist(pw.pw_name, pw.pw_gid)))


def is_admin(caller: Caller, rights: Rights) -> bool:
    """Root, or a member of the admin group named by the system config."""
    return caller.uid == 0 or (rights.admin_gid is not None and rights.admin_gid in caller.gids)


class Owner(NamedTuple):
    """Whom a job belongs to, as far as a reader can tell: its uid where one is recorded
    (the decision), and a name for messages; both None: unknown (admins only)."""

    uid: int | None
    name: str | None


def job_owner(uid: int | None = None, user: str | None = None) -> Owner:
    """The job's owner from what its records say: a uid (the history's ``jobs`` row, the
    ACL of the job's evidence folder) and a user name (Slurm's record, a bundle's
    manifest). A uid without a name is named from the user database (``uid N`` when it
    has no entry). Every access check asks this, then :func:`check_job`."""
    name = user or None
    if name is None and uid is not None:
        name = f"uid {uid}"
        with contextlib.suppress(KeyError):
            name = pwd.getpwuid(uid).pw_name
    return Owner(uid, name)


def may_read_job(
    caller: Caller, rights: Rights, owner_uid: int | None, owner_name: str | None
) -> bool:
    """Root and the admin group read any job; its owner (by uid when recorded, else by user
    name) their own; nobody else, and nobody but admins a job whose owner is unknown."""
    if is_admin(caller, rights):
        return True
    if owner_uid is not None:
        return owner_uid == caller.uid
    return bool(owner_name) and owner_name == caller.name


def who_may(rights: Rights, owner_name: str | None = None) -> str:
    """``bob, root or group admins``: for refusal messages."""
    names = [owner_name] if owner_name else []
    names.append("root")
    text = ", ".join(names)
    return text + (f" or group {rights.admin_group}" if rights.admin_gid is not None else "")


def job_denied(job_id: str, owner_name: str | None, rights: Rights, what: str) -> AccessDenied:
    who = owner_name or "an unknown user"
    return AccessDenied(
        f"job {job_id} belongs to {who}; only {who_may(rights, owner_name)} may read its {what}"
    )


def check_job(
    caller: Caller,
    rights: Rights,
    job_id: str,
    owner_uid: int | None,
    owner_name: str | None,
    what: str = "report",
) -> None:
    """Raise :class:`AccessDenied` (exit 4) unless ``caller`` may read the job."""
    if not may_read_job(caller, rights, owner_uid, owner_name):
        raise job_denied(job_id, owner_name, rights, what)


def require_admin(caller: Caller, rights: Rights, what: str) -> None:
    """Raise :class:`AccessDenied` (exit 4) unless ``caller`` is root or an admin."""
    if not is_admin(caller, rights):
        raise AccessDenied(f"only {who_may(rights)} may {what}")


# -- the system config ------------------------------------------------------------------------


def system_config_path(explicit: str | None, uid: int) -> str:
    """Root's own ``--config``/``SLURMHEALTH_CONFIG`` is the system config; anyone else's is
    only their display settings."""
    return explicit if uid == 0 and explicit else SYSTEM_CONFIG


def _why_untrusted(st: os.stat_result, kind: str) -> str | None:
    if st.st_uid != 0:
        return f"{kind} owned by uid {st.st_uid}, not root"
    if st.st_mode & 0o022 and not (kind == "folder" and st.st_mode & stat.S_ISVTX):
        return f"{kind} writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _read_trusted(path: str) -> bytes:
    """The file's bytes when root alone controls it; raise ``OSError``/``ValueError``."""
    real = os.path.realpath(path)
    fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        why = None if stat.S_ISREG(st.st_mode) else "not a regular file"
        folder = real
        while not why and folder != os.path.dirname(folder):
            folder = os.path.dirname(folder)
            why = _why_untrusted(os.stat(folder), "folder")
        why = why or _why_untrusted(st, "file")
        if not why and st.st_size > MAX_CONFIG_BYTES:
            why = f"larger than {MAX_CONFIG_BYTES} bytes"  # never judge half a file
        if why:
            raise ValueError(why)
        return os.read(fd, MAX_CONFIG_BYTES)
    finally:
        os.close(fd)


def _gid(group: str) -> int | None:
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def rights_from_system_config(path: str = SYSTEM_CONFIG) -> Rights:
    """The rights the root-owned config at ``path`` grants; none (root and owners only)
    when it is missing, not root's alone, or unreadable -- ``source`` says which."""
    try:
        data = tomllib.loads(_read_trusted(path).decode())
    except FileNotFoundError:
        return Rights(source=f"{path} (missing: no admin group)")
    except (OSError, ValueError) as exc:  # ValueError: untrusted, not UTF-8, not TOML
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return Rights(source=f"{path} ignored for rights: {why}")
    section = data.get("evidence")
    group = section.get("admin_group", "") if isinstance(section, dict) else ""
    if not isinstance(group, str) or not group:
        return Rights(source=f"{path} (no evidence.admin_group: root only)")
    return Rights(group, _gid(group), path)
