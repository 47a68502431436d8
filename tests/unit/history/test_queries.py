"""The history's read side: named queries return plain dicts with JSON columns decoded,
read-only handles never create or change a file, and trouble is one StoreError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurmhealth.errors import StoreError
from slurmhealth.history import Batch, History, read
from slurmhealth.history.baselines import add_baselines
from slurmhealth.history.read import Reader
from tests.unit.history.helpers import query, run_batch

JOB = "42"


def _row(table: str, ts: float, node: str = "n1", job: str | None = JOB, **cols: object) -> tuple:
    return (table, {"ts": ts, "node": node, "job_id": job, **cols})


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A history with a two-node job 42 and an older job 7 on the same GPU."""
    path = tmp_path / "history.db"
    job = {"job_id": JOB, "node": "n1", "uid": 1234, "user": "ada", "gpus": [0, 1]}
    inserts = [
        *run_batch("r1", 10.0, job=JOB).inserts,
        _row("events", 30.0, gpu=1, kind="xid", severity="fail", message="Xid 79",
             evidence={"xid": 79}),
        _row("events", 20.0, gpu=0, kind="throttle", severity="info", message="sw"),
        _row("events", 25.0, node="n2", gpu=3, kind="straggler", severity="warn", message="slow"),
        _row("drains", 40.0, state="drained", reason="slurmhealth: xid", actor="prolog",
             detail={"note": "ok"}),
        _row("drains", 50.0, node="n1", job=None, state="resumed", reason="fixed", actor="op"),
        _row("samples", 11.0, gpu=0, uuid="GPU-0", metrics={"utilization_gpu_pct": 50},
             util_pct=50.0, power_w=300.0, clock_reasons=0, nvlink_errors=5),
        _row("samples", 21.0, gpu=0, uuid="GPU-0", metrics={"utilization_gpu_pct": 70},
             util_pct=70.0, power_w=320.0, clock_reasons=0x40, nvlink_errors=9),
        _row("samples", 12.0, gpu=None, metrics={"kind": "task", "steps_total": 3}),
        _row("events", 5.0, job="7", gpu=1, kind="ecc", severity="fail", message="ECC",
             evidence={"xid": 48}),
        _row("findings", 6.0, job="8", node="n9", check_name="xid", severity="fail",
             severity_value=30, gpu=2, message="Xid 79 elsewhere", evidence={"xid": 79}),
    ]  # fmt: skip
    with History(path) as h:
        assert h.write(Batch(inserts=inserts, upserts=[("jobs", job, "job_id")]))
    return path


def test_job_rows_come_back_decoded_in_time_order(db: Path) -> None:
    with Reader(db) as r:
        events = list(read.job_node_rows(r, "events", JOB, "n1"))
        newest = list(read.job_node_rows(r, "events", JOB, "n1", newest_first=True))
        drains = list(read.job_node_rows(r, "drains", JOB, "n1"))
        job = read.job_row(r, JOB)
        with pytest.raises(ValueError, match="not a table of job rows"):
            list(read.job_node_rows(r, "kv", JOB, "n1"))
    assert [e["ts"] for e in events] == [20.0, 30.0]  # n2's and job 7's rows are not here
    assert [e["ts"] for e in newest] == [30.0, 20.0]
    assert events[1]["evidence"] == {"xid": 79}
    assert drains[0]["detail"] == {"note": "ok"}
    assert job is not None and job["gpus"] == [0, 1] and job["user"] == "ada"
    [(raw,)] = query(db, "SELECT gpus FROM jobs")  # stored as JSON text, decoded on read
    assert json.loads(str(raw)) == [0, 1]


def test_job_level_questions(db: Path) -> None:
    with Reader(db) as r:
        assert read.nodes_of_job(r, JOB) == ["n1", "n2"]
        assert read.owner_uid(r, JOB) == 1234
        assert read.owner_uid(r, "7") is None  # no jobs row
        assert read.job_had_events(r, JOB)
        assert not read.job_had_events(r, "99")
        counts = read.job_row_counts(r, JOB, "n1")
        rows = read.incident_rows(r, JOB)
    assert counts == {
        "check_runs": 1,
        "findings": 1,
        "events": 2,
        "drains": 1,
        "evidence": 0,
        "samples": 2,
    }  # (the task's GPU-less sample is not counted)
    assert sorted((x.get("check_name") or x["kind"], x["node"]) for x in rows) == [
        ("straggler", "n2"), ("throttle", "n1"), ("xid", "n1"), ("xid", "n1")]  # fmt: skip
    assert rows[0]["evidence"] == {"xid": 79}


