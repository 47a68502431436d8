"""`slurmhealth resume` and `slurmhealth nodes` decisions in full (slurmhealth.hooks.resume):
each outcome's exit code and message, whether Slurm was asked to resume, the ``drains`` row
an operator later reads, and the per-node overview, over a recording Slurm backend."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from slurmhealth.config import Config, load_config
from slurmhealth.errors import SchemaTooNew, UsageError
from slurmhealth.history import Batch, History
from slurmhealth.hooks import resume as resume_mod
from slurmhealth.hooks.resume import (
    ResumeOutcome,
    drained_since,
    node_overview,
    overview,
    passing_validation,
    resume,
    resume_node,
)
from slurmhealth.slurm import REASON_PREFIX, NodeInfo
from tests.support.recording_slurm import RecordingSlurm

NODE = "n1"
OURS = f"{REASON_PREFIX} gpu_lost gpu5"


def _config(tmp_path: Path, db: str = "{node}.db", node: str = "login1", **flags: Any) -> Config:
    """The operator's config on a login node: each node's history at ``tmp_path/<node>.db``."""
    (tmp_path / "config.toml").write_text("")
    flags = {"node.name": node, "paths.db": str(tmp_path / db), **flags}
    return load_config(str(tmp_path / "config.toml"), env={}, flags=flags)


def _drains(path: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        if not conn.execute("select 1 from sqlite_master where name = 'drains'").fetchone():
            return []  # nothing was ever written
        rows = [dict(r) for r in conn.execute("select * from drains order by rowid")]
    finally:
        conn.close()
    for r in rows:
        r["detail"] = json.loads(r["detail"])
    return rows


def _validate_run(history: History, ts: float, status: str = "ok", node: str = NODE) -> None:
    run = {"run_id": f"v{ts}", "ts": ts, "node": node, "phase": "validate", "status": status}
    history.write(Batch(inserts=[("check_runs", run)]))


@pytest.fixture(autouse=True)
def _operator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUDO_USER", "carol")  # the admin behind sudo, not root


def _resume(
    tmp_path: Path,
    info: NodeInfo,
    *,
    force: bool = False,
    validate: tuple[float, str] | None = None,
) -> tuple[ResumeOutcome, RecordingSlurm, list[dict[str, Any]]]:
    cfg = _config(tmp_path)
    slurm = RecordingSlurm([info, NodeInfo("n2", "idle")])
    with History(tmp_path / "n1.db") as history:
        if validate is not None:
            _validate_run(history, *validate)
        out = resume(cfg, slurm, history, NODE, "replaced gpu5", force=force)
    return out, slurm, _drains(tmp_path / "n1.db")


def test_an_unknown_node_is_a_usage_error(tmp_path: Path) -> None:
    slurm = RecordingSlurm([NodeInfo("n2", "idle")])
    with History(tmp_path / "n1.db") as history, pytest.raises(UsageError) as err:
        resume(_config(tmp_path), slurm, history, NODE, "x")
    assert str(err.value) == "no node named 'n1' in this cluster"
    assert slurm.resumes == []


def test_a_node_not_drained_is_left_alone_and_not_recorded(tmp_path: Path) -> None:
    out, slurm, rows = _resume(tmp_path, NodeInfo(NODE, "mixed"))
    assert out == ResumeOutcome(1, "n1 is not drained (state mixed); nothing to do")
    assert slurm.resumes == [] and rows == []


def test_our_drain_with_a_passing_validation_since_is_resumed(tmp_path: Path) -> None:
    info = NodeInfo(NODE, "drained", OURS, "slurm", 1000.0)
    out, slurm, rows = _resume(tmp_path, info, validate=(2000.0, "ok"))
    assert out == ResumeOutcome(0, f"n1 resumed (was: {OURS!r})")
    assert slurm.resumes == [NODE]
    [row] = rows
    assert (row["node"], row["state"], row["reason"], row["actor"]) == (
        NODE, "resumed", "replaced gpu5", "carol"
    )  # fmt: skip
    assert abs(row["ts"] - time.time()) < 60  # when it was resumed
    assert row["detail"] == {
        "previous_reason": OURS, "previous_by": "slurm", "forced": False, "validated": True
    }  # fmt: skip


def test_our_drain_without_validation_is_refused_with_the_command_to_run(tmp_path: Path) -> None:
    info = NodeInfo(NODE, "draining", OURS, "slurm", 1000.0)
    out, slurm, rows = _resume(tmp_path, info)  # no history file of the node at all
    assert out == ResumeOutcome(
        1,
        f"n1 was drained by slurmhealth ({OURS!r}) and has no passing validation since; left "
        "drained. Run `slurmhealth validate --node n1` on n1, then resume again (or use "
        "--force to resume it without validation)",
    )
    assert slurm.resumes == []
    [row] = rows
    assert (row["state"], row["actor"]) == ("resume_refused", "carol")
    assert row["detail"] == {
        "previous_reason": OURS, "previous_by": "slurm", "forced": False, "validated": False
    }  # fmt: skip


@pytest.mark.parametrize(
    ("validate", "why"),
    [((900.0, "ok"), "a validation before the drain"), ((2000.0, "fail"), "a failed one")],
)
def test_a_validation_that_does_not_count_leaves_our_drain(
    tmp_path: Path, validate: tuple[float, str], why: str
) -> None:
    info = NodeInfo(NODE, "drained", OURS, "slurm", 1000.0)
    out, slurm, rows = _resume(tmp_path, info, validate=validate)
    assert out.exit_code == 1 and "no passing validation since" in out.message, why
    assert slurm.resumes == [] and rows[0]["state"] == "resume_refused"


def test_our_drain_forced_without_validation_says_so(tmp_path: Path) -> None:
    info = NodeInfo(NODE, "drained", OURS, "slurm", 1000.0)
    out, slurm, rows = _resume(tmp_path, info, force=True)
    assert out == ResumeOutcome(
        0, f"n1 resumed, forced without a passing validation (was: {OURS!r})"
    )
    assert slurm.resumes == [NODE]
    assert rows[0]["state"] == "resumed"
    assert rows[0]["detail"]["forced"] is True and rows[0]["detail"]["validated"] is False


def test_forcing_a_validated_drain_is_a_plain_resume(tmp_path: Path) -> None:
    info = NodeInfo(NODE, "drained", OURS, "slurm", 1000.0)
    out, slurm, rows = _resume(tmp_path, info, force=True, validate=(2000.0, "ok"))
    assert out == ResumeOutcome(0, f"n1 resumed (was: {OURS!r})")
    assert slurm.resumes == [NODE]
    assert rows[0]["detail"]["forced"] is False and rows[0]["detail"]["validated"] is True


def test_an_admins_drain_is_refused_naming_who_set_it(tmp_path: Path) -> None:
    info = NodeInfo(NODE, "drained", "rack 7 maintenance", "dave", 1000.0)
    out, slurm, rows = _resume(tmp_path, info, validate=(2000.0, "ok"))
    assert out == ResumeOutcome(
        1,
        "n1 was drained by dave with reason 'rack 7 maintenance', not by slurmhealth; left "
        "drained (use --force to resume it anyway)",
    )
    assert slurm.resumes == []
    assert rows[0]["state"] == "resume_refused"
    assert rows[0]["detail"] == {
        "previous_reason": "rack 7 maintenance", "previous_by": "dave", "forced": False,
        "validated": False,
    }  # fmt: skip


def test_an_admins_drain_of_unknown_origin_names_nobody(tmp_path: Path) -> None:
    out, _slurm, _rows = _resume(tmp_path, NodeInfo(NODE, "drained", "bad psu"))
    assert out.message.startswith("n1 was drained with reason 'bad psu', not by slurmhealth")


def test_an_admins_drain_forced_says_whose_reason_it_overrode(tmp_path: Path) -> None:
    info = NodeInfo(NODE, "drained", "rack 7 maintenance", "dave", 1000.0)
    out, slurm, rows = _resume(tmp_path, info, force=True)
    assert out == ResumeOutcome(
        0, "n1 resumed, forced over a reason not set by us (was: 'rack 7 maintenance')"
    )
    assert slurm.resumes == [NODE]
    assert rows[0]["detail"]["forced"] is True and rows[0]["detail"]["validated"] is False


def test_the_actor_is_the_login_user_without_sudo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SUDO_USER")
    monkeypatch.setattr(resume_mod.getpass, "getuser", lambda: "erin")
    _out, _slurm, rows = _resume(tmp_path, NodeInfo(NODE, "drained", "x"), force=True)
    assert rows[0]["actor"] == "erin"


def test_the_validation_counts_from_the_latest_drain_in_history_when_slurm_has_no_time(
    tmp_path: Path,
) -> None:
    """Slurm lost the reason time: our drain rows say when it began (a validation between an
    older drain and the newest one does not count)."""
    cfg = _config(tmp_path)
    info = NodeInfo(NODE, "drained", OURS, "slurm", None)
    slurm = RecordingSlurm([info])
    with History(tmp_path / "n1.db") as history:
        for ts in (100.0, 300.0):
            row = {"ts": ts, "node": NODE, "state": "drained", "reason": OURS, "actor": "x",
                   "detail": {}}  # fmt: skip
            history.write(Batch(inserts=[("drains", row)]))
        _validate_run(history, 200.0)
        assert resume(cfg, slurm, history, NODE, "r").exit_code == 1
        _validate_run(history, 400.0)
        assert resume(cfg, slurm, history, NODE, "r").exit_code == 0
    assert slurm.resumes == [NODE]


def test_a_history_that_cannot_be_read_counts_as_no_validation(tmp_path: Path) -> None:
    (tmp_path / "n1.db").write_bytes(b"not a database, " * 64)
    cfg = _config(tmp_path)
    assert resume_mod._validated(cfg, NODE, 1000.0) is False


def test_resume_node_opens_the_nodes_history_and_slurm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slurm = RecordingSlurm([NodeInfo(NODE, "drained", "rack 7", "dave", 1.0)])
    opened: list[tuple[str, float]] = []

    def fake_open(backend: str, timeout_s: float) -> RecordingSlurm:
        opened.append((backend, timeout_s))
        return slurm

    monkeypatch.setattr(resume_mod, "open_slurm", fake_open)
    cfg = _config(tmp_path, **{"slurm.command_timeout_s": 7.5})
    out = resume_node(cfg, NODE, "fixed", force=True)
    assert out.exit_code == 0 and slurm.resumes == [NODE]
    assert opened == [(cfg.slurm.backend, 7.5)]
    assert [r["state"] for r in _drains(tmp_path / "n1.db")] == ["resumed"]


def test_resume_node_validates_from_the_nodes_own_history_and_does_not_force(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slurm = RecordingSlurm([NodeInfo(NODE, "drained", OURS, "slurm", 1000.0),
                            NodeInfo("n2", "drained", "rack 7", "dave", 1.0)])  # fmt: skip
    monkeypatch.setattr(resume_mod, "open_slurm", lambda *_: slurm)
    cfg = _config(tmp_path)  # on login1: n1's history is n1.db
    with History(tmp_path / "n1.db") as history:
        _validate_run(history, 2000.0)
    assert resume_node(cfg, NODE, "replaced gpu5").exit_code == 0
    assert resume_node(cfg, "n2", "fixed").exit_code == 1  # not ours, not forced
    assert slurm.resumes == [NODE]
    [row] = _drains(tmp_path / "n1.db")
    assert (row["state"], row["reason"]) == ("resumed", "replaced gpu5")
    assert [r["state"] for r in _drains(tmp_path / "n2.db")] == ["resume_refused"]


def test_resume_node_refuses_a_history_of_a_newer_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    slurm = RecordingSlurm([NodeInfo(NODE, "drained", "rack 7", "dave", 1.0)])
    monkeypatch.setattr(resume_mod, "open_slurm", lambda *_: slurm)
    cfg = _config(tmp_path)
    with History(tmp_path / "n1.db") as history:
        assert history.write(Batch())
    conn = sqlite3.connect(tmp_path / "n1.db")
    conn.execute("PRAGMA user_version = 999")
    conn.close()
    with pytest.raises(SchemaTooNew, match="999"):
        resume_node(cfg, NODE, "fixed", force=True)
    assert slurm.resumes == []


def _drain_row(node: str, ts: float) -> dict[str, Any]:
    return {"ts": ts, "node": node, "state": "drained", "reason": OURS, "actor": "x",
            "detail": {}}  # fmt: skip


def test_in_a_shared_history_only_this_nodes_drains_and_validations_count(
    tmp_path: Path,
) -> None:
    """One history for the whole cluster (paths.db without {node}): n2's validation does not
    let n1 back, and n2's later drain does not void n1's validation."""
    cfg = _config(tmp_path, db="cluster.db")
    slurm = RecordingSlurm([NodeInfo(NODE, "drained", OURS, "slurm", None)])
    with History(tmp_path / "cluster.db") as history:
        history.write(Batch(inserts=[("drains", _drain_row(NODE, 300.0))]))
        _validate_run(history, 400.0, node="n2")
        assert resume(cfg, slurm, history, NODE, "r").exit_code == 1
        _validate_run(history, 450.0)
        history.write(Batch(inserts=[("drains", _drain_row("n2", 500.0))]))
        assert resume(cfg, slurm, history, NODE, "r").exit_code == 0
    assert slurm.resumes == [NODE]


def test_a_validation_followed_by_many_job_checks_still_counts(tmp_path: Path) -> None:
    """Sixty prologs ran after the validation: runs of other phases never push it out of
    the runs that are read."""
    info = NodeInfo(NODE, "drained", OURS, "slurm", 1000.0)
    cfg = _config(tmp_path)
    slurm = RecordingSlurm([info])
    with History(tmp_path / "n1.db") as history:
        _validate_run(history, 2000.0)
        runs = [("check_runs", {"run_id": f"p{i}", "ts": 2001.0 + i, "node": NODE,
                                "phase": "prolog", "status": "ok"}) for i in range(60)]  # fmt: skip
        history.write(Batch(inserts=runs))
        assert resume(cfg, slurm, history, NODE, "r").exit_code == 0


# -- the pure gates -------------------------------------------------------------------------


def test_drained_since_takes_slurms_time_then_the_latest_drained_row() -> None:
    rows = [{"state": "drained", "ts": 50.0}, {"state": "resumed", "ts": 90.0},
            {"state": "drained", "ts": 70.0}, {"state": "drained", "ts": None},
            {"state": "drained"}, {"ts": 95.0}]  # fmt: skip
    assert drained_since(120.0, rows) == 120.0
    assert drained_since(None, rows) == 70.0
    assert drained_since(0.0, rows) == 70.0  # Slurm's 0 is "unknown"
    assert drained_since(None, [{"state": "resumed", "ts": 9.0}]) is None


def test_passing_validation_judges_the_latest_validation_only() -> None:
    ok = {"phase": "validate", "status": "ok", "ts": 120.0}
    failed = {"phase": "validate", "status": "fail", "ts": 130.0}
    assert passing_validation([ok, failed], 100.0) is None  # in any order: by time
    assert passing_validation([failed, {**ok, "ts": 140.0}], 100.0) == {**ok, "ts": 140.0}


def test_passing_validation_needs_one_strictly_after_the_drain() -> None:
    at = {"phase": "validate", "status": "ok", "ts": 100.0}
    no_ts = {"phase": "validate", "status": "ok", "ts": None}
    assert passing_validation([at], 100.0) is None  # the same second is not after
    assert passing_validation([at, no_ts], 99.5) == at
    assert passing_validation([no_ts], None) is None
    assert passing_validation([{**at, "phase": "prolog"}], None) is None


# -- the per-node overview ------------------------------------------------------------------


def _finding(run_id: str, check: str, message: str, severity: int) -> dict[str, Any]:
    return {"run_id": run_id, "ts": 10.0, "node": NODE, "check_name": check,
            "severity": "fail", "severity_value": severity, "message": message,
            "action": "drain", "evidence": {}}  # fmt: skip


def _remediation(ts: float, action: str) -> dict[str, Any]:
    return {"ts": ts, "node": NODE, "gpus": [5], "fault": "xid_79", "action": action,
            "started": ts, "ended": ts + 1, "outcome": "ok", "detail": {}}  # fmt: skip


def test_overview_sets_each_nodes_slurm_state_beside_its_last_check(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    with History(tmp_path / "n1.db") as history:
        old = {"run_id": "r0", "ts": 5.0, "node": NODE, "phase": "prolog", "status": "ok"}
        run = {"run_id": "r1", "ts": 10.0, "node": NODE, "phase": "epilog", "status": "fail"}
        history.write(Batch(inserts=[
            ("check_runs", old), ("check_runs", run),
            ("findings", _finding("r1", "nvlink", "link 3 down", 3)),
            ("findings", _finding("r1", "ecc", "uncorrectable", 4)),
            ("remediations", _remediation(1.0, "reset")),
            ("remediations", _remediation(2.0, "validate")),
        ]))  # fmt: skip
    slurm = RecordingSlurm([NodeInfo("n2", "idle"), NodeInfo(NODE, "drained", OURS, "slurm", 9.0)])
    first, second = overview(cfg, slurm)
    assert first == {
        "node": NODE, "state": "drained", "reason": OURS, "reason_by": "slurm",
        "last_check_ts": 10.0, "last_phase": "epilog", "last_status": "fail",
        "worst_finding": "ecc: uncorrectable",
        "remediation": {"action": "validate", "outcome": "ok", "started": 2.0, "fault": "xid_79"},
    }  # fmt: skip
    assert second == {
        "node": "n2", "state": "idle", "reason": "", "reason_by": "", "last_check_ts": None,
        "last_phase": None, "last_status": None, "worst_finding": None, "remediation": None,
    }  # fmt: skip


def test_overview_of_a_passing_run_names_no_finding(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    with History(tmp_path / "n1.db") as history:
        run = {"run_id": "r1", "ts": 10.0, "node": NODE, "phase": "prolog", "status": "ok"}
        history.write(Batch(inserts=[("check_runs", run)]))
    [row] = overview(cfg, RecordingSlurm([NodeInfo(NODE, "idle")]))
    assert (row["last_status"], row["worst_finding"], row["remediation"]) == ("ok", None, None)


def test_overview_with_one_history_reads_only_this_nodes(tmp_path: Path) -> None:
    """Without {node} in paths.db the one file is this node's: other nodes show no check."""
    cfg = _config(tmp_path, db="history.db", node=NODE)
    with History(tmp_path / "history.db") as history:
        for node in (NODE, "n2"):
            run = {"run_id": node, "ts": 10.0, "node": node, "phase": "prolog", "status": "ok"}
            history.write(Batch(inserts=[("check_runs", run)]))
    slurm = RecordingSlurm([NodeInfo(NODE, "idle"), NodeInfo("n2", "idle")])
    mine, other = overview(cfg, slurm)
    assert (mine["node"], mine["last_status"]) == (NODE, "ok")
    assert (other["node"], other["last_status"]) == ("n2", None)


