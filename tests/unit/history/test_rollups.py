"""Per-GPU rollups: written with the samples, equal to a recount from the raw samples,
surviving the raw samples' retention; migration 3 keeps every field of the old rows."""

from __future__ import annotations

import itertools
import json
import random
import sqlite3
import statistics
from pathlib import Path
from typing import Any

import pytest

from slurmhealth.history import Batch, History, read
from slurmhealth.history.read import Reader
from slurmhealth.history.retention import Retention
from slurmhealth.history.rollups import BUCKET_S, HIST_WIDTH
from slurmhealth.history.schema import MIGRATIONS, latest_version
from slurmhealth.summary.collect import node_facts
from tests.unit.history.helpers import query

JOB, NODE, T0 = "77", "n1", 1_700_000_000.0


def _samples(rng: random.Random, n: int, gpus: int = 2) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        ts = T0 + 10 * i + rng.random()  # jittered, never quite regular
        for g in range(gpus):
            util = None if rng.random() < 0.05 else float(rng.choice([0, 3, 50, 95, 100]))
            rows.append({
                "ts": ts, "node": NODE, "job_id": JOB, "gpu": g, "uuid": f"GPU-{g}",
                "util_pct": util, "power_w": 100.0 + rng.random() * 500,
                "mem_used_bytes": rng.randrange(2**30, 80 * 2**30),
                "temp_c": 40 + rng.random() * 40, "margin_c": rng.random() * 30,
                "clock_reasons": rng.choice([0, 0, 0x40, 0x8 | 0x1]),
                "pcie_gen": rng.choice([4, 5]), "pcie_width": 16, "nvlink_active": 18,
                "nvlink_errors": i // 50, "pcie_replay": 3 + i // 100,
            })  # fmt: skip
    return rows


def _write(path: Path, rows: list[dict[str, Any]], per_write: int) -> None:
    with History(path) as h:
        for i in range(0, len(rows), per_write):
            assert h.write(Batch(inserts=[("samples", r) for r in rows[i : i + per_write]]))


def _recount(rows: list[dict[str, Any]], gpu: int) -> dict[str, Any]:
    """What a report of the raw samples says of ``gpu`` (this test's own arithmetic)."""
    mine = sorted((r for r in rows if r["gpu"] == gpu), key=lambda r: r["ts"])
    util = [r["util_pct"] for r in mine if r["util_pct"] is not None]
    marks = "".join("l" if u < 10 else "h" for u in util if u < 10 or u > 90)
    steps = [b["ts"] - a["ts"] for a, b in itertools.pairwise(mine)]
    return {
        "samples": len(mine),
        "util_mean": statistics.fmean(util),
        "util_min": min(util),
        "util_max": max(util),
        "util_p5": sorted(util)[int(0.05 * (len(util) - 1))],
        "util_swings": sum(1 for a, b in itertools.pairwise(marks) if a != b),
        "power_mean_w": statistics.fmean(r["power_w"] for r in mine),
        "mem_peak_bytes": max(r["mem_used_bytes"] for r in mine),
        "temp_max_c": max(r["temp_c"] for r in mine),
        "margin_min_c": min(r["margin_c"] for r in mine),
        "pcie_gen_min": min(r["pcie_gen"] for r in mine),
        "nvlink_errors_delta": mine[-1]["nvlink_errors"] - mine[0]["nvlink_errors"],
        "pcie_replays_delta": mine[-1]["pcie_replay"] - mine[0]["pcie_replay"],
        "hw_thermal": sum(1 for r in mine if r["clock_reasons"] & 0x40),
        "hw_slowdown": sum(1 for r in mine if r["clock_reasons"] & 0x8),
        "step": statistics.median(steps),
    }


