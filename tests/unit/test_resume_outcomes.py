"""`slurmhealth resume` decisions one by one: which drains it lifts, the message and exit code
an operator reads, and the ``drains`` row `slurmhealth history` shows afterwards; the drain
time a validation must follow, and the per-node overview (`slurmhealth nodes`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slurmhealth.config import Config, load_config
from slurmhealth.errors import UsageError
from slurmhealth.history import Batch, History
from slurmhealth.hooks import resume as resume_mod
from slurmhealth.hooks.resume import drained_since, overview, passing_validation, resume
from slurmhealth.slurm import REASON_PREFIX, NodeInfo
from tests.support.db_rows import table_rows
from tests.support.recording_slurm import RecordingSlurm

NODE = "n1"
OURS = f"{REASON_PREFIX} gpu_lost gpu5"


def _config(tmp_path: Path, db: str | None = None) -> Config:
    (tmp_path / "config.toml").write_text("")
    flags = {"node.name": NODE, "paths.db": db or str(tmp_path / "history.db")}
    return load_config(str(tmp_path / "config.toml"), env={}, flags=flags)


def _head_config(tmp_path: Path) -> Config:
    """Commands run on the head node (node.name head) over per-node history files."""
    (tmp_path / "config.toml").write_text("")
    flags = {"node.name": "head", "paths.db": str(tmp_path / "{node}.db")}
    return load_config(str(tmp_path / "config.toml"), env={}, flags=flags)


def _validation(history: History, ts: float, status: str = "ok", run_id: str = "v1") -> None:
    run = {"run_id": run_id, "ts": ts, "node": NODE, "phase": "validate", "status": status}
    history.write(Batch(inserts=[("check_runs", run)]))


def _resume(
    tmp_path: Path, info: NodeInfo, *, force: bool = False, validations: tuple[Any, ...] = ()
) -> tuple[int, str, RecordingSlurm, list[dict[str, Any]]]:
    cfg = _config(tmp_path)
    slurm = RecordingSlurm([info, NodeInfo("n2", "idle")])
    with History(tmp_path / "history.db") as history:
        assert history.write(Batch())  # the schema, so an empty table reads as empty
        for n, (ts, status) in enumerate(validations):
            _validation(history, ts, status, run_id=f"v{n}")
        outcome = resume(cfg, slurm, history, NODE, "replaced gpu5", force=force)
    rows = table_rows(tmp_path / "history.db", "drains")
    return outcome.exit_code, outcome.message, slurm, rows


@pytest.fixture(autouse=True)
def _operator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUDO_USER", "carol")


def test_an_unknown_node_is_a_usage_error(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    with History(tmp_path / "history.db") as history, pytest.raises(UsageError, match="'n9'"):
        resume(cfg, RecordingSlurm([NodeInfo(NODE, "idle")]), history, "n9", "x")


def test_a_node_that_is_not_drained_is_left_alone(tmp_path: Path) -> None:
    code, message, slurm, rows = _resume(tmp_path, NodeInfo(NODE, "mixed"))
    assert (code, message) == (1, f"{NODE} is not drained (state mixed); nothing to do")
    assert slurm.resumes == [] and rows == []


def test_our_drain_with_a_passing_validation_since_is_resumed(tmp_path: Path) -> None:
    info = NodeInfo(NODE, "drained", OURS, "slurm", 1000.0)
    code, message, slurm, rows = _resume(tmp_path, info, validations=((2000.0, "ok"),))
    assert (code, message) == (0, f"{NODE} resumed (was: {OURS!r})")
    assert slurm.resumes == [NODE]
    (row,) = rows
    assert (row["state"], row["node"], row["reason"], row["actor"]) == (
        "resumed",
        NODE,
        "replaced gpu5",
        "carol",
    )
    assert json.loads(row["detail"]) == {
        "previous_reason": OURS,
        "previous_by": "slurm",
        "forced": False,
        "validated": True,
    }


@pytest.mark.parametrize(
    "validations",
    [
        (),  # none at all
        ((500.0, "ok"),),  # passed before the drain: says nothing of the repair
        ((1000.0, "ok"),),  # at the drain's own second
        ((2000.0, "ok"), (3000.0, "fail")),  # the latest one failed
    ],
)
def test_our_drain_without_a_passing_validation_since_stays(
    tmp_path: Path, validations: tuple[Any, ...]
) -> None:
    info = NodeInfo(NODE, "drained", OURS, "slurm", 1000.0)
    code, message, slurm, rows = _resume(tmp_path, info, validations=validations)
    assert code == 1 and slurm.resumes == []
    assert message == (
        f"{NODE} was drained by slurmhealth ({OURS!r}) and has no passing validation since; "
        f"left drained. Run `slurmhealth validate --node {NODE}` on {NODE}, then resume again "
        "(or use --force to resume it without validation)"
    )
    (row,) = rows
    assert row["state"] == "resume_refused"
    assert json.loads(row["detail"])["forced"] is False
    assert json.loads(row["detail"])["validated"] is False


def test_our_drain_forced_without_validation(tmp_path: Path) -> None:
    info = NodeInfo(NODE, "draining", OURS, "slurm", 1000.0)
    code, message, slurm, rows = _resume(tmp_path, info, force=True)
    assert (code, message) == (
        0,
        f"{NODE} resumed, forced without a passing validation (was: {OURS!r})",
    )
    assert slurm.resumes == [NODE]
    assert rows[0]["state"] == "resumed"
    assert json.loads(rows[0]["detail"]) == {
        "previous_reason": OURS,
        "previous_by": "slurm",
        "forced": True,
        "validated": False,
    }


def test_our_drain_with_a_validation_is_not_called_forced(tmp_path: Path) -> None:
    info = NodeInfo(NODE, "drained", OURS, "slurm", 1000.0)
    code, message, _, rows = _resume(tmp_path, info, force=True, validations=((2000.0, "ok"),))
    assert (code, message) == (0, f"{NODE} resumed (was: {OURS!r})")
    assert json.loads(rows[0]["detail"])["forced"] is False


def test_someone_elses_drain_is_refused_naming_who(tmp_path: Path) -> None:
    info = NodeInfo(NODE, "drained", "rack 7 maintenance", "root", 1000.0)
    code, message, slurm, rows = _resume(tmp_path, info, validations=((2000.0, "ok"),))
    assert code == 1 and slurm.resumes == []
    assert message == (
        f"{NODE} was drained by root with reason 'rack 7 maintenance', not by slurmhealth; "
        "left drained (use --force to resume it anyway)"
    )
    assert rows[0]["state"] == "resume_refused"
    assert json.loads(rows[0]["detail"])["validated"] is False


def test_someone_elses_drain_without_a_user(tmp_path: Path) -> None:
    code, message, _, _ = _resume(tmp_path, NodeInfo(NODE, "drained", "rack 7"))
    assert message.startswith(f"{NODE} was drained with reason 'rack 7', not by slurmhealth")
    assert code == 1


def test_someone_elses_drain_forced(tmp_path: Path) -> None:
    info = NodeInfo(NODE, "drained", "rack 7", "root", 1000.0)
    code, message, slurm, rows = _resume(tmp_path, info, force=True)
    assert (code, message) == (
        0,
        f"{NODE} resumed, forced over a reason not set by us (was: 'rack 7')",
    )
    assert slurm.resumes == [NODE]
    assert json.loads(rows[0]["detail"])["forced"] is True


def test_the_actor_is_the_login_without_sudo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SUDO_USER")
    monkeypatch.setattr(resume_mod.getpass, "getuser", lambda: "dave")
    _, _, _, rows = _resume(tmp_path, NodeInfo(NODE, "drained", "rack 7"))
    assert rows[0]["actor"] == "dave"


def test_our_drain_on_a_node_without_history_is_refused(tmp_path: Path) -> None:
    """No history file for the node: nothing shows a validation (and resume creates none)."""
    cfg = _config(tmp_path, db=str(tmp_path / "absent" / "{node}.db"))
    assert resume_mod._validated(cfg, NODE, 1000.0) is False
    assert not (tmp_path / "absent").exists()


def test_an_unreadable_history_counts_as_no_validation(tmp_path: Path) -> None:
    (tmp_path / "history.db").write_bytes(b"not a database" * 100)
    assert resume_mod._validated(_config(tmp_path), NODE, 1000.0) is False


def test_the_drain_time_from_the_history_when_slurm_has_none(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    with History(tmp_path / "history.db") as history:
        history.write(
            Batch(inserts=[("drains", {"ts": 1500.0, "node": NODE, "state": "drained",
                                       "reason": OURS, "actor": "x", "detail": {}})])
        )  # fmt: skip
        _validation(history, 1200.0)
    assert resume_mod._validated(cfg, NODE, None) is False  # validated before the drain
    assert resume_mod._validated(cfg, NODE, 1100.0) is True


def test_drained_since() -> None:
    drains = [
        {"state": "drained", "ts": 10.0},
        {"state": "resumed", "ts": 50.0},
        {"state": "drained", "ts": 30.0},
        {"state": "drained", "ts": None},
    ]
    assert drained_since(5.0, drains) == 5.0
    assert drained_since(None, drains) == 30.0
    assert drained_since(0.0, drains) == 30.0  # Slurm's 'no time' is 0
    assert drained_since(None, [{"state": "resumed", "ts": 9.0}]) is None
    assert drained_since(None, []) is None


def test_passing_validation() -> None:
    ok = {"phase": "validate", "ts": 20.0, "status": "ok"}
    runs = [
        {"phase": "prolog", "ts": 40.0, "status": "fail"},
        ok,
        {"phase": "validate", "ts": 10.0, "status": "fail"},
        {"phase": "validate", "ts": None, "status": "fail"},
    ]
    assert passing_validation(runs, None) is ok
    assert passing_validation(runs, 15.0) is ok
    assert passing_validation(runs, 20.0) is None  # at the drain's second: not after it
    assert (
        passing_validation([*runs, {"phase": "validate", "ts": 30.0, "status": "warn"}], 1.0)
        is None
    )
    assert passing_validation([], None) is None


def test_overview_lists_each_node_with_its_last_check(tmp_path: Path) -> None:
    cfg = _config(tmp_path, db=str(tmp_path / "{node}.db"))
    with History(tmp_path / "n1.db") as history:
        older = {"run_id": "r0", "ts": 50.0, "node": NODE, "phase": "prolog", "status": "ok"}
        history.write(Batch(inserts=[("check_runs", older)]))
        run = {"run_id": "r1", "ts": 100.0, "node": NODE, "phase": "epilog", "status": "fail"}
        history.write(Batch(inserts=[("check_runs", run)]))
        finding = {"run_id": "r1", "check_name": "ecc", "severity": "fail",
                   "severity_value": 3, "message": "gpu1 uncorrectable"}  # fmt: skip
        history.write(Batch(inserts=[("findings", finding)]))
        step = {"ts": 120.0, "node": NODE, "action": "gpu_reset", "outcome": "ok",
                "started": 110.0, "fault": "xid_79"}  # fmt: skip
        history.write(Batch(inserts=[("remediations", step)]))
    slurm = RecordingSlurm([NodeInfo("n2", "idle"), NodeInfo(NODE, "drained", OURS, "slurm")])
    n1, n2 = overview(cfg, slurm)
    assert n1["node"] == NODE and n1["state"] == "drained"
    assert (n1["reason"], n1["reason_by"]) == (OURS, "slurm")
    assert (n1["last_check_ts"], n1["last_phase"], n1["last_status"]) == (100.0, "epilog", "fail")
    assert n1["worst_finding"] == "ecc: gpu1 uncorrectable"
    assert n1["remediation"] == {"action": "gpu_reset", "outcome": "ok", "started": 110.0,
                                 "fault": "xid_79"}  # fmt: skip
    assert n2 == {
        "node": "n2", "state": "idle", "reason": "", "reason_by": "", "last_check_ts": None,
        "last_phase": None, "last_status": None, "worst_finding": None, "remediation": None,
    }  # fmt: skip


def test_overview_of_a_shared_history_reads_only_this_node(tmp_path: Path) -> None:
    """A history path without {node} is this node's own: other nodes show no check."""
    cfg = _config(tmp_path)
    with History(tmp_path / "history.db") as history:
        run = {"run_id": "r1", "ts": 100.0, "node": NODE, "phase": "prolog", "status": "ok"}
        history.write(Batch(inserts=[("check_runs", run)]))
    slurm = RecordingSlurm([NodeInfo(NODE, "idle"), NodeInfo("n2", "idle")])
    n1, n2 = overview(cfg, slurm)
    assert (n1["last_status"], n1["worst_finding"], n1["remediation"]) == ("ok", None, None)
    assert n2["last_status"] is None


