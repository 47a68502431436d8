"""Who may read a job: one decision (``slurmhealth.access``), rights from the root-owned system
config only. The attacks of issue 11 -- a user's own ``SLURMHEALTH_CONFIG`` naming their group
as the admin group, ``history --job`` of another user's job -- run as a real unprivileged
user against the real command line."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmhealth import access
from slurmhealth.access import Caller, Rights
from slurmhealth.config import load_config
from slurmhealth.evidence.summary import write_summary
from slurmhealth.history import Batch, History
from tests.support.skips import needs, root_only, unavailable

REPO = Path(__file__).resolve().parents[2]
ADMINS = Rights("ops", 500, "/etc/slurmhealth/config.toml")
root_only = root_only("needs root (chown, runuser)")
ALICE = Caller(1001, "alice", frozenset({1001}))
OPS_BOB = Caller(1002, "bob", frozenset({1002, 500}))


# -- the decision -----------------------------------------------------------------------------


def test_owner_root_and_admin_group_read_a_job_nobody_else() -> None:
    assert access.may_read_job(ALICE, ADMINS, 1001, "alice")  # the owner
    assert not access.may_read_job(ALICE, ADMINS, 1002, "bob")  # another user's
    assert not access.may_read_job(ALICE, ADMINS, 1002, "alice")  # the uid decides
    assert access.may_read_job(ALICE, ADMINS, None, "alice")  # no uid recorded: the name
    assert not access.may_read_job(ALICE, ADMINS, None, None)  # unknown owner: admins only
    assert access.may_read_job(OPS_BOB, ADMINS, 1001, "alice")  # the admin group
    assert not access.may_read_job(OPS_BOB, Rights(), 1001, "alice")  # no admin group
    assert access.may_read_job(Caller(0, "root", frozenset()), Rights(), None, None)
    nameless = Caller(54321, None, frozenset({54321}))  # a uid without a passwd entry
    assert not access.may_read_job(nameless, ADMINS, None, None)  # unknown owner: admins only
    assert not access.may_read_job(nameless, ADMINS, None, "")


def test_refusals_name_who_may_and_exit_4() -> None:
    with pytest.raises(access.AccessDenied) as e:
        access.check_job(ALICE, ADMINS, "42", 1002, "bob", "history")
    assert str(e.value) == "job 42 belongs to bob; only bob, root or group ops may read its history"
    assert e.value.exit_code == 4
    with pytest.raises(access.AccessDenied, match=r"^only root may list every"):
        access.require_admin(OPS_BOB, Rights(), "list every job's runs")


def test_callers_come_from_the_kernel_and_the_user_database() -> None:
    me = access.current_caller()
    assert me.uid == os.getuid() and me.name == pwd.getpwuid(os.getuid()).pw_name
    assert {os.getgid(), os.getegid(), *os.getgroups()} == me.gids
    root = access.caller_for_uid(0)
    assert (root.uid, root.name) == (0, "root") and 0 in root.gids
    assert access.caller_for_uid(54321) == Caller(54321, None, frozenset())  # no passwd entry


def test_check_job_decides_by_uid_then_name_and_names_what_was_refused() -> None:
    access.check_job(ALICE, ADMINS, "7", 1001, "bob")  # the uid decides, not the name
    access.check_job(ALICE, ADMINS, "7", None, "alice")  # no uid recorded: the name
    with pytest.raises(access.AccessDenied) as e:
        access.check_job(ALICE, ADMINS, "44", None, None)
    assert str(e.value) == (
        "job 44 belongs to an unknown user; only root or group ops may read its report"
    )


def test_a_jobs_owner_is_named_from_its_records_or_the_user_database() -> None:
    """Who owns a job, as every access check asks it: a recorded name stands; a uid alone
    is named from the user database, or ``uid N`` when it has no entry; nothing recorded
    is an unknown owner, whom only admins may read."""
    assert access.job_owner(1001, "bob") == access.Owner(1001, "bob")  # Slurm's name kept
    assert access.job_owner(0) == access.Owner(0, "root")
    assert access.job_owner(54321, "") == access.Owner(54321, "uid 54321")  # no passwd entry
    assert access.job_owner(None, "alice") == access.Owner(None, "alice")
    assert access.job_owner() == access.Owner(None, None)
    with pytest.raises(access.AccessDenied) as e:
        access.check_job(ALICE, ADMINS, "9", *access.job_owner(54321))
    assert str(e.value).startswith("job 9 belongs to uid 54321;"), str(e.value)
    access.check_job(OPS_BOB, ADMINS, "9", *access.job_owner())  # an admin reads it


def _system_config(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "etc" / "config.toml"
    path.parent.mkdir(mode=0o755)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    path.chmod(0o644)
    return str(path)


@root_only  # the file and its folders must be root's
@pytest.mark.parametrize(
    "text",
    ['[evidence]\nretention_days = 3\n', 'evidence = "ops"\n', "[evidence]\nadmin_group = 5\n",
     '[evidence]\nadmin_group = ""\n', ""],
)  # fmt: skip
def test_a_system_config_without_an_admin_group_grants_root_only(tmp_path: Path, text: str) -> None:
    path = _system_config(tmp_path, text)
    rights = access.rights_from_system_config(path)
    assert rights == Rights(source=f"{path} (no evidence.admin_group: root only)")


@root_only  # the file and its folders must be root's
def test_the_admin_group_by_name_or_gid(tmp_path: Path) -> None:
    path = _system_config(tmp_path, '[evidence]\nadmin_group = "root"\n')
    assert access.rights_from_system_config(path) == Rights("root", 0, path)
    (tmp_path / "etc" / "config.toml").write_text('[evidence]\nadmin_group = "4321"\n')
    assert access.rights_from_system_config(path) == Rights("4321", 4321, path)
    (tmp_path / "etc" / "config.toml").write_text('[evidence]\nadmin_group = "no-such-grp"\n')
    assert access.rights_from_system_config(path) == Rights("no-such-grp", None, path)


@root_only  # the file and its folders must be root's
def test_a_system_config_that_is_not_toml_or_too_large_grants_nothing(tmp_path: Path) -> None:
    path = _system_config(tmp_path, "[evidence\nadmin_group = 'ops'\n")
    rights = access.rights_from_system_config(path)
    assert rights.admin_gid is None and rights.source.startswith(f"{path} ignored for rights: ")
    assert "Expected ']'" in rights.source  # tomllib's own reason, not a placeholder
    big = b"#" * access.MAX_CONFIG_BYTES + b'\n[evidence]\nadmin_group = "root"\n'
    (tmp_path / "etc" / "config.toml").write_bytes(big)
    assert access.rights_from_system_config(path) == Rights(
        source=f"{path} ignored for rights: larger than {access.MAX_CONFIG_BYTES} bytes"
    )
    exact = b'[evidence]\nadmin_group = "root"\n'
    (tmp_path / "etc" / "config.toml").write_bytes(
        exact + b"#" * (access.MAX_CONFIG_BYTES - len(exact))
    )
    assert access.rights_from_system_config(path).admin_gid == 0  # at the cap: read whole


@root_only  # the file and its folders must be root's
def test_a_fifo_as_system_config_is_refused_without_blocking(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir(mode=0o755)
    fifo = tmp_path / "etc" / "config.toml"
    os.mkfifo(fifo, 0o644)
    rights = access.rights_from_system_config(str(fifo))
    assert rights == Rights(source=f"{fifo} ignored for rights: not a regular file")
    (tmp_path / "file").write_text("")
    below_a_file = str(tmp_path / "file" / "config.toml")
    assert access.rights_from_system_config(below_a_file).source == (
        f"{below_a_file} ignored for rights: Not a directory"  # the OS's reason, no errno
    )
    missing = str(tmp_path / "etc" / "nothing.toml")
    assert (
        access.rights_from_system_config(missing).source == f"{missing} (missing: no admin group)"
    )


def test_only_root_names_its_own_system_config() -> None:
    assert access.system_config_path("/home/u/my.toml", 1001) == access.SYSTEM_CONFIG
    assert access.system_config_path(None, 1001) == access.SYSTEM_CONFIG
    assert access.system_config_path("/srv/cluster.toml", 0) == "/srv/cluster.toml"


# -- the system config ------------------------------------------------------------------------


@root_only
@pytest.mark.parametrize(
    ("how", "granted"),
    [("root 644", True), ("user-owned", False), ("group-writable", False),
     ("folder others write", False), ("sticky folder", True), ("missing", False)],
)  # fmt: skip
def test_rights_come_only_from_a_file_root_alone_controls(
    tmp_path: Path, user: str, how: str, granted: bool
) -> None:
    folder = tmp_path / "etc"
    folder.mkdir(mode=0o755)
    path = folder / "config.toml"
    path.write_text('[evidence]\nadmin_group = "4321"\n')
    path.chmod(0o644)
    if how == "user-owned":
        os.chown(path, pwd.getpwnam(user).pw_uid, -1)
    elif how == "group-writable":
        path.chmod(0o664)
    elif how in ("folder others write", "sticky folder"):
        folder.chmod(0o777 | (0o1000 if how == "sticky folder" else 0))
    elif how == "missing":
        path.unlink()
    rights = access.rights_from_system_config(str(path))
    assert (rights.admin_gid == 4321) is granted, rights.source
    assert granted or str(path) in rights.source
    why = {
        "user-owned": f"file owned by uid {pwd.getpwnam(user).pw_uid}, not root",
        "group-writable": "file writable by group or others (mode 664)",
        "folder others write": "folder writable by group or others (mode 777)",
    }
    if how in why:
        assert rights.source == f"{path} ignored for rights: {why[how]}"


# -- as an unprivileged user ------------------------------------------------------------------


@pytest.fixture(scope="module")
def admin_group() -> Iterator[str]:
    """A throwaway group (runuser -G needs a real one)."""
    if os.geteuid() != 0:
        unavailable("needs root (groupadd, runuser)")
    name = f"shadm{os.getpid()}"
    subprocess.run(["groupadd", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["groupdel", name], check=False)


@pytest.fixture
def site(user: str, admin_group: str) -> Iterator[Path]:
    """A folder the user can reach: a root-owned system config naming ``admin_group``, one
    node's history with job 42 (uid 4242's) and job 43 (the user's), and job 43's
    ``summary.json`` in the evidence dir, as the epilog leaves them."""
    top = Path(tempfile.mkdtemp(prefix="slurmhealth-access-"))
    top.chmod(0o755)
    (top / "system.toml").write_text(f'[evidence]\nadmin_group = "{admin_group}"\n')
    db, evidence = top / "lib" / "history" / "history.db", top / "lib" / "evidence"
    paths = f'[node]\nname = "n1"\n[paths]\ndb = "{db}"\nevidence_dir = "{evidence}"\n'
    paths += "[report]\naccounting = false\n"  # this folder's jobs only, not the machine's slurmdbd
    (top / "root.toml").write_text(paths)
    owner = pwd.getpwnam(user)
    with History(db) as h:
        for job, name, uid in (("42", "victim", 4242), ("43", user, owner.pw_uid)):
            run = {"run_id": f"p{job}", "ts": 1.7e9, "node": "n1", "job_id": job,
                   "phase": "prolog", "status": "ok", "gpus": [0]}  # fmt: skip
            row = {"job_id": job, "node": "n1", "user": name, "uid": uid, "start_ts": 1.7e9}
            assert h.write(Batch(inserts=[("check_runs", run)], upserts=[("jobs", row, "job_id")]))
    cfg = load_config(str(top / "root.toml"), env={})
    write_summary(cfg, "43", "n1", uid=owner.pw_uid)
    write_summary(cfg, "42", "n1", uid=4242)
    mine = top / "mine.toml"  # the trick: the user's own config names their group as admins
    mine.write_text(paths + f'[evidence]\nadmin_group = "{grp.getgrgid(owner.pw_gid).gr_name}"\n')
    os.chown(mine, owner.pw_uid, -1)
    yield top
    shutil.rmtree(top)


def _open_db_like_an_old_install(top: Path) -> None:
    """0644 in a 0755 folder (before the history was made private): the files would let the
    user read, so what refuses them is the access decision."""
    (top / "lib" / "history").chmod(0o755)
    for path in (top / "lib" / "history").iterdir():
        path.chmod(0o644)


def _run(
    top: Path, user: str | None, *args: str, group: str | None = None, uid: int | None = None
) -> tuple[int, str, str]:
    """The real command line as ``user`` (root when None; or as a bare ``uid`` that has no
    passwd entry); the launcher only points the system config at ``top/system.toml``, as a
    package built for that path would."""
    site_packages = next((REPO / ".venv" / "lib").glob("python3*/site-packages"))
    launcher = ("import sys, slurmhealth.access as a; a.SYSTEM_CONFIG = sys.argv[1]; "
                "from slurmhealth.cli import main; main(sys.argv[2:])")  # fmt: skip
    config = top / ("mine.toml" if user else "root.toml")
    cmd = ["env", f"PYTHONPATH={REPO}:{site_packages}", f"SLURMHEALTH_CONFIG={config}",
           "/usr/bin/python3", "-c", launcher, str(top / "system.toml"), *args]  # fmt: skip
    if user:
        cmd = ["runuser", "-u", user, *(["-G", group] if group else []), "--", *cmd]
    elif uid is not None:
        cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/")
    return proc.returncode, proc.stdout, proc.stderr


def _refused(result: tuple[int, str, str], *words: str) -> None:
    rc, _out, err = result
    assert rc == 4, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err


needs_user_python = needs(Path("/usr/bin/python3").exists(), "no /usr/bin/python3 for another user")


@root_only
@needs_user_python
def test_own_config_naming_own_group_as_admins_opens_nothing(site: Path, user: str) -> None:
    _open_db_like_an_old_install(site)
    _refused(_run(site, user, "report", "42"), "job 42 belongs to victim", "report")
    _refused(_run(site, user, "history", "--job", "42"), "job 42 belongs to victim", "history")
    _refused(_run(site, user, "evidence", "show", "42"), "job 42 belongs to uid 4242", "evidence")
    rc, out, _ = _run(site, user, "config", "show")
    assert rc == 0 and "ignored for access" in out


@root_only
@needs_user_python
def test_history_of_another_users_job_or_of_every_job_is_refused(site: Path, user: str) -> None:
    _open_db_like_an_old_install(site)
    _refused(_run(site, user, "history", "--job", "42", "--json"), "belongs to victim")
    _refused(_run(site, user, "history"), "only root or group shadm", "--job JOBID")
    add = ("incident", "add", "43", "--symptom", "slow", "--root-cause", "my own code")
    _refused(_run(site, user, *add), "only root or group shadm", "may record incidents")
    rc, out, err = _run(site, user, "history", "--job", "43", "--json")
    assert rc == 0 and '"job_id": "43"' in out and '"42"' not in out, err


@root_only
@needs_user_python
def test_the_owner_reads_their_job_from_its_summary_when_the_history_is_private(
    site: Path, user: str
) -> None:
    rc, out, err = _run(site, user, "report", "43", "--json")
    assert rc == 0 and '"job_id": "43"' in out, err
    assert "cannot be read" in err or not err  # the history is root:admin: at most a warning
    _refused(_run(site, user, "history", "--job", "43"), "is private to root or group")
    _refused(_run(site, user, "report", "42"), "job 42 belongs to uid 4242; only uid 4242, root")
    _refused(_run(site, user, "report", "999"), "no summary of job 999 you may read", "private")
    rc, out, err = _run(site, user, "evidence", "show", "43", "--json")
    assert rc == 2 and "no evidence bundle for job 43" in err  # a summary, no manifest
    _refused(_run(site, user, "evidence", "list"), "only root may list", "evidence show JOBID")


@root_only
@needs_user_python
def test_root_and_the_admin_group_read_any_job(site: Path, user: str, admin_group: str) -> None:
    _open_db_like_an_old_install(site)
    runs = [(None, "report"), (admin_group, "report"), (admin_group, "history")]
    for group, command in runs:
        who = None if group is None else user
        args = ["42"] if command == "report" else ["--job", "42"]
        rc, out, err = _run(site, who, command, *args, "--json", group=group)
        assert rc == 0 and '"job_id": "42"' in out, err


@root_only
@needs_user_python
def test_a_caller_without_a_user_name_cannot_read_a_job_whose_owner_is_unknown(
    site: Path,
) -> None:
    """A uid with no passwd entry has no name; a job recorded without an owner has none
    either: the two must not match (only admins read a job whose owner is unknown)."""
    with History(site / "lib" / "history" / "history.db") as h:
        run = {"run_id": "p44", "ts": 1.7e9, "node": "n1", "job_id": "44", "phase": "prolog",
               "status": "ok", "gpus": [0]}  # fmt: skip
        job = {"job_id": "44", "node": "n1", "start_ts": 1.7e9}  # no user, no uid
        assert h.write(Batch(inserts=[("check_runs", run)], upserts=[("jobs", job, "job_id")]))
    _open_db_like_an_old_install(site)
    rc, out, err = _run(site, None, "report", "44", "--json")
    assert rc == 0 and '"44"' in out, err  # root reads it: the job is there
    _refused(_run(site, None, "report", "44", uid=54321), "job 44 belongs to an unknown user")
    _refused(_run(site, None, "history", "--job", "44", uid=54321), "an unknown user")
