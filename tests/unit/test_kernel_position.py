"""The kernel-log position kept twice (history and a root-owned state file): what a check
does when the history is lost, which copy wins, which state files are refused, and that no
stored value -- however malformed -- breaks a check."""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmhealth.config import Config, load_config
from slurmhealth.hooks.check import CURSOR_KEY, CheckResult, run_check
from slurmhealth.kernel_log import KernelLogReader, format_kmsg_record
from slurmhealth.kernel_log.position import (
    REFRESH_S,
    decode,
    load,
    newest,
    save,
    state_path,
    still_good,
)
from slurmhealth.model import Action, Severity
from tests.conftest import SCENARIOS, run_cli
from tests.support.skips import unavailable

BUS = "0000:18:00"
XID79 = f"NVRM: Xid (PCI:{BUS}): 79, pid=1234, name=python3, GPU has fallen off the bus."


class Node:
    """A simulated node whose kernel log is a kmsg-format file we append to."""

    def __init__(self, tmp_path: Path) -> None:
        state = tmp_path / "state"
        state.mkdir(mode=0o700)
        self.log = tmp_path / "kmsg.log"
        self.log.touch()
        self.db = state / "history.db"
        self.state_file = Path(str(state_path(str(self.db))))
        (tmp_path / "config.toml").write_text("")
        self.cfg: Config = load_config(
            str(tmp_path / "config.toml"),
            env={},
            flags={
                "node.name": "node1",
                "gpu.backend": "sim",
                "gpu.sim_scenario": str(SCENARIOS / "healthy.toml"),
                "gpu.sim_kernel_log": str(tmp_path / "sim-kmsg"),
                "kernel_log.source": str(self.log),
                "paths.db": str(self.db),
            },
        )
        self.seq = 0

    def xid(self, ago_s: float = 31 * 60, text: str = XID79) -> None:
        """Append ``text`` as a kmsg record logged ``ago_s`` seconds ago (in this boot)."""
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        usec = int(max(uptime - min(ago_s, uptime - 1), 0) * 1e6)
        self.seq += 1
        with self.log.open("a") as f:
            f.write(format_kmsg_record(self.seq, usec, text) + "\n")

    def check(self) -> CheckResult:
        return run_check(self.cfg)

    def lose_history(self) -> None:
        for p in self.db.parent.glob("history.db*"):
            if p != self.state_file:
                p.unlink()


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def xids(result: CheckResult) -> list[tuple[int, Severity, Action, bool]]:
    return [
        (f.evidence["xid"], f.severity, f.action, bool(f.evidence.get("predates_position")))
        for f in result.findings
        if f.check == "xid"
    ]


OLD_79 = (79, Severity.WARN, Action.RECORD, True)


# -- what a check does -----------------------------------------------------------------------
def test_fresh_node_records_an_old_xid_and_never_drains_for_it(node: Node) -> None:
    node.xid(ago_s=31 * 60)
    first = node.check()
    assert (first.exit_code, first.status, xids(first)) == (0, "warn", [OLD_79])
    (f,) = first.findings
    assert "recorded, not acted on" in f.message and "Xid 79" in f.message
    assert any("rebuilt" in n for n in first.notes)
    node.xid(ago_s=0)  # a new fault after the rebuilt position acts
    second = node.check()
    assert second.exit_code == 1
    assert [(x, s >= Severity.FAIL, a.takes_node_out, p) for x, s, a, p in xids(second)] == [
        (79, True, True, False)
    ]


def test_lost_history_reads_on_from_the_state_file(node: Node) -> None:
    node.check()
    node.xid(ago_s=60)
    assert node.check().exit_code == 1  # seen once, acted on
    node.lose_history()  # disk full, restored, moved: the db's position is gone
    after = node.check()
    assert (after.exit_code, xids(after)) == (0, [])  # not read again
    assert node.db.exists()  # a fresh history, its position taken from the state file