def _drained_row(node: str, ts: float) -> dict[str, Any]:
    return {"ts": ts, "node": node, "state": "drained", "reason": OURS, "actor": "x", "detail": {}}


def test_only_this_nodes_drain_and_validations_count_in_a_shared_history(
    tmp_path: Path,
) -> None:
    """A history several nodes write (one path without {node}): n2's later drain does not
    move n1's drain time, and n2's passing validation does not resume n1."""
    cfg = _config(tmp_path)
    with History(tmp_path / "history.db") as history:
        history.write(Batch(inserts=[("drains", _drained_row(NODE, 1000.0))]))
        history.write(Batch(inserts=[("drains", _drained_row("n2", 3000.0))]))
        _validation(history, 2000.0)
        other = {"run_id": "o1", "ts": 2500.0, "node": "n2", "phase": "validate", "status": "ok"}
        history.write(Batch(inserts=[("check_runs", other)]))
    assert resume_mod._validated(cfg, NODE, None) is True  # n1: drained 1000, validated 2000
    with History(tmp_path / "history.db") as history:
        bad = {"run_id": "v9", "ts": 2200.0, "node": NODE, "phase": "validate", "status": "fail"}
        history.write(Batch(inserts=[("check_runs", bad)]))
    assert resume_mod._validated(cfg, NODE, None) is False  # n2's later pass is not n1's


