"""Retention: a prune deletes what is due and nothing else, never more rows than its
bound, and the hooks' prune never fails them."""

from __future__ import annotations

import json
import logging
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmhealth.config import Config, PathsConfig
from slurmhealth.errors import ConfigError
from slurmhealth.history import Batch, History
from slurmhealth.history.retention import BATCH_ROWS, Retention, prune_quietly
from tests.unit.history.helpers import REPO, query

DAY = 86400.0
NOW = 1_800_000_000.0


def _history(path: Path) -> None:
    """Samples 30 days old (12,000) and 1 day old (100), rollups 500 and 10 days old,
    records 2,000 days and 1 day old, a node drained long ago and never resumed."""
    old, new = NOW - 30 * DAY, NOW - DAY

    def sample(ts: float, i: int) -> tuple[str, dict[str, object]]:
        return ("samples", {"ts": ts + i, "node": "n1", "job_id": "1", "gpu": i % 8,
                            "util_pct": 50.0})  # fmt: skip

    def event(ts: float, node: str = "n1") -> tuple[str, dict[str, object]]:
        return ("events", {"ts": ts, "node": node, "job_id": "1", "kind": "xid",
                           "severity": "fail", "message": "m"})  # fmt: skip

    ancient = NOW - 2000 * DAY
    with History(path) as h:
        h.write(Batch(inserts=[sample(old, i) for i in range(12_000)]))
        h.write(Batch(inserts=[sample(new, i) for i in range(100)]))
        h.write(Batch(inserts=[sample(NOW - 500 * DAY, 0), sample(NOW - 10 * DAY, 0)]))
        h.write(Batch(inserts=[event(ancient), event(new)], kv={"kernel_log_cursor": "c"}))
        for node, ts in (("n1", ancient), ("n1", ancient + 1), ("n2", ancient)):
            h.write(Batch(inserts=[("drains", {"ts": ts, "node": node, "state": "drained",
                                               "reason": "r", "actor": "prolog"})]))  # fmt: skip
    with sqlite3.connect(path) as conn:  # the 500-day-old raw sample: only its rollup left
        conn.execute("delete from samples where ts < ?", (NOW - 100 * DAY,))


def test_prune_is_bounded_and_keeps_what_it_must(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    _history(path)
    policy = Retention(raw_samples_days=14, rollups_days=400, records_days=1825, max_rows=7000)
    [(rollups,)] = query(path, "select count(*) from sample_rollups")
    with History(path) as h:
        first = h.prune(policy, now=NOW)
        assert first.deleted == {"samples": 7000} and not first.complete
        rest = h.prune(policy, now=NOW)
        again = h.prune(policy, now=NOW)
    assert rest.complete and rest.deleted == {"samples": 5000, "sample_rollups": 1,
                                              "events": 1, "drains": 1}  # fmt: skip
    assert again.total == 0 and again.complete
    assert query(path, f"select count(*) from samples where ts < {NOW - 14 * DAY}") == [(0,)]
    assert query(path, "select count(*) from samples") == [(101,)]  # 1 and 10 days old
    assert query(path, "select count(*) from sample_rollups") == [(rollups - 1,)]
    assert query(path, "select count(*) from events") == [(1,)]
    # the newest drain of each node stays, however old: it says the drain is in force
    assert query(path, "select node, ts from drains order by node") == [
        ("n1", NOW - 2000 * DAY + 1),
        ("n2", NOW - 2000 * DAY),
    ]
    assert query(path, "select value from kv where key = 'kernel_log_cursor'") == [('"c"',)]


def test_zero_days_keeps_forever_and_steps_stay_small(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    _history(path)
    with History(path) as h:
        kept = h.prune(Retention(0, 0, 0, 1_000_000), now=NOW)
        assert kept.total == 0 and kept.complete
        result = h.prune(Retention(14, 0, 0, 1_000_000), now=NOW)
    assert result.deleted == {"samples": 12_000}
    assert BATCH_ROWS <= 10_000  # each transaction short: a prolog waits milliseconds at most


def test_the_hooks_prune_logs_and_never_raises(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "not-a-db"
    folder.mkdir()
    cfg = Config(paths=PathsConfig(db=str(folder)))
    with caplog.at_level(logging.WARNING), History(folder) as h:
        assert prune_quietly(h, cfg) is None
    assert "not pruned" in caplog.text


def test_history_config_is_range_checked(tmp_path: Path) -> None:
    from slurmhealth.config import load_config

    bad = tmp_path / "c.toml"
    bad.write_text("[history]\nraw_samples_days = -1\n")
    with pytest.raises(ConfigError, match=r"history\.raw_samples_days"):
        load_config(str(bad), env={})
    bad.write_text("[history]\nprune_max_rows = 10\n")
    with pytest.raises(ConfigError, match=r"history\.prune_max_rows"):
        load_config(str(bad), env={})
    good = tmp_path / "g.toml"
    good.write_text("[history]\nraw_samples_days = 7\nrollups_days = 0\n")
    assert load_config(str(good), env={}).history.raw_samples_days == 7


def test_history_prune_command(tmp_path: Path) -> None:
    path, now = tmp_path / "h.db", time.time()
    rows = [("samples", {"ts": now - days * DAY, "node": "n1", "job_id": "1", "gpu": 0,
                         "util_pct": 1.0}) for days in (30, 20, 1)]  # fmt: skip
    with History(path) as h:
        h.write(Batch(inserts=rows))
    cmd = [sys.executable, "-m", "slurmhealth", "--db", str(path), "history", "prune",
           "--max-rows", "1", "--all", "--json"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["schema"] == "slurmhealth.history-prune/1" and doc["complete"]
    assert doc["deleted"] == {"samples": 2} and doc["retention"]["max_rows"] == 1
    assert query(path, "select count(*) from samples") == [(1,)]