def test_only_info_events_do_not_count_as_events(tmp_path: Path) -> None:
    path = tmp_path / "h.db"
    with History(path) as h:
        h.write(Batch(inserts=[_row("events", 1.0, kind="throttle", severity="info", message="")]))
        assert not read.job_had_events(h, JOB)


def test_past_incidents_are_other_jobs_on_the_same_gpu_before_the_end(db: Path) -> None:
    with History(db) as h:  # after job 42's end (100 s), and the same Xid on another GPU
        h.write(Batch(inserts=[_row("events", 150.0, job="9", gpu=1, kind="ecc",
                                    severity="fail", message="later")]))  # fmt: skip
    with Reader(db) as r:
        past = read.past_incident_rows(r, JOB, {("n1", 1)}, 100.0)
        later = read.past_incident_rows(r, JOB, {("n1", 1)}, 200.0)
        none = read.past_incident_rows(r, JOB, set(), 100.0)
    assert [(p["job_id"], p["what"], p["node"], p["gpu"]) for p in past] == [("7", "ecc", "n1", 1)]
    assert [p["job_id"] for p in later] == ["9", "7"]
    assert none == []


def test_runs_drains_and_check_runs_are_newest_first_and_filtered(db: Path) -> None:
    with History(db) as h:
        h.write(Batch(inserts=[("check_runs", {"run_id": "v1", "ts": 60.0, "node": "n1",
                                               "phase": "validate", "status": "ok"})]))  # fmt: skip
        [run] = read.runs(h, job=JOB)
        drains = read.drain_rows(h, node="n1")
        drained = read.drain_rows(h, state="drained")
        validate = read.check_runs(h, node="n1", phase="validate")
        latest = read.check_runs(h, limit=1)
    assert run["run_id"] == "r1" and run["gpus"] == [0, 1]
    assert run["findings"][0]["evidence"] == {"xid": 79}
    assert [d["state"] for d in drains] == ["resumed", "drained"]
    assert [d["ts"] for d in drained] == [40.0]
    assert [r["run_id"] for r in validate] == [r["run_id"] for r in latest] == ["v1"]


def test_gpu_rollups_and_task_metrics(db: Path) -> None:
    with Reader(db) as r:
        [g] = read.gpu_rollups(r, JOB, "n1")
        tasks = read.task_metrics(r, JOB, "n1")
    agg = g.stats
    assert agg["gpu"] == 0 and agg["uuid"] == "GPU-0" and agg["samples"] == 2
    assert agg["util_mean"] == 60.0 and agg["nvlink_errors_delta"] == 4
    assert g.series == [(11.0, 50.0, 300.0), (21.0, 70.0, 320.0)]  # a short job: every sample
    assert g.reasons == {"hw_thermal": 1} and g.step_s == 10.0
    assert tasks == [{"kind": "task", "steps_total": 3}]


def test_reader_never_creates_a_file_and_reports_one_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.db"
    with Reader(missing) as r, pytest.raises(StoreError, match=r"nope\.db"):
        read.job_row(r, JOB)
    assert not missing.exists()
    assert read.open_reader(str(missing)) is None
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database" * 100)
    assert read.open_reader(str(junk)) is None
    with Reader(junk) as r, pytest.raises(StoreError):
        read.runs(r)


def test_baseline_rows_written_and_read_back(tmp_path: Path) -> None:
    class M:
        def __init__(self, metric: str, value: float) -> None:
            self.metric, self.value, self.unit, self.gpu = metric, value, "GB/s", None

    path = tmp_path / "h.db"
    with History(path) as h:
        n = add_baselines(h, "nccl", [M("busbw", 180.0), M("algbw", 90.0)], ts=1.0,
                                  node="n1", gpu_model="H100", label="", source=None)  # fmt: skip
        assert add_baselines(h, "nccl", [], ts=2.0, node="n1", gpu_model=None,
                                     label=None, source=None) == 0  # fmt: skip
    with Reader(path) as r:
        rows = read.baseline_rows(r, kind="nccl")
        assert [x["metric"] for x in read.baseline_rows(r, metric="algbw")] == ["algbw"]
    assert n == 2 and [(x["metric"], x["value"], x["label"]) for x in rows] == [
        ("busbw", 180.0, None), ("algbw", 90.0, None)]  # fmt: skip
    old = tmp_path / "old.db"
    query(old, "CREATE TABLE jobs (job_id TEXT)")  # a history from before the baselines table
    with Reader(old) as r:
        assert read.baseline_rows(r) == []