def test_a_validation_followed_by_many_other_runs_still_counts(tmp_path: Path) -> None:
    """Fifty prolog runs after the validation (a busy node) do not hide it."""
    cfg = _config(tmp_path)
    with History(tmp_path / "history.db") as history:
        _validation(history, 2000.0)
        prologs = [
            ("check_runs", {"run_id": f"p{n}", "ts": 3000.0 + n, "node": NODE,
                            "phase": "prolog", "status": "ok"})
            for n in range(60)
        ]  # fmt: skip
        history.write(Batch(inserts=prologs))
    assert resume_mod._validated(cfg, NODE, 1000.0) is True


def test_a_per_node_history_is_read_at_the_resumed_nodes_path(tmp_path: Path) -> None:
    """Run on the head node (node.name head), `resume n1` reads n1's history file."""
    cfg = _head_config(tmp_path)
    with History(tmp_path / "n1.db") as history:
        _validation(history, 2000.0)
    info = NodeInfo(NODE, "drained", OURS, "slurm", 1000.0)
    slurm = RecordingSlurm([info])
    with History(tmp_path / "ops.db") as history:
        outcome = resume(cfg, slurm, history, NODE, "fixed")
    assert outcome.exit_code == 0 and slurm.resumes == [NODE]


def test_the_resume_row_is_stamped_now(tmp_path: Path) -> None:
    import time

    before = time.time()
    _, _, _, rows = _resume(tmp_path, NodeInfo(NODE, "drained", "rack 7"))
    assert before <= rows[0]["ts"] <= time.time()


