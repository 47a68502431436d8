"""The prune's rules one at a time: the config it follows, the clock it reads, a budget of
0 or 1 rows, a kind kept forever beside one that is not, and what the hooks' prune logs."""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path

import pytest

from slurmhealth.config import Config, load_config
from slurmhealth.history import Batch, History
from slurmhealth.history.retention import Retention, policy, prune_quietly
from tests.unit.history.helpers import query

DAY = 86400.0


def _rows(h: History, ts: float, n: int = 3) -> None:
    samples = [("samples", {"ts": ts + i, "node": "n1", "job_id": "1", "gpu": 0,
                            "util_pct": 1.0}) for i in range(n)]  # fmt: skip
    events = [("events", {"ts": ts + i, "node": "n1", "job_id": "1", "kind": "xid",
                          "severity": "fail", "message": "m"}) for i in range(n)]  # fmt: skip
    assert h.write(Batch(inserts=samples + events))


def _hooks_cfg(db: Path) -> Config:
    """A node whose raw samples are kept 1 day, 1000 rows pruned per run."""
    flags = {"paths.db": str(db), "history.raw_samples_days": 1, "history.prune_max_rows": 1000}
    return load_config(os.devnull, env={}, flags=flags)


def test_the_policy_is_the_history_section() -> None:
    flags = {"history.raw_samples_days": 1, "history.rollups_days": 2,
             "history.records_days": 3, "history.prune_max_rows": 20_000}  # fmt: skip
    assert policy(load_config(os.devnull, env={}, flags=flags)) == Retention(1, 2, 3, 20_000)


def test_without_a_time_the_prune_reads_the_clock(tmp_path: Path) -> None:
    with History(tmp_path / "h.db") as h:
        _rows(h, time.time() - 3 * DAY)
        _rows(h, time.time() - 60)
        result = h.prune(Retention(2, 0, 0, 1000))
    assert result.deleted == {"samples": 3} and result.complete
    assert 0 < result.seconds < 60  # measured, not a default


def test_a_budget_of_0_deletes_nothing_and_1_deletes_one(tmp_path: Path) -> None:
    now = 2_000_000_000.0
    with History(tmp_path / "h.db") as h:
        _rows(h, now - 3 * DAY)
        none = h.prune(Retention(2, 0, 2, 0), now=now)
        assert none.deleted == {} and none.complete is False
        one = h.prune(Retention(2, 0, 2, 1), now=now)
        assert one.deleted == {"samples": 1} and one.complete is False
        rest = h.prune(Retention(2, 0, 2, 10), now=now)
    assert rest.deleted == {"samples": 2, "events": 3} and rest.complete is True


def test_a_kind_kept_forever_does_not_stop_the_kinds_after_it(tmp_path: Path) -> None:
    now = 2_000_000_000.0
    with History(tmp_path / "h.db") as h:
        _rows(h, now - 3 * DAY)
        result = h.prune(Retention(0, 0, 2, 1000), now=now)  # samples forever, records 2 days
    assert result.deleted == {"events": 3}
    assert query(tmp_path / "h.db", "select count(*) from samples") == [(3,)]


def test_the_hooks_prune_logs_what_it_did_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "h.db"
    cfg = _hooks_cfg(db)
    with History(db) as h:
        _rows(h, time.time() - 3 * DAY)
        _rows(h, time.time() - 3000 * DAY)  # records older than the 5 years kept
        with caplog.at_level(logging.INFO, logger="slurmhealth.history"):
            result = prune_quietly(h, cfg)
            assert result is not None
            assert result.deleted == {"samples": 6, "sample_rollups": 1, "events": 3}
            assert prune_quietly(h, cfg) is not None  # nothing left: nothing logged
    [line] = caplog.messages
    assert re.fullmatch(
        rf"history {re.escape(str(db))}: pruned 10 rows in \d+\.\d\d s "
        r"\(samples 6, sample_rollups 1, events 3\)",
        line,
    )


def test_the_hooks_prune_says_when_more_is_due(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "h.db"
    cfg = _hooks_cfg(db)
    with History(db) as h:
        _rows(h, time.time() - 3 * DAY, n=1200)
        with caplog.at_level(logging.INFO, logger="slurmhealth.history"):
            assert prune_quietly(h, cfg) is not None
    [line] = caplog.messages
    assert re.fullmatch(
        rf"history {re.escape(str(db))}: pruned 1000 rows in \d+\.\d\d s, more next time "
        r"\(samples 1000\)",
        line,
    )


def test_the_hooks_prune_names_the_history_it_could_not_prune(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "not-a-db"
    folder.mkdir()
    cfg = load_config(os.devnull, env={}, flags={"paths.db": str(folder)})
    with caplog.at_level(logging.WARNING), History(folder) as h:
        assert prune_quietly(h, cfg) is None
    [line] = caplog.messages
    assert line.startswith(f"history {folder} not pruned: ") and not line.endswith(": None")