def test_history_and_state_file_both_lost_records_without_draining(node: Node) -> None:
    node.check()
    node.xid(ago_s=31 * 60)
    assert node.check().exit_code == 1
    node.lose_history()
    node.state_file.unlink()
    after = node.check()
    assert (after.exit_code, xids(after)) == (0, [OLD_79])


def test_restored_history_older_than_the_state_file(node: Node, tmp_path: Path) -> None:
    node.check()
    shutil.copy(node.db, tmp_path / "backup.db")  # the history as it was before the Xid
    node.xid(ago_s=60)
    assert node.check().exit_code == 1
    node.lose_history()
    shutil.copy(tmp_path / "backup.db", node.db)
    after = node.check()
    assert (after.exit_code, xids(after)) == (0, [])  # the state file is further along


def test_state_file_older_than_the_history(node: Node, tmp_path: Path) -> None:
    node.check()
    shutil.copy(node.state_file, tmp_path / "old-state.json")
    node.xid(ago_s=60)
    assert node.check().exit_code == 1
    os.replace(tmp_path / "old-state.json", node.state_file)  # its last write was lost
    after = node.check()
    assert (after.exit_code, xids(after)) == (0, [])  # the history is further along


def test_quiet_reads_leave_the_state_file_alone(node: Node) -> None:
    node.check()
    kept = node.state_file.read_bytes()
    node.xid(ago_s=30, text="usb 1-1: new high-speed USB device number 2 using xhci_hcd")
    assert node.check().findings == ()
    assert node.state_file.read_bytes() == kept  # no fault read: no rewrite, no fsync
    node.lose_history()
    assert node.check().findings == ()  # read on from the file's position: nothing new
    node.xid(ago_s=10)
    assert node.check().exit_code == 1
    assert node.state_file.read_bytes() != kept  # a fault read: the position is saved


def _plant(node: Node, how: str, elsewhere: Path) -> None:
    """Replace the state file by one that must not be trusted."""
    good = node.state_file.read_bytes()
    node.state_file.unlink()
    if how == "symlink":
        elsewhere.write_bytes(good)
        node.state_file.symlink_to(elsewhere)
    elif how == "fifo":
        os.mkfifo(node.state_file, 0o600)
    else:
        node.state_file.write_bytes(good)
        node.state_file.chmod(0o620 if how == "group-writable" else 0o600)
        if how == "foreign-owner":
            os.chown(node.state_file, 4242, 4242)