def test_resume_node_opens_the_configured_slurm_and_the_nodes_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _config(tmp_path)
    slurm = RecordingSlurm([NodeInfo(NODE, "drained", "rack 7", "root")])
    opened: list[tuple[str, float]] = []

    def open_slurm(backend: str, timeout_s: float) -> RecordingSlurm:
        opened.append((backend, timeout_s))
        return slurm

    monkeypatch.setattr(resume_mod, "open_slurm", open_slurm)
    refused = resume_mod.resume_node(cfg, NODE, "fixed")
    assert refused.exit_code == 1 and slurm.resumes == []
    assert opened == [(cfg.slurm.backend, cfg.slurm.command_timeout_s)]
    forced = resume_mod.resume_node(cfg, NODE, "fixed", force=True)
    assert forced.exit_code == 0 and slurm.resumes == [NODE]
    rows = table_rows(tmp_path / "history.db", "drains")
    assert [(r["state"], r["node"], r["reason"]) for r in rows] == [
        ("resume_refused", NODE, "fixed"),
        ("resumed", NODE, "fixed"),
    ]
    assert [r["node"] for r in resume_mod.node_overview(cfg)] == [NODE]


def test_overview_reads_each_nodes_own_history(tmp_path: Path) -> None:
    """Per-node history files read from the head node: each node its own."""
    cfg = _head_config(tmp_path)
    for node, status in ((NODE, "fail"), ("n2", "ok")):
        with History(tmp_path / f"{node}.db") as history:
            run = {"run_id": node, "ts": 100.0, "node": node, "phase": "prolog", "status": status}
            history.write(Batch(inserts=[("check_runs", run)]))
    slurm = RecordingSlurm([NodeInfo(NODE, "idle"), NodeInfo("n2", "idle")])
    n1, n2 = overview(cfg, slurm)
    assert (n1["last_status"], n2["last_status"]) == ("fail", "ok")


def test_overview_of_a_shared_history_picks_the_nodes_own_rows(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    with History(tmp_path / "history.db") as history:
        mine = {"run_id": "r1", "ts": 100.0, "node": NODE, "phase": "prolog", "status": "ok"}
        theirs = {"run_id": "r2", "ts": 200.0, "node": "n2", "phase": "epilog", "status": "fail"}
        step = {"ts": 300.0, "node": "n2", "action": "reboot", "outcome": "ok",
                "started": 290.0, "fault": "xid_79"}  # fmt: skip
        history.write(Batch(inserts=[("check_runs", mine), ("check_runs", theirs),
                                     ("remediations", step)]))  # fmt: skip
    (n1,) = overview(cfg, RecordingSlurm([NodeInfo(NODE, "idle")]))
    assert (n1["last_phase"], n1["last_status"], n1["remediation"]) == ("prolog", "ok", None)