@pytest.mark.parametrize("per_write", [2, 120, 10_000])  # an interval, the sidecar's, bulk
def test_rollups_equal_a_recount_from_raw_samples(tmp_path: Path, per_write: int) -> None:
    rows = _samples(random.Random(per_write), 1500)  # 4 h: 50 buckets a GPU
    path = tmp_path / "h.db"
    _write(path, rows, per_write)
    assert query(path, "select count(*) from sample_rollups") == [(2 * 50 + 2,)]  # one partly
    with Reader(path) as r:
        gpus = node_facts(r, JOB, NODE).gpus
    for g in gpus:
        want = _recount(rows, g.gpu)
        step = want.pop("step")
        assert g.util_p5 is not None and want["util_p5"] - HIST_WIDTH < g.util_p5 <= want.pop(
            "util_p5"
        )
        assert g.throttle_seconds["hw_thermal"] == pytest.approx(
            want.pop("hw_thermal") * step, rel=0.01
        )
        assert g.throttle_seconds["hw_slowdown"] == pytest.approx(
            want.pop("hw_slowdown") * step, rel=0.01
        )
        got = {k: getattr(g, k) for k in want}
        assert got == pytest.approx(want)
        assert len(g.series) <= 300 and g.series[-1][0] == max(
            r["ts"] for r in rows if r["gpu"] == g.gpu
        )


def test_short_jobs_plot_every_sample_long_ones_a_bounded_series(tmp_path: Path) -> None:
    short, long = tmp_path / "short.db", tmp_path / "long.db"
    rows = _samples(random.Random(1), 100, gpus=1)
    _write(short, rows, 50)
    _write(long, _samples(random.Random(2), 12 * 360, gpus=1), 360)  # 12 h
    with Reader(short) as r:
        [g] = read.gpu_rollups(r, JOB, NODE, 300)
    assert [p[0] for p in g.series] == [r["ts"] for r in rows]
    with Reader(long) as r:
        [g] = read.gpu_rollups(r, JOB, NODE, 100)
    assert 50 <= len(g.series) <= 100  # 144 buckets, two to a point