def test_node_overview_uses_the_configured_slurm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[tuple[str, float]] = []

    def fake_open(backend: str, timeout_s: float) -> RecordingSlurm:
        opened.append((backend, timeout_s))
        return RecordingSlurm([NodeInfo("n9", "idle")])

    monkeypatch.setattr(resume_mod, "open_slurm", fake_open)
    cfg = _config(tmp_path, **{"slurm.backend": "cli", "slurm.command_timeout_s": 4.5})
    [row] = node_overview(cfg)
    assert opened == [("cli", 4.5)]
    assert (row["node"], row["last_check_ts"]) == ("n9", None)


def test_overview_reads_every_nodes_own_history(tmp_path: Path) -> None:
    """On a login node with paths.db = .../{node}.db: each node's row from its own file."""
    cfg = _config(tmp_path)
    for node, status in ((NODE, "ok"), ("n2", "fail")):
        with History(tmp_path / f"{node}.db") as history:
            run = {"run_id": node, "ts": 10.0, "node": node, "phase": "prolog", "status": status}
            history.write(Batch(inserts=[("check_runs", run)]))
    slurm = RecordingSlurm([NodeInfo(NODE, "idle"), NodeInfo("n2", "idle")])
    assert [(r["node"], r["last_status"]) for r in overview(cfg, slurm)] == [
        (NODE, "ok"), ("n2", "fail")
    ]  # fmt: skip


def test_overview_of_a_shared_history_shows_each_node_its_own_rows(tmp_path: Path) -> None:
    cfg = _config(tmp_path, db="history.db", node=NODE)
    with History(tmp_path / "history.db") as history:
        mine = {"run_id": "r1", "ts": 10.0, "node": NODE, "phase": "prolog", "status": "ok"}
        other = {"run_id": "r2", "ts": 20.0, "node": "n2", "phase": "epilog", "status": "fail"}
        step = {**_remediation(30.0, "reset"), "node": "n2"}
        history.write(Batch(inserts=[("check_runs", mine), ("check_runs", other),
                                     ("remediations", step)]))  # fmt: skip
    [row] = overview(cfg, RecordingSlurm([NodeInfo(NODE, "idle")]))
    assert (row["last_check_ts"], row["last_status"], row["remediation"]) == (10.0, "ok", None)
