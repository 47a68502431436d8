"""The history's write side: schema and migrations, batches, concurrent writers."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slurmhealth.history import COLUMNS, Batch, History, migration
from slurmhealth.history.read import job_row, runs
from slurmhealth.history.schema import latest_version
from tests.unit.history.helpers import REPO, query, run_batch, run_writers


def test_fresh_db_gets_schema_and_reopening_does_not_migrate_again(tmp_path: Path) -> None:
    db = tmp_path / "var" / "lib" / "history.db"
    with History(db) as history:
        assert history.integrity_check() == "ok"
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o750
    tables = {name for (name,) in query(db, "SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables >= set(COLUMNS) | {"schema_migrations"}
    first = query(db, "SELECT version, name, applied_at FROM schema_migrations")
    assert [(v, n) for v, n, _ in first] == [
        (1, "initial schema"),
        (2, "sample metrics as columns"),
        (3, "samples without the JSON duplicate; per-GPU rollups"),
        (4, "remediation steps"),
        (5, "baselines keep the value as the tool printed it"),
    ]
    assert query(db, "PRAGMA user_version") == [(latest_version(),)]
    assert query(db, "PRAGMA journal_mode") == [("wal",)]
    indexes = {name for (name,) in query(db, "SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"idx_check_runs_node_ts", "idx_findings_run_id", "idx_samples_ts"} <= indexes

    with History(db) as again:
        assert again.write(run_batch("r1", 1.0))
    assert query(db, "SELECT version, name, applied_at FROM schema_migrations") == first


def test_current_db_write_does_not_import_sqlite_utils(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    History(db).write(Batch(kv={"warm": True}))
    code = textwrap.dedent(f"""
        import sys
        from slurmhealth.history import Batch, History
        assert History({str(db)!r}).write(Batch(kv={{"x": 1}}))
        print("sqlite_utils" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == "False"


def test_batch_writes_run_findings_and_kv(tmp_path: Path) -> None:
    history = History(tmp_path / "history.db")
    older = run_batch("r1", 100.0, job="41")
    newer = run_batch("r2", 200.0)
    newer.inserts.append(("findings", {**newer.inserts[1][1], "severity": "warn",
                                       "severity_value": 20, "gpu": None}))  # fmt: skip
    newer.kv = {"last_run": {"run_id": "r2", "status": "fail"}, "count": 2}
    assert history.write(older)
    assert history.write(newer)

    found = runs(history)
    assert [r["run_id"] for r in found] == ["r2", "r1"]
    assert found[0]["gpus"] == [0, 1]
    assert [f["severity"] for f in found[0]["findings"]] == ["fail", "warn"]
    assert found[0]["findings"][0]["evidence"] == {"xid": 79}
    assert len(found[1]["findings"]) == 1
    assert [r["run_id"] for r in runs(history, job="41")] == ["r1"]
    assert [r["run_id"] for r in runs(history, since=150.0)] == ["r2"]
    assert runs(history, node="other") == []
    assert len(runs(history, limit=1)) == 1
    assert history.kv_get("last_run") == {"run_id": "r2", "status": "fail"}
    assert history.kv_get("count") == 2
    assert history.kv_get("missing", "dflt") == "dflt"


def test_jobs_upsert_merges_and_none_keeps_known_values(tmp_path: Path) -> None:
    history = History(tmp_path / "history.db")
    prolog = {"job_id": "7", "node": "n1", "user": "ada", "partition": "gpu", "start_ts": 1.0}
    epilog = {"job_id": "7", "user": None, "end_ts": 9.0, "exit_code": "0:0", "state": "COMPLETED"}
    assert history.write(Batch(upserts=[("jobs", prolog, "job_id")]))
    assert history.write(Batch(upserts=[("jobs", epilog, "job_id")]))
    job = job_row(history, "7")
    assert job is not None
    assert (job["user"], job["partition"], job["start_ts"], job["end_ts"], job["state"]) == (
        "ada", "gpu", 1.0, 9.0, "COMPLETED")  # fmt: skip


def test_malformed_batch_is_a_bug_and_raises(tmp_path: Path) -> None:
    history = History(tmp_path / "history.db")
    with pytest.raises(ValueError, match="unknown table"):
        history.write(Batch(inserts=[("nope", {"a": 1})]))
    with pytest.raises(ValueError, match="bogus"):
        history.write(Batch(inserts=[("check_runs", {"run_id": "r", "bogus": 1})]))
    with pytest.raises(ValueError, match="primary key"):
        history.write(Batch(upserts=[("jobs", {"node": "n1"}, "job_id")]))
    assert not (tmp_path / "history.db.spool.jsonl").exists()
    with pytest.raises(ValueError, match="duplicate"):
        migration(1, "again")(lambda db: None)


def test_two_processes_writing_at_once_into_a_fresh_db(tmp_path: Path) -> None:
    db = tmp_path / "fresh" / "history.db"
    assert run_writers(db, ["a", "b"], 500) == ["500", "500"]
    assert query(db, "SELECT count(*) FROM check_runs") == [(1000,)]
    assert query(db, "SELECT count(*) FROM findings") == [(1000,)]
    assert query(db, "SELECT count(*) FROM schema_migrations") == [(latest_version(),)]
    assert query(db, "PRAGMA integrity_check") == [("ok",)]


def test_many_processes_opening_a_fresh_db_at_once_all_write(tmp_path: Path) -> None:
    db = tmp_path / "fresh" / "history.db"
    tags = [f"p{i}" for i in range(8)]
    assert run_writers(db, tags, 1) == ["1"] * 8
    assert query(db, "SELECT count(*) FROM check_runs") == [(8,)]
    assert query(db, "SELECT version FROM schema_migrations") == [
        (v,) for v in range(1, latest_version() + 1)
    ]


def test_a_version_1_database_gains_the_sample_columns(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    old = {c: t for c, t in COLUMNS["samples"].items() if c in
           ("id", "ts", "node", "job_id", "gpu", "uuid", "metrics")}  # fmt: skip
    with sqlite3.connect(db) as conn:
        cols = ", ".join(f"{c} {t}" + (" PRIMARY KEY" if c == "id" else "") for c, t in old.items())
        conn.execute(f"CREATE TABLE samples ({cols})")
        conn.execute("INSERT INTO samples (ts, node, job_id, gpu, metrics) VALUES "
                     "(1.0, 'n1', '7', 0, '{\"utilization_gpu_pct\": 55}')")  # fmt: skip
        conn.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT, "
                     "applied_at REAL)")  # fmt: skip
        conn.execute("INSERT INTO schema_migrations VALUES (1, 'initial schema', 0)")
        conn.execute("PRAGMA user_version = 1")
    with History(db) as history:
        row = {"ts": 2.0, "node": "n1", "job_id": "7", "gpu": 0, "metrics": {}, "util_pct": 60.0}
        assert history.write(Batch(inserts=[("samples", row)]))
    have = {name for (_, name, *_) in query(db, "PRAGMA table_info(samples)")}
    assert set(COLUMNS["samples"]) <= have
    # migration 3 moves the old row's JSON field into its column, leaving no JSON behind
    assert query(db, "SELECT util_pct, metrics FROM samples ORDER BY ts") == [
        (55.0, None),
        (60.0, None),
    ]
    assert query(db, "PRAGMA user_version") == [(latest_version(),)]