def test_rollups_keep_the_stats_after_the_raw_samples_are_pruned(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    _write(path, _samples(random.Random(3), 800), 120)
    with Reader(path) as r:
        before = node_facts(r, JOB, NODE).gpus
    with History(path) as h:
        result = h.prune(Retention(1, 400, 1825, 1_000_000), now=T0 + 3 * 86400)
    assert result.deleted == {"samples": 1600} and result.complete
    with Reader(path) as r:
        after = node_facts(r, JOB, NODE).gpus
        counts = read.job_row_counts(r, JOB, NODE)
    assert query(path, "select count(*) from samples") == [(0,)]
    assert counts["samples"] == 1600  # the summary still matches the history
    assert [(g.samples, g.util_mean, g.util_max, g.mem_peak_bytes) for g in after] == [
        (g.samples, g.util_mean, g.util_max, g.mem_peak_bytes) for g in before
    ]
    [(buckets,)] = query(path, "select count(*) from sample_rollups where gpu = 0")
    assert buckets >= 8000 // BUCKET_S and all(len(g.series) == buckets for g in after)


def _version_2_db(path: Path, rows: list[dict[str, Any]]) -> None:
    """A history as release 2 left it: metrics JSON repeating the columns."""
    import sqlite_utils

    conn = sqlite3.connect(path)
    db = sqlite_utils.Database(conn)
    for version in (1, 2):
        MIGRATIONS[version][1](db)
    old_cols = ("util_pct", "power_w", "mem_used_bytes", "clock_reasons", "nvlink_errors")
    for r in rows:
        metrics = {"utilization_gpu_pct": r["util_pct"], "power_w": r["power_w"],
                   "memory_used_bytes": r["mem_used_bytes"], "energy_j": 123.0,
                   "clock_event_reasons": r["clock_reasons"], "status": "ok",
                   "nvlink_errors": r["nvlink_errors"], "custom_field": "kept"}  # fmt: skip
        cols = {c: r[c] for c in old_cols}
        conn.execute(
            f"insert into samples (ts, node, job_id, gpu, uuid, metrics, {', '.join(cols)}) "
            f"values (?, ?, ?, ?, ?, ?, {', '.join('?' * len(cols))})",
            (r["ts"], NODE, JOB, r["gpu"], r["uuid"], json.dumps(metrics), *cols.values()),
        )
    conn.execute("insert into samples (ts, node, job_id, metrics) values (?, ?, ?, ?)",
                 (T0, NODE, JOB, json.dumps({"kind": "task", "steps_total": 9})))  # fmt: skip
    conn.execute("PRAGMA user_version = 2")
    conn.commit()
    conn.close()


def test_migration_3_keeps_every_field_and_old_jobs_still_report(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    rows = _samples(random.Random(4), 90)
    _version_2_db(path, rows)
    with Reader(path) as r:  # a reader before any writer migrated it: recounted from raw
        old = node_facts(r, JOB, NODE)
    with History(path) as h:
        assert h.write(Batch())  # opening it to write migrates it
    assert query(path, "PRAGMA user_version") == [(latest_version(),)]
    assert query(tmp_path / "history.db.bak-v2", "select count(*) from samples") == [(181,)]
    got = query(path, "select util_pct, energy_j, status, metrics from samples where gpu = 0"
                      " order by ts limit 1")  # fmt: skip
    assert got == [(rows[0]["util_pct"], 123.0, "ok", '{"custom_field":"kept"}')]
    assert query(path, "select metrics from samples where gpu is null") == [
        ('{"kind": "task", "steps_total": 9}',)
    ]
    with Reader(path) as r:  # no rollups for the old job: recounted, the same facts
        new = node_facts(r, JOB, NODE)
        sample = next(x for x in read.job_node_rows(r, "samples", JOB, NODE) if x["gpu"] == 0)
    assert new.gpus == old.gpus and new.task == old.task and new.task is not None
    assert new.gpus[0].samples == 90 and new.gpus[0].util_max == max(
        r["util_pct"] for r in rows if r["gpu"] == 0 and r["util_pct"] is not None
    )
    assert sample["metrics"]["custom_field"] == "kept"  # bundles read the fields by name
    assert sample["metrics"]["energy_j"] == 123.0


def test_a_batch_spooled_by_an_older_release_lands_in_the_columns(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    old_row = {"ts": T0, "node": NODE, "job_id": JOB, "gpu": 0, "uuid": "GPU-0",
               "metrics": {"utilization_gpu_pct": 80.0, "power_w": 300.0, "energy_j": 5.0,
                           "weird": 1}, "util_pct": 80.0, "power_w": 300.0}  # fmt: skip
    with History(path) as h:
        assert h.write(Batch.from_json(Batch(inserts=[("samples", old_row)]).to_json()))
    assert query(path, "select util_pct, energy_j, metrics from samples") == [
        (80.0, 5.0, '{"weird": 1}')
    ]
    assert query(path, "select n, util_sum from sample_rollups") == [(1, 80.0)]


def test_a_hook_never_migrates_an_existing_history_it_spools_until_an_admin_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Inside a hook a long migration (and its backup) would be killed by the hook's
    timeout at every job: the hook spools and says what to run; the admin's command
    migrates and ingests what was spooled."""
    path = tmp_path / "history.db"
    _version_2_db(path, _samples(random.Random(5), 10))
    monkeypatch.setattr(History, "defer_migrations", True)
    assert History(path).write(Batch(kv={"from_the_hook": 1})) is False
    assert query(path, "PRAGMA user_version") == [(2,)]
    assert not (tmp_path / "history.db.bak-v2").exists()
    assert "slurmhealth history prune --all" in caplog.text
    monkeypatch.setattr(History, "defer_migrations", False)
    with History(path) as admin:
        assert admin.write(Batch())
        assert admin.kv_get("from_the_hook") == 1
    assert query(path, "PRAGMA user_version") == [(latest_version(),)]