@pytest.mark.parametrize("how", ["symlink", "foreign-owner", "group-writable", "fifo"])
def test_untrusted_state_file_is_ignored_loudly(
    node: Node, tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    if how == "foreign-owner" and os.geteuid() != 0:
        unavailable("chown to another user needs root")
    node.xid(ago_s=60)
    node.check()  # the position now lies after the Xid
    node.lose_history()
    _plant(node, how, tmp_path / "target.json")
    planted = (tmp_path / "target.json").read_bytes() if how == "symlink" else b""
    with caplog.at_level(logging.WARNING, logger="slurmhealth.check"):
        after = node.check()
    # not trusted: the position is rebuilt, the Xid recorded again, never acted on
    assert (after.exit_code, xids(after)) == (0, [OLD_79])
    why = {"symlink": "symlink", "foreign-owner": "owned by uid 4242", "fifo": "regular file"}
    warned = [r.getMessage() for r in caplog.records if str(node.state_file) in r.getMessage()]
    assert warned and why.get(how, "writable by others") in warned[0]
    if how == "symlink":
        assert node.state_file.is_file() and not node.state_file.is_symlink()
        assert (tmp_path / "target.json").read_bytes() == planted  # never written through


def _store_cursor(db: Path, value: Any) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE kv SET value = ? WHERE key = ?", (json.dumps(value), CURSOR_KEY))


@pytest.mark.parametrize(
    "value",
    ["12345", {"source": "kmsg", "boot_id": "b", "seq": "12a"}, [1, 2], 7.5],
    ids=["string", "non-numeric-seq", "list", "number"],
)
def test_malformed_stored_cursor_never_breaks_check(
    sim_env: Any, tmp_path: Path, value: Any
) -> None:
    env = sim_env("healthy", SLURMHEALTH_KERNEL_LOG=str(tmp_path / "kmsg.log"))
    (tmp_path / "kmsg.log").write_text(format_kmsg_record(1, 1000, XID79) + "\n")
    assert run_cli("check", env=env).returncode == 0
    _store_cursor(tmp_path / "history.db", value)
    Path(str(state_path(str(tmp_path / "history.db")))).unlink()  # both copies unreadable
    proc = run_cli("check", "--json", env=env)
    assert proc.returncode == 0, proc.stderr  # was exit 3 (internal error)
    assert "Traceback" not in proc.stderr
    notes = json.loads(proc.stdout)["notes"]
    assert any("unreadable" in n for n in notes) and any("rebuilt" in n for n in notes)


def test_without_a_kernel_log_no_position_is_read_kept_or_reported(
    sim_env: Any, tmp_path: Path
) -> None:
    """``kernel_log.source = "none"``: was "stored kernel-log position unreadable, ignored:
    '{}'" on every check after the first (the empty cursor of no source was stored)."""
    env = sim_env("healthy", SLURMHEALTH_KERNEL_LOG="none")
    for _ in range(2):
        proc = run_cli("check", "--json", env=env)
        assert proc.returncode == 0, proc.stderr
        notes = json.loads(proc.stdout)["notes"]
        assert not [n for n in notes if "position" in n], notes
        assert "position" not in proc.stderr, proc.stderr
    db = tmp_path / "history.db"
    with sqlite3.connect(db) as conn:
        kept = conn.execute("SELECT value FROM kv WHERE key = ?", (CURSOR_KEY,)).fetchall()
    assert kept == []
    assert not Path(str(state_path(str(db)))).exists()


# -- decoding, choosing, the state file ------------------------------------------------------
KMSG = {"source": "kmsg", "boot_id": "b1", "seq": 10, "saved": 100.0}
FILE = {"source": "file", "path": "/l", "inode": 3, "dev": 1, "offset": 7, "line": 1, "seq": None}


@pytest.mark.parametrize(
    "value",
    [
        None,
        "x",
        {"source": "kmsg", "boot_id": "b1", "seq": "10"},
        {"source": "kmsg", "boot_id": "b1", "seq": True},
        {"source": "kmsg", "boot_id": 5, "seq": 10},
        {"source": "kmsg", "boot_id": "b1"},
        {"source": "kmsg", "boot_id": "b1", "seq": 10, "saved": float("nan")},
        {"source": "file", "path": "/l", "inode": 3, "dev": 1, "offset": -1, "line": 0},
        {"source": "journalctl", "cursor": 12},
        {"source": "syslog", "seq": 1},
    ],
)
def test_malformed_positions_are_unreadable(value: Any) -> None:
    assert decode(value) is None


def test_good_positions_decode_to_themselves() -> None:
    assert decode(KMSG) == KMSG and decode(FILE) == FILE
    assert decode({"source": "journalctl", "cursor": None, "extra": 1}) == {
        "source": "journalctl",
        "cursor": None,
    }


def test_newest_of_two_positions() -> None:
    ahead = {**KMSG, "seq": 11, "saved": 50.0}
    assert newest(KMSG, ahead) == ahead  # same boot: further along wins, whatever the clock
    other_boot = {**KMSG, "boot_id": "b2", "seq": 1, "saved": 200.0}
    assert newest(KMSG, other_boot) == other_boot  # another boot: saved later wins
    assert newest(other_boot, KMSG) == other_boot
    j1 = {"source": "journalctl", "cursor": "s=ab;i=1f;b=x", "saved": 9.0}
    j2 = {"source": "journalctl", "cursor": "s=ab;i=20;b=x", "saved": 1.0}
    assert newest(j1, j2) == j2 and newest(None, j1) == j1 and newest(None, None) is None


def test_state_file_may_lag_only_over_quiet_records_of_the_same_stream() -> None:
    later = {**KMSG, "seq": 99, "saved": 200.0}
    assert still_good(KMSG, later, quiet=True)
    assert not still_good(KMSG, later, quiet=False)  # a fault was read
    assert not still_good(KMSG, {**later, "boot_id": "b2"}, quiet=True)  # rebooted
    assert not still_good(KMSG, {**later, "saved": 100.0 + REFRESH_S}, quiet=True)  # too old
    assert not still_good(later, KMSG, quiet=True) and not still_good(None, KMSG, quiet=True)


def test_state_file_round_trip_is_private_and_atomic(tmp_path: Path) -> None:
    path = str(tmp_path / "history.db.kernel-position.json")
    assert load(path) == (None, None)  # missing: nothing to say
    assert save(path, KMSG) is None
    assert load(path) == (KMSG, None)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.db.kernel-position.json"]
    Path(path).write_text("{not json")
    pos, why = load(path)
    assert pos is None and why and "not a readable kernel-log position" in why


def test_state_file_write_failure_is_a_message(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    why = save(str(blocker / "x.json"), KMSG)
    assert why and str(blocker) in why


def test_reader_rebuilds_on_any_unreadable_cursor(tmp_path: Path) -> None:
    log = tmp_path / "kmsg.log"
    log.write_text(format_kmsg_record(1, 1000, XID79) + "\n")
    r = KernelLogReader(str(log), boot_time=time.time() - 600)
    for bad in ("12345", {"source": "file", "offset": "NaN"}, [1], {"source": "kmsg", "seq": 3}):
        res = r.read_new(bad, time.time())
        assert res.available and res.rebuilt and res.events == ()
        assert [e.xid for e in res.old_events] == [79]
        assert r.read_new(res.cursor, time.time()).old_events == ()


# -- fuzzing -------------------------------------------------------------------------------------
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-3, max_value=2**64)
    | st.floats()
    | st.text(max_size=6)
    | st.sampled_from(["kmsg", "file", "s=a;i=1f"])
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=4,
)
_KEYS = ["boot_id", "seq", "usec", "n_at", "cursor", "path", "inode", "dev", "offset", "line"]
_NEAR = st.fixed_dictionaries(  # shaped like a position, any value in any field
    {"source": st.sampled_from(["kmsg", "dmesg", "journalctl", "file", "x"])},
    optional={k: _SCALARS for k in [*_KEYS, "saved", "old_before"]},
)


