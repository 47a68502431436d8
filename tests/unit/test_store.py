"""The per-node history database: schema, batches, concurrency, and the spool."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from slurmhealth.errors import StoreError
from slurmhealth.store import COLUMNS, Batch, History, migration

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def systmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep the last-resort spool (in ``tempfile.gettempdir()``) inside this test's tmp_path."""
    path = tmp_path / "systmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path


def run_batch(run_id: str, ts: float, node: str = "n1", job: str | None = "42") -> Batch:
    run = {"run_id": run_id, "ts": ts, "node": node, "job_id": job, "phase": "prolog",
           "gpus": [0, 1], "status": "fail", "exit_code": 1, "duration_s": 0.5}  # fmt: skip
    finding = {"run_id": run_id, "ts": ts, "node": node, "job_id": job, "check_name": "xid",
               "severity": "fail", "severity_value": 30, "gpu": 1, "message": "Xid 79",
               "action": "drain", "evidence": {"xid": 79}}  # fmt: skip
    return Batch(inserts=[("check_runs", run), ("findings", finding)])


def query(db: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def spooled_run_ids(spool: Path) -> list[str]:
    lines = spool.read_text().splitlines()
    return [Batch.from_json(line).inserts[0][1]["run_id"] for line in lines]


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
    ]
    assert query(db, "PRAGMA user_version") == [(2,)]
    assert query(db, "PRAGMA journal_mode") == [("wal",)]
    indexes = {name for (name,) in query(db, "SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"idx_check_runs_node_ts", "idx_findings_run_id", "idx_samples_job_id"} <= indexes

    with History(db) as again:
        assert again.write(run_batch("r1", 1.0))
    assert query(db, "SELECT version, name, applied_at FROM schema_migrations") == first


def test_current_db_write_does_not_import_sqlite_utils(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    History(db).write(Batch(kv={"warm": True}))
    code = textwrap.dedent(f"""
        import sys
        from slurmhealth.store import Batch, History
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

    runs = history.runs()
    assert [r["run_id"] for r in runs] == ["r2", "r1"]
    assert runs[0]["gpus"] == [0, 1]
    assert [f["severity"] for f in runs[0]["findings"]] == ["fail", "warn"]
    assert runs[0]["findings"][0]["evidence"] == {"xid": 79}
    assert len(runs[1]["findings"]) == 1
    assert [r["run_id"] for r in history.runs(job="41")] == ["r1"]
    assert [r["run_id"] for r in history.runs(since=150.0)] == ["r2"]
    assert history.runs(node="other") == []
    assert len(history.runs(limit=1)) == 1
    assert history.kv_get("last_run") == {"run_id": "r2", "status": "fail"}
    assert history.kv_get("count") == 2
    assert history.kv_get("missing", "dflt") == "dflt"
    rows = history.table_rows("findings", "severity_value >= ?", [30], order_by="id")
    assert [(r["run_id"], r["gpu"]) for r in rows] == [("r1", 1), ("r2", 1)]


def test_jobs_upsert_merges_and_none_keeps_known_values(tmp_path: Path) -> None:
    history = History(tmp_path / "history.db")
    prolog = {"job_id": "7", "node": "n1", "user": "ada", "partition": "gpu", "start_ts": 1.0}
    epilog = {"job_id": "7", "user": None, "end_ts": 9.0, "exit_code": "0:0", "state": "COMPLETED"}
    assert history.write(Batch(upserts=[("jobs", prolog, "job_id")]))
    assert history.write(Batch(upserts=[("jobs", epilog, "job_id")]))
    [job] = history.table_rows("jobs")
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


WRITER = """
import os, sys, time
from slurmhealth.store import Batch, History
db, tag, go, n, spool = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
open(f"{go}.{tag}", "w").close()
while not os.path.exists(go):
    time.sleep(0.001)
history, ok = History(db, spool_path=spool or None), 0
for i in range(n):
    run_id = f"{tag}-{i}"
    row = {"run_id": run_id, "ts": time.time(), "node": "n1", "status": "ok"}
    finding = {"run_id": run_id, "ts": row["ts"], "check_name": "c", "severity": "ok"}
    ok += history.write(Batch(inserts=[("check_runs", row), ("findings", finding)]))
print(ok)
"""


def start_writers(
    db: Path, tags: list[str], n: int, systmp: Path, spool: Path | None = None
) -> list[subprocess.Popen[str]]:
    """Start one writer process per tag and release them together once all are waiting."""
    go = db.parent.parent / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(systmp)}
    argv = [sys.executable, "-c", WRITER, str(db)]
    procs = []
    for tag in tags:
        with open(db.parent.parent / f"stderr.{tag}", "w") as err:  # warnings: one per spool
            cmd = [*argv, tag, str(go), str(n), str(spool or "")]
            procs.append(
                subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
            )
    deadline = time.monotonic() + 30
    while not all(Path(f"{go}.{t}").exists() for t in tags) and time.monotonic() < deadline:
        time.sleep(0.005)
    go.touch()  # all are imported and waiting: start them together
    return procs


def run_writers(db: Path, tags: list[str], n: int, systmp: Path) -> list[str]:
    """Run writers to completion; return what each printed (its number of written batches)."""
    procs = start_writers(db, tags, n, systmp)
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    errs = [(db.parent.parent / f"stderr.{tag}").read_text()[-2000:] for tag in tags]
    assert [p.returncode for p in procs] == [0] * len(tags), errs
    return outs


def test_two_processes_writing_at_once_into_a_fresh_db(tmp_path: Path, systmp: Path) -> None:
    db = tmp_path / "fresh" / "history.db"
    assert run_writers(db, ["a", "b"], 500, systmp) == ["500", "500"]
    assert query(db, "SELECT count(*) FROM check_runs") == [(1000,)]
    assert query(db, "SELECT count(*) FROM findings") == [(1000,)]
    assert query(db, "SELECT count(*) FROM schema_migrations") == [(2,)]
    assert query(db, "PRAGMA integrity_check") == [("ok",)]


def test_many_processes_opening_a_fresh_db_at_once_all_write(tmp_path: Path, systmp: Path) -> None:
    db = tmp_path / "fresh" / "history.db"
    tags = [f"p{i}" for i in range(8)]
    assert run_writers(db, tags, 1, systmp) == ["1"] * 8
    assert query(db, "SELECT count(*) FROM check_runs") == [(8,)]
    assert query(db, "SELECT version FROM schema_migrations") == [(1,), (2,)]


def test_concurrent_spooling_and_ingesting_lose_and_duplicate_nothing(
    tmp_path: Path, systmp: Path
) -> None:
    spool = tmp_path / "spool.jsonl"
    (tmp_path / "broken").write_text("")  # the writers' db cannot be opened, so they spool
    broken = tmp_path / "broken" / "history.db"
    procs = start_writers(broken, ["a", "b"], 300, systmp, spool)
    history = History(tmp_path / "history.db", spool_path=spool)
    ingested = 0
    while any(p.poll() is None for p in procs):
        ingested += history.ingest_spool()
    assert [p.communicate(timeout=60)[0].strip() for p in procs] == ["0", "0"]
    ingested += history.ingest_spool()
    assert ingested == 600
    assert query(
        tmp_path / "history.db", "SELECT count(DISTINCT run_id), count(*) FROM check_runs"
    ) == [(600, 600)]
    assert not spool.exists() and not (tmp_path / "spool.jsonl.rejected").exists()


def test_unwritable_db_spools_then_next_write_ingests(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a regular file where the db directory should be")
    db, spool = blocker / "history.db", tmp_path / "spool.jsonl"
    assert History(db, spool_path=spool).write(run_batch("r1", 1.0)) is False
    assert spooled_run_ids(spool) == ["r1"]

    blocker.unlink()
    blocker.mkdir()
    history = History(db, spool_path=spool)
    assert history.write(run_batch("r2", 2.0))
    assert [r["run_id"] for r in history.runs()] == ["r2", "r1"]
    assert all(len(r["findings"]) == 1 for r in history.runs())
    assert not spool.exists()


def test_spool_falls_back_to_tempdir_then_record_lost(
    tmp_path: Path, systmp: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("")
    db = blocker / "history.db"  # the default spool next to it cannot be written either
    fallback = systmp / f"slurmhealth-spool-{os.getuid()}.jsonl"
    assert History(db).write(run_batch("r1", 1.0)) is False
    assert spooled_run_ids(fallback) == ["r1"]

    blocker.unlink()
    history = History(db)
    assert history.ingest_spool() == 1
    assert [r["run_id"] for r in history.runs()] == ["r1"]
    assert not fallback.exists()

    monkeypatch.setattr(tempfile, "tempdir", str(blocker / "tmp"))
    blocker.rename(tmp_path / "moved")
    blocker.write_text("")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="slurmhealth.store"):
        assert History(db).write(run_batch("r2", 2.0)) is False
    [record] = caplog.records
    assert record.levelno == logging.ERROR and "lost" in record.getMessage()


def test_locked_db_spools_and_next_write_ingests(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db, spool = tmp_path / "history.db", tmp_path / "history.db.spool.jsonl"
    History(db).write(run_batch("r0", 0.5))
    locker = sqlite3.connect(db, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")
    try:
        with caplog.at_level(logging.WARNING, logger="slurmhealth.store"):
            history = History(db, busy_timeout_ms=200)
            assert history.write(run_batch("r1", 1.0)) is False
            assert spooled_run_ids(spool) == ["r1"]
            # the failed attempt to ingest r1 puts it back before r1b is spooled
            assert history.write(run_batch("r1b", 1.5)) is False
    finally:
        locker.execute("ROLLBACK")
        locker.close()
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.WARNING]
    assert str(db) in caplog.records[0].getMessage()
    assert "locked" in caplog.records[0].getMessage()
    assert spooled_run_ids(spool) == ["r1", "r1b"]

    history = History(db, busy_timeout_ms=200)
    assert history.write(run_batch("r2", 2.0))
    assert [r["run_id"] for r in history.runs()] == ["r2", "r1b", "r1", "r0"]
    assert not spool.exists()


def test_corrupt_db_spools_without_raising(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    db.write_bytes(os.urandom(8192))
    history = History(db)
    assert history.write(run_batch("r1", 1.0)) is False
    assert spooled_run_ids(tmp_path / "history.db.spool.jsonl") == ["r1"]
    assert history.integrity_check() != "ok"
    with pytest.raises(StoreError):
        history.runs()
    with pytest.raises(StoreError):
        history.kv_get("x")


def test_invalid_spool_lines_are_skipped_and_kept(tmp_path: Path) -> None:
    db, spool = tmp_path / "history.db", tmp_path / "history.db.spool.jsonl"
    good = [run_batch(f"r{i}", float(i)).to_json() for i in (1, 2)]
    bad = ['{"inserts": [["check_runs", {"run_id": "trunc', '{"inserts": [["nope", {}]]}']
    spool.write_text("\n".join([good[0], bad[0], bad[1], good[1]]) + "\n")
    history = History(db)
    assert history.ingest_spool() == 2
    assert sorted(r["run_id"] for r in history.runs()) == ["r1", "r2"]
    assert not spool.exists()
    assert (tmp_path / "history.db.spool.jsonl.rejected").read_text().splitlines() == bad


def test_spooled_batch_the_db_refuses_is_kept_aside(tmp_path: Path) -> None:
    db, spool = tmp_path / "history.db", tmp_path / "history.db.spool.jsonl"
    history = History(db)
    assert history.write(run_batch("dup", 1.0))
    spool.write_text(run_batch("dup", 1.0).to_json() + "\n" + run_batch("r2", 2.0).to_json() + "\n")
    assert history.ingest_spool() == 1
    assert sorted(r["run_id"] for r in history.runs()) == ["dup", "r2"]
    assert query(db, "SELECT count(*) FROM findings") == [(2,)]  # refused batch fully undone
    assert spooled_run_ids(tmp_path / "history.db.spool.jsonl.rejected") == ["dup"]


def test_leftover_ingesting_file_of_dead_process_is_picked_up(tmp_path: Path) -> None:
    db, spool = tmp_path / "history.db", tmp_path / "history.db.spool.jsonl"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f"{spool.name}.ingesting.{dead.pid}").write_text(run_batch("r1", 1.0).to_json())
    alive = tmp_path / f"{spool.name}.ingesting.1"  # pid 1 is alive: its owner is still busy
    alive.write_text(run_batch("r2", 2.0).to_json() + "\n")
    history = History(db)
    assert history.write(run_batch("r3", 3.0))
    assert sorted(r["run_id"] for r in history.runs()) == ["r1", "r3"]
    assert sorted(p.name for p in tmp_path.iterdir() if "ingesting" in p.name) == [alive.name]


def test_reads_decode_json_columns_and_reject_unknown_tables(tmp_path: Path) -> None:
    history = History(tmp_path / "history.db")
    sample = {"ts": 5.0, "node": "n1", "job_id": "42", "gpu": 0, "metrics": {"sm_util": 0.9}}
    assert history.write(Batch(inserts=[("samples", sample)]))
    assert history.table_rows("samples")[0]["metrics"] == {"sm_util": 0.9}
    assert [r["version"] for r in history.table_rows("schema_migrations")] == [1, 2]
    with pytest.raises(ValueError):
        history.table_rows("sqlite_master")
    with pytest.raises(StoreError):
        history.table_rows("samples", "no_such_column = 1")
    history.close()
    [(raw,)] = query(tmp_path / "history.db", "SELECT metrics FROM samples")
    assert isinstance(raw, str) and json.loads(raw) == {"sm_util": 0.9}


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
    assert query(db, "SELECT util_pct FROM samples ORDER BY ts") == [(None,), (60.0,)]
    assert query(db, "PRAGMA user_version") == [(2,)]
