"""The kernel-log position's rules at their edges: which stored positions are readable, which
of two is newer, when the state file may stand, and how it is read and written (root's file:
no symlinks, no FIFOs, no files others may write, bounded, atomic). A wrong answer here reads
an old Xid again (a second drain) or skips a new one."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from slurmhealth.kernel_log import position
from slurmhealth.kernel_log.position import (
    REFRESH_S,
    SCHEMA,
    STATE_SUFFIX,
    decode,
    load,
    newest,
    save,
    state_path,
    still_good,
)

MAX_BYTES = 64 * 1024


def kmsg(seq: int = 5, **extra: Any) -> dict[str, Any]:
    return {"source": "kmsg", "boot_id": "b1", "seq": seq, **extra}


def dmesg(usec: int, n_at: int, **extra: Any) -> dict[str, Any]:
    return {"source": "dmesg", "boot_id": "b1", "usec": usec, "n_at": n_at, **extra}


def journal(cursor: str | None, **extra: Any) -> dict[str, Any]:
    return {"source": "journalctl", "cursor": cursor, **extra}


# -- readable or not ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("boot_id", "readable"),
    [("", False), ("b", True), ("x" * 4096, True), ("x" * 4097, False), ("b\0", False)],
)
def test_a_string_field_is_one_to_4096_characters_without_nul(boot_id: str, readable: bool) -> None:
    assert (decode(kmsg(boot_id=boot_id)) is not None) is readable


@pytest.mark.parametrize(
    ("pos", "readable"),
    [
        (kmsg(seq=-1), True),  # kmsg's "nothing read yet"
        (kmsg(seq=-2), False),
        (kmsg(seq=2**63 - 1), True),
        (kmsg(seq=2**63), False),
        (kmsg(seq=True), False),
        (dmesg(0, 0), True),
        (dmesg(0, -1), False),  # n_at counts: never below 0
        (dmesg(-1, 0), True),
    ],
)
def test_integer_fields_keep_their_ranges(pos: dict[str, Any], readable: bool) -> None:
    assert (decode(pos) is not None) is readable


@pytest.mark.parametrize(
    ("saved", "readable"),
    [(0, True), (0.5, True), (-0.1, False), (99_999_999_999.0, True), (1e11, False),
     (float("nan"), False), (True, False)],
)  # fmt: skip
def test_times_are_finite_utc_seconds_from_0_to_before_1e11(saved: Any, readable: bool) -> None:
    got = decode(kmsg(saved=saved))
    assert (got is not None) is readable
    if got is not None:
        assert got["saved"] == float(saved) and isinstance(got["saved"], float)


# -- the newer of two -------------------------------------------------------------------------
def test_newest_without_one_of_them_is_the_other() -> None:
    a = decode(kmsg(3))
    assert newest(a, None) is a and newest(None, a) is a and newest(None, None) is None


def test_newest_in_one_stream_is_the_one_further_along_and_a_tie_keeps_the_first() -> None:
    early, late = decode(dmesg(5, 0, saved=9)), decode(dmesg(5, 1, saved=1))
    assert newest(early, late) is late and newest(late, early) is late  # n_at breaks a tie
    same = decode(dmesg(5, 1, saved=2))
    assert newest(late, same) is late and newest(same, late) is same


def test_newest_across_streams_is_the_one_saved_later_and_a_tie_keeps_the_first() -> None:
    a, b = decode(kmsg(9, saved=10)), decode(dmesg(1, 0, saved=20))
    assert newest(a, b) is b and newest(b, a) is b
    c = decode(dmesg(1, 0, saved=10))
    assert newest(a, c) is a and newest(c, a) is c
    unsaved = decode(dmesg(7, 0))  # another stream, no time: the saved one wins
    assert newest(unsaved, a) is a and newest(a, unsaved) is a


def test_journal_cursors_order_within_one_seqnum_id() -> None:
    a = decode(journal("s=id=1;i=1f;b=boot;m=2"))  # the id itself may hold '='
    b = decode(journal("s=id=1;i=20;b=boot;m=1"))
    assert newest(a, b) is b and newest(b, a) is b
    other = decode(journal("s=id2;i=ff", saved=5))
    assert newest(a, other) is other  # another id: by when it was saved
    odd = decode(journal("no cursor fields", saved=1))  # not comparable: by time saved
    assert newest(odd, b) is odd and newest(b, odd) is odd


# -- when the state file may stand for the new position ---------------------------------------
def test_the_state_file_stands_only_for_quiet_reads_in_the_same_stream_within_the_hour() -> None:
    kept = decode(kmsg(5, saved=100.0))
    assert still_good(kept, decode(kmsg(5, saved=100.0 + REFRESH_S - 1)), True)  # same place
    assert still_good(kept, decode(kmsg(9, saved=200.0)), True)
    assert not still_good(kept, decode(kmsg(9, saved=200.0)), False)  # fault lines were read
    assert not still_good(kept, decode(kmsg(9, saved=100.0 + REFRESH_S)), True)
    assert not still_good(kept, decode(kmsg(4, saved=200.0)), True)  # behind the kept one
    assert not still_good(kept, decode(dmesg(9, 0, saved=200.0)), True)
    assert not still_good(kept, decode(kmsg(9, saved=200.0, old_before=50.0)), True)
    assert not still_good(decode(journal(None)), decode(journal("s=a;i=1")), True)
    assert not still_good(decode(journal("s=a;i=1")), decode(journal(None)), True)
    assert not still_good(None, kept, True) and not still_good(kept, None, True)
    unsaved = decode(kmsg(5))  # a kept copy without a time counts from 0
    assert not still_good(unsaved, decode(kmsg(5, saved=REFRESH_S + 0.5)), True)
    assert still_good(unsaved, decode(kmsg(5, saved=REFRESH_S - 0.5)), True)


@pytest.mark.parametrize(
    ("db", "expected"),
    [("", None), (":memory:", None), ("file:h.db?mode=ro", None),
     ("/var/lib/slurmhealth/history.db", "/var/lib/slurmhealth/history.db" + STATE_SUFFIX)],
)  # fmt: skip
def test_the_state_file_lives_beside_a_history_on_disk(db: str, expected: str | None) -> None:
    assert state_path(db) == expected


# -- reading the state file -------------------------------------------------------------------
def _file(tmp_path: Path, body: bytes | str, mode: int = 0o600) -> Path:
    path = tmp_path / ("history.db" + STATE_SUFFIX)
    path.write_bytes(body if isinstance(body, bytes) else body.encode())
    path.chmod(mode)
    return path


def test_the_state_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    pos = decode(kmsg(7, saved=3.0))
    assert pos is not None and save(str(path), pos) is None
    assert load(str(path)) == (pos, None)
    text = path.read_text()
    assert text == json.dumps({"schema": SCHEMA, "position": pos}, sort_keys=True)
    assert json.loads(text)["schema"] == "slurmhealth.kernel-position/1"
    assert oct(path.stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize(
    ("mode", "why"),
    [(0o620, "writable by others (mode 620)"), (0o602, "writable by others (mode 602)"),
     (0o601, None), (0o644, None)],
)  # fmt: skip
def test_a_state_file_others_may_write_is_ignored(
    tmp_path: Path, mode: int, why: str | None
) -> None:
    body = json.dumps({"schema": SCHEMA, "position": kmsg(7)})
    path = _file(tmp_path, body, mode)
    got = load(str(path))
    assert got == (
        (None, f"kernel-log state file {path} ignored: {why}") if why else (kmsg(7), None)
    )


def test_unreadable_state_files_say_why_in_one_line(tmp_path: Path) -> None:
    garbage = _file(tmp_path, "{not json")
    assert load(str(garbage)) == (
        None,
        f"kernel-log state file {garbage} ignored: not a readable kernel-log position",
    )
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    assert load(str(fifo)) == (None, f"kernel-log state file {fifo} ignored: not a regular file")
    link = tmp_path / "link"
    link.symlink_to(garbage)
    assert load(str(link)) == (None, f"kernel-log state file {link} ignored: a symlink")
    (tmp_path / "plain").write_text("")
    below = tmp_path / "plain" / "state.json"
    assert load(str(below)) == (None, f"kernel-log state file {below} ignored: Not a directory")
    assert load(str(tmp_path / "missing")) == (None, None)


def test_a_state_file_over_64_kib_is_ignored_and_one_at_the_limit_is_read(tmp_path: Path) -> None:
    body = json.dumps({"schema": SCHEMA, "position": kmsg(7)})
    at_limit = _file(tmp_path, body + " " * (MAX_BYTES - len(body)))
    assert load(str(at_limit)) == (kmsg(7), None)
    over = _file(tmp_path, body + " " * (MAX_BYTES + 1 - len(body)))
    assert load(str(over)) == (
        None,
        f"kernel-log state file {over} ignored: larger than 65536 bytes",
    )


def test_a_read_error_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _file(tmp_path, json.dumps({"schema": SCHEMA, "position": kmsg(7)}))

    def failing_read(fd: int, n: int) -> bytes:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(position.os, "read", failing_read)
    assert load(str(path)) == (None, f"kernel-log state file {path} ignored: Input/output error")


# -- writing it -------------------------------------------------------------------------------
def test_save_writes_beside_the_file_never_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    state = tmp_path / "state"
    state.mkdir()
    assert save(str(state / "s.json"), kmsg(1)) is None
    assert list(elsewhere.iterdir()) == [] and [p.name for p in state.iterdir()] == ["s.json"]


def test_save_never_follows_a_symlink_planted_at_its_temporary_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    monkeypatch.setattr(position.os, "urandom", lambda n: b"\x00" * n)
    target = tmp_path / "s.json"
    (tmp_path / f".s.json.{os.getpid()}.00000000.tmp").symlink_to(victim)
    why = save(str(target), kmsg(1))
    assert why == f"cannot write kernel-log state file {target}: File exists"
    assert victim.read_text() == "keep me" and not target.exists()


def test_a_save_that_cannot_write_says_why_without_an_errno(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "s.json"
    assert save(str(target), kmsg(1)) == (
        f"cannot write kernel-log state file {target}: No such file or directory"
    )