_ODD: list[Any] = [None, "", "12a", "NaN", -2, 2**70, 1.5, float("inf"), True, [], {}, "\0"]


def _variants(value: Any) -> list[Any]:
    """``value`` and, for a table, each field swapped for each odd value (and removed)."""
    if not isinstance(value, dict):
        return [value]
    out = [value]
    for key in [*value, "saved"]:
        out += [{**value, key: odd} for odd in _ODD]
        out.append({k: v for k, v in value.items() if k != key})
    return out


@settings(max_examples=1_000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_NEAR, _JSON)
def test_fuzz_decode_is_a_position_or_none(near: dict[str, Any], other: Any) -> None:
    """1,000 examples, each a value shaped like a position with every field (at least
    ``source`` and ``saved``) swapped for each of 12 odd values and removed, plus any JSON
    value: at least 1,000 x (1 + 2 x 13 + 1) = 28,000 stored values. Each is a position or
    unreadable, never an error."""
    for v in [*_variants(near), other]:
        pos = decode(v)
        assert pos is None or decode(pos) == pos
        assert newest(pos, decode(v)) == pos


@settings(max_examples=300, deadline=None)
@given(st.one_of(_JSON, _NEAR))
def test_fuzz_reader_never_raises(value: Any) -> None:
    res = _FUZZ_READER.read_new(value, time.time())
    assert res.available and (res.rebuilt or decode(value) is not None)


_FUZZ_READER = KernelLogReader("/dev/null")  # an empty file source
