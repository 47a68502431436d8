"""Remediation's fleet decisions (slurmhealth.hooks.remediate_plan): which nodes it may touch,
how many at once, the claim two nodes race for, the attempts that count, and each row of
`slurmhealth remediate --dry-run` with the action and why an operator reads there."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from slurmhealth.config import Config, load_config
from slurmhealth.hooks import remediate_plan as rp
from slurmhealth.slurm import REASON_PREFIX, NodeInfo
from tests.support.recording_slurm import RecordingSlurm

OURS = f"{REASON_PREFIX} row_remap gpu4 pending"
RESET = {"check": "row_remap", "gpu": 4, "action": "reset", "message": "pending"}


def _cfg(tmp_path: Path, **flags: Any) -> Config:
    (tmp_path / "config.toml").write_text("")
    return load_config(
        str(tmp_path / "config.toml"),
        env={},
        flags={"remediate.enabled": True, "paths.evidence_dir": str(tmp_path / "ev"),
               **{f"remediate.{k}": v for k, v in flags.items()}},
    )  # fmt: skip


def _idle(n: int) -> list[NodeInfo]:
    return [NodeInfo(f"n{i}", "idle") for i in range(1, n + 1)]


def test_in_remediation_by_our_tag_or_slurms_reboot_state() -> None:
    assert rp.in_remediation(NodeInfo("n1", "drained", f"{rp.REMEDIATING} xid 79"))
    assert rp.in_remediation(NodeInfo("n1", "drained", f"{rp.REBOOTING} xid 79"))
    assert rp.in_remediation(NodeInfo("n1", "reboot^", "anything"))
    assert not rp.in_remediation(NodeInfo("n1", "drained", OURS))
    assert not rp.in_remediation(NodeInfo("n1", "drained", f"{rp.SERVICE} xid 79"))


def test_the_fault_a_reason_names() -> None:
    assert rp.fault_of(f"{rp.REMEDIATING} row_remap gpu4") == "row_remap gpu4"
    assert rp.fault_of(f"{rp.REBOOTING}  gpu_lost gpu3 ") == "gpu_lost gpu3"
    assert rp.fault_of(f"{rp.SERVICE} gpu_lost gpu3") == "gpu_lost gpu3"
    assert rp.fault_of(OURS) == "row_remap gpu4 pending"
    assert rp.fault_of("maintenance") == "maintenance"
    back = f"{OURS} (back after reboot)"  # one fault, however many reboots it survived
    again = f"{rp.REBOOTING} {rp.fault_of(back)}"
    assert rp.fault_of(back) == rp.fault_of(again) == "row_remap gpu4 pending"


def test_scope_by_hostlist_and_partition(tmp_path: Path) -> None:
    nodes = _idle(5)
    parts = {"n1": ["gpu"], "n2": ["gpu", "debug"], "n3": ["cpu"], "n4": ["debug"]}
    assert rp.scope(_cfg(tmp_path), nodes, lambda: parts) == nodes
    names = [n.name for n in rp.scope(_cfg(tmp_path, nodes="n[2-4]"), nodes, lambda: parts)]
    assert names == ["n2", "n3", "n4"]
    cfg = _cfg(tmp_path, partitions=["debug", "x"])
    assert [n.name for n in rp.scope(cfg, nodes, lambda: parts)] == ["n2", "n4"]
    cfg = _cfg(tmp_path, partitions=["gpu"], nodes="n[2-5]")
    assert [n.name for n in rp.scope(cfg, nodes, lambda: parts)] == ["n2"]
    assert rp.scope(_cfg(tmp_path, nodes="  "), nodes, lambda: {}) == nodes


@pytest.mark.parametrize(
    ("nodes", "concurrent", "fraction", "cap"),
    [
        (100, 5, 0.10, 5),
        (100, 20, 0.10, 10),
        (30, 5, 0.10, 3),
        (5, 5, 0.10, 1),
        (10, 5, 0.3, 3),
        (0, 5, 0.10, 1),
        (29, 9, 0.10, 2),
    ],
)
def test_the_limit_is_the_smaller_of_the_count_and_the_share(
    tmp_path: Path, nodes: int, concurrent: int, fraction: float, cap: int
) -> None:
    cfg = _cfg(tmp_path, max_concurrent=concurrent, max_fraction=fraction)
    assert rp.limit(cfg, _idle(nodes)) == cap


def test_a_claim_marks_the_node_with_its_fault(tmp_path: Path) -> None:
    me = NodeInfo("n1", "drained", OURS, "root", 5.0)
    slurm = RecordingSlurm([me, *_idle(10)[1:]])
    assert rp.claim(_cfg(tmp_path), slurm, me, "row_remap gpu4", dict) == ""
    assert slurm.drains == [("n1", f"{rp.REMEDIATING} row_remap gpu4")]


def test_the_breaker_refuses_a_claim_over_the_limit(tmp_path: Path) -> None:
    busy = [NodeInfo("n2", "drained", f"{rp.REBOOTING} x", "root", 2.0),
            NodeInfo("n3", "reboot^", "", "root", 1.0)]  # fmt: skip
    me = NodeInfo("n1", "drained", OURS, "root", 5.0)
    slurm = RecordingSlurm([me, *busy, *_idle(40)[3:]])
    why = rp.claim(_cfg(tmp_path, max_concurrent=2), slurm, me, "f", dict)
    assert why == "circuit breaker: n3, n2 in remediation (limit 2)"  # oldest first
    assert slurm.drains == []
    assert rp.claim(_cfg(tmp_path, max_concurrent=3), slurm, me, "f", dict) == ""


def test_the_later_of_two_racing_claims_gives_way(tmp_path: Path) -> None:
    me = NodeInfo("n2", "drained", OURS, "root", 5.0)
    slurm = RecordingSlurm([NodeInfo("n1", "drained", OURS, "root", 1.0), me, *_idle(9)[2:]])
    real_drain = slurm.drain

    def racing_drain(node: str, reason: str) -> None:
        real_drain(node, reason)
        if node == "n2" and reason.startswith(rp.REMEDIATING):  # n1 claims at the same time
            slurm.table["n1"] = NodeInfo("n1", "drained", f"{rp.REMEDIATING} x", "root", 1.0)
            slurm.table["n2"] = NodeInfo("n2", "drained", reason, "root", 6.0)

    slurm.drain = racing_drain  # type: ignore[method-assign]
    why = rp.claim(_cfg(tmp_path), slurm, me, "f", dict)
    assert why == "circuit breaker: n1 claimed first (limit 1)"
    assert slurm.drains[-1] == ("n2", OURS)  # its own reason back


def test_the_attempts_that_count() -> None:
    rows = [
        {"action": "reset", "outcome": "ok", "started": 900.0},
        {"action": "reboot", "outcome": "failed", "started": 500.0},
        {"action": "reset", "outcome": "refused", "started": 950.0},  # did nothing
        {"action": "validate", "outcome": "ok", "started": 990.0},
        {"action": "reset", "outcome": "ok", "started": 499.0},  # before the window
        {"action": "reboot", "outcome": "ok"},  # no start time: long ago
    ]
    got = rp.attempts_in_window(rows, now=1000.0, window_s=500.0)
    assert got == rows[:2]


def _plan(
    tmp_path: Path,
    fleet: list[NodeInfo],
    history: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]],
    **flags: Any,
) -> dict[str, dict[str, Any]]:
    doc = rp.plan_fleet(_cfg(tmp_path, **flags), fleet, dict, history.get, now=1e10)
    return {r["node"]: r for r in doc["nodes"]}


DRAINED = [{"detail": {"findings": [RESET]}}]


def test_dry_run_rows_for_nodes_it_leaves_alone(tmp_path: Path) -> None:
    nodes = [
        NodeInfo("n1", "idle"),
        NodeInfo("n2", "drained", "rack 7", "alice"),
        NodeInfo("n3", "drained", "rack 7"),
        NodeInfo("n4", "drained", f"{rp.SERVICE} gpu_lost gpu3", "root"),
        NodeInfo("n5", "drained", f"{rp.REMEDIATING} row_remap gpu4", "root", 1.0),
        NodeInfo("n6", "drained", OURS, "root"),
    ]
    rows = _plan(tmp_path, nodes, {}, nodes="n[1-6]")
    assert {n: (r["action"], r["why"]) for n, r in rows.items()} == {
        "n1": ("none", "in service"),
        "n2": ("none", "drained by alice ('rack 7'), not by slurmhealth: left alone"),
        "n3": ("none", "drained ('rack 7'), not by slurmhealth: left alone"),
        "n4": ("none", "service required: waiting for a person"),
        "n5": ("in_progress", "in remediation now"),
        "n6": ("none", "its history is not readable here: run `remediate --dry-run` on it"),
    }
    assert rows["n5"]["fault"] == "row_remap gpu4"
    assert rows["n1"] == {
        "node": "n1", "state": "idle", "reason": "", "action": "none", "gpus": [], "fault": "",
        "attempts": None, "why": "in service",
    }  # fmt: skip
    outside = _plan(tmp_path, nodes, {}, nodes="n2")
    assert outside["n1"]["why"] == "outside [remediate] partitions/nodes"


def test_dry_run_plans_a_reset_then_a_reboot_then_service(tmp_path: Path) -> None:
    node = [NodeInfo("n1", "drained", OURS, "root"), *_idle(9)[1:]]
    rows = _plan(tmp_path, node, {"n1": (DRAINED, [])})
    assert (rows["n1"]["action"], rows["n1"]["gpus"], rows["n1"]["attempts"]) == ("reset", [4], 0)
    assert rows["n1"]["fault"] != ""
    reset_tried = [{"action": "reset", "outcome": "failed", "started": 1e10 - 10}]
    rows = _plan(tmp_path, node, {"n1": (DRAINED, reset_tried)})
    assert (rows["n1"]["action"], rows["n1"]["gpus"], rows["n1"]["attempts"]) == ("reboot", [], 1)
    twice = [*reset_tried, {"action": "reboot", "outcome": "failed", "started": 1e10 - 5}]
    rows = _plan(tmp_path, node, {"n1": (DRAINED, twice[::-1])})
    assert (rows["n1"]["action"], rows["n1"]["why"]) == (
        "service_required",
        "2 attempts in the window",
    )
    rows = _plan(tmp_path, node, {"n1": (DRAINED, twice[::-1])}, max_attempts=3)
    # the newest attempt a reboot (not a reset): the plan's own step again
    assert (rows["n1"]["action"], rows["n1"]["gpus"]) == ("reset", [4])


def test_dry_run_without_a_known_fault_names_why(tmp_path: Path) -> None:
    node = [NodeInfo("n1", "drained", OURS, "root"), *_idle(9)[1:]]
    rows = _plan(tmp_path, node, {"n1": ([], [])})
    assert rows["n1"]["action"] == "none" and rows["n1"]["why"]
    assert rows["n1"]["fault"] == "row_remap gpu4 pending"  # from the reason


@pytest.mark.parametrize(
    "state", ["draining", "mixed+drain", "allocated+drain", "completing+drain"]
)
def test_dry_run_waits_for_running_jobs(tmp_path: Path, state: str) -> None:
    node = [NodeInfo("n1", state, OURS, "root"), *_idle(9)[1:]]
    rows = _plan(tmp_path, node, {"n1": (DRAINED, [])})
    assert (rows["n1"]["action"], rows["n1"]["why"]) == (
        "wait",
        "jobs still run there: never touched",
    )


def test_dry_run_takes_the_breakers_slots_in_node_order(tmp_path: Path) -> None:
    nodes = [NodeInfo(f"n{i}", "drained", OURS, "root") for i in (3, 1, 2)] + _idle(20)[3:]
    history = {n: (DRAINED, []) for n in ("n1", "n2", "n3")}
    rows = _plan(tmp_path, nodes, history, max_concurrent=2)
    assert [rows[n]["action"] for n in ("n1", "n2", "n3")] == ["reset", "reset", "skip"]
    assert rows["n3"]["why"] == "circuit breaker: n1, n2 (limit 2)"
    doc = rp.plan_fleet(_cfg(tmp_path, max_concurrent=2), nodes, dict, history.get, now=1e10)
    assert {k: v for k, v in doc.items() if k != "nodes"} == {
        "schema": "slurmhealth.remediate-plan/1", "enabled": True, "limit": 2,
        "max_attempts": 2, "window_s": 86400.0,
    }  # fmt: skip


def test_the_incident_folder_and_file(tmp_path: Path) -> None:
    import json
    import os
    import stat

    cfg = _cfg(tmp_path)
    seen: list[str] = []

    def bug_report(folder: str) -> dict[str, Any]:
        seen.append(folder)
        return {"path": os.path.join(folder, "nvidia-bug-report.log.gz"), "ok": True}

    doc = {"node": "n1", "fault": "gpu_lost gpu3", "attempts": [{"action": "reboot"}]}
    folder = rp.write_incident(cfg, "n1", doc, bug_report, now=1_700_000_000.0)
    assert folder == str(tmp_path / "ev" / "remediation" / "n1-20231114T221320Z")
    assert seen == [folder]
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o750
    path = Path(folder) / "incident.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert json.loads(path.read_text()) == {
        "schema": "slurmhealth.remediation-incident/1",
        **doc,
        "nvidia_bug_report": {"path": f"{folder}/nvidia-bug-report.log.gz", "ok": True},
    }
    path.unlink()
    (Path(folder) / "target").write_text("")
    path.symlink_to(Path(folder) / "target")  # planted: never written through
    with pytest.raises(OSError):
        rp.write_incident(cfg, "n1", doc, bug_report, now=1_700_000_000.0)


def test_dry_run_reads_the_histories_this_host_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurmhealth import slurm as slurm_mod
    from slurmhealth.history import Batch, History

    (tmp_path / "config.toml").write_text("")
    cfg = load_config(
        str(tmp_path / "config.toml"),
        env={},
        flags={"remediate.enabled": True, "node.name": "n1",
               "paths.db": str(tmp_path / "history.db")},
    )  # fmt: skip
    drained = {"ts": 10.0, "node": "n1", "state": "drained", "reason": OURS, "actor": "x",
               "detail": {"findings": [RESET]}}  # fmt: skip
    other = {**drained, "node": "n2", "detail": {"findings": []}}
    step = {"ts": 1.0, "node": "n1", "action": "reset", "outcome": "failed",
            "started": time.time() - 60}  # fmt: skip
    with History(tmp_path / "history.db") as history:
        history.write(Batch(inserts=[("drains", drained), ("drains", other),
                                     ("remediations", step)]))  # fmt: skip
    nodes = [NodeInfo("n1", "drained", OURS, "root"), NodeInfo("n2", "drained", OURS, "root"),
             *_idle(12)[2:]]  # fmt: skip
    opened: list[tuple[str, float]] = []

    def open_slurm(backend: str, timeout: float) -> RecordingSlurm:
        opened.append((backend, timeout))
        return RecordingSlurm(nodes)

    monkeypatch.setattr(slurm_mod, "open_slurm", open_slurm)
    monkeypatch.setattr(slurm_mod, "node_partitions", lambda timeout: {})
    doc = rp.dry_run(cfg)
    assert opened == [(cfg.slurm.backend, cfg.slurm.command_timeout_s)]
    rows = {r["node"]: r for r in doc["nodes"]}
    assert (rows["n1"]["action"], rows["n1"]["attempts"]) == ("reboot", 1)  # its reset failed
    assert rows["n2"]["why"].startswith("its history is not readable here")  # not this host's
    (tmp_path / "history.db").write_bytes(b"not a database" * 100)
    assert rp.dry_run(cfg)["nodes"][0]["why"].startswith("its history is not readable here")


def _f(check: str, gpu: int | None = 4, action: str = "reset", **kw: Any) -> dict[str, Any]:
    return {"check": check, "gpu": gpu, "action": action, "message": "m", **kw}


def test_the_first_repair_of_a_nodes_faults() -> None:
    from slurmhealth.checks.remediation import Plan, plan

    assert plan([]) == Plan("none", why="no recorded fault to repair")
    assert plan([_f("row_remap", action="warn")]).why == "no recorded fault to repair"
    two = plan([_f("row_remap", 4), _f("gpu_lost", 1), _f("row_remap", 4), _f("x", action="warn")])
    assert two.to_dict() == {"step": "reset", "gpus": [1, 4], "fault": "row_remap gpu4 m (+2 more)",
                             "why": ""}  # fmt: skip
    assert plan([_f("row_remap", 4)]).fault == "row_remap gpu4 m"
    reboot = plan([_f("row_remap", 4), _f("xid", 2, evidence={"xid": 79})])
    assert (reboot.step, reboot.gpus) == ("reboot", ())
    by_name = {"check_name": "row_remap", "gpu": 2, "action": "reset", "message": "pending"}
    assert plan([by_name]).to_dict() == {"step": "reset", "gpus": [2],
                                         "fault": "row_remap gpu2 pending", "why": ""}  # fmt: skip
    drain_only = plan([_f("row_remap", 4, action="drain")])
    assert drain_only == Plan("none", fault="row_remap gpu4 m", why="needs hands: row_remap gpu4 m")
    assert plan([{"action": "reset"}]).why == "needs hands: ?"


@pytest.mark.parametrize(
    ("evidence", "step"),
    [
        ({"xid": 119}, "reset"),
        ({"xid": "79"}, "reboot"),
        ({"xid": 13}, "none"),
        ({"xid": "x"}, "none"),
        ({}, "none"),
        ("79", "none"),
        (None, "none"),
    ],
)
def test_an_xid_is_repaired_by_its_catalog_action(evidence: Any, step: str) -> None:
    from slurmhealth.checks.remediation import first_step

    assert first_step(_f("xid", 3, evidence=evidence)) == step


def test_the_breaker_counts_only_the_partitions_in_scope(tmp_path: Path) -> None:
    busy = NodeInfo("n2", "drained", f"{rp.REMEDIATING} x", "root", 2.0)
    me = NodeInfo("n1", "drained", OURS, "root", 5.0)
    slurm = RecordingSlurm([me, busy, *_idle(10)[2:]])
    parts = {"n1": ["gpu"], "n2": ["cpu"]}
    cfg = _cfg(tmp_path, partitions=["gpu"])
    assert rp.claim(cfg, slurm, me, "f", lambda: parts) == ""  # n2 is not in scope
    rows = rp.plan_fleet(cfg, [me, busy], lambda: parts, {"n1": (DRAINED, [])}.get, now=1e10)
    assert [r["action"] for r in rows["nodes"]] == ["reset", "none"]


def test_nodes_in_remediation_oldest_first_and_those_without_a_time_last(
    tmp_path: Path,
) -> None:
    busy = [NodeInfo("n2", "drained", f"{rp.REBOOTING} x", "root", None),
            NodeInfo("n3", "drained", f"{rp.REMEDIATING} x", "root", 7.0)]  # fmt: skip
    me = NodeInfo("n1", "drained", OURS, "root", 5.0)
    slurm = RecordingSlurm([me, *busy, *_idle(40)[3:]])
    why = rp.claim(_cfg(tmp_path, max_concurrent=2), slurm, me, "f", dict)
    assert why == "circuit breaker: n3, n2 in remediation (limit 2)"


def test_two_earlier_claims_named_when_ours_gives_way(tmp_path: Path) -> None:
    me = NodeInfo("n2", "drained", OURS, "root", 5.0)
    early = NodeInfo("n1", "drained", f"{rp.REMEDIATING} x", "root", 1.0)
    slurm = RecordingSlurm([early, me, *_idle(40)[2:]])
    real_drain = slurm.drain

    def racing_drain(node: str, reason: str) -> None:
        real_drain(node, reason)
        if node == "n2" and reason.startswith(rp.REMEDIATING):  # n3 claims meanwhile
            slurm.table["n3"] = NodeInfo("n3", "drained", f"{rp.REMEDIATING} y", "root", 2.0)
            slurm.table["n2"] = NodeInfo("n2", "drained", reason, "root", 6.0)

    slurm.drain = racing_drain  # type: ignore[method-assign]
    why = rp.claim(_cfg(tmp_path, max_concurrent=2), slurm, me, "f", dict)
    assert why == "circuit breaker: n1, n3 claimed first (limit 2)"


def test_an_attempt_without_a_start_time_is_older_than_any_window() -> None:
    rows = [{"action": "reset", "outcome": "failed"}]
    assert rp.attempts_in_window(rows, now=1000.0, window_s=999.0) == []
    assert rp.attempts_in_window(rows, now=1000.0, window_s=1000.0) == rows


def test_dry_run_goes_on_past_a_node_it_cannot_read(tmp_path: Path) -> None:
    nodes = [NodeInfo("n1", "drained", OURS, "root"), NodeInfo("n2", "drained", OURS, "root"),
             NodeInfo("n3", "drained", OURS, "root"), *_idle(20)[3:]]  # fmt: skip
    no_findings = [{"detail": {}}]
    rows = _plan(tmp_path, nodes, {"n2": (DRAINED, []), "n3": (no_findings, [])})
    assert rows["n1"]["why"].startswith("its history is not readable here")
    assert (rows["n2"]["action"], rows["n2"]["why"]) == ("reset", "")
    assert (rows["n3"]["action"], rows["n3"]["why"]) == ("none", "no recorded fault to repair")


def test_the_fault_named_for_two_findings_and_for_a_reboot() -> None:
    from slurmhealth.checks.remediation import plan

    assert plan([_f("row_remap", 4), _f("gpu_lost", 1)]).fault == "row_remap gpu4 m (+1 more)"
    reboot = plan([_f("gpu_lost", None, message="node-wide")])  # no GPU to reset: reboot
    assert (reboot.step, reboot.fault) == ("reboot", "gpu_lost node-wide")


def test_a_second_incident_in_the_same_second_rewrites_the_file(tmp_path: Path) -> None:
    import json

    cfg = _cfg(tmp_path)
    doc = {"node": "n1", "fault": "gpu_lost gpu3", "log": tmp_path / "x.log"}  # not JSON
    first = rp.write_incident(cfg, "n1", doc, lambda folder: {}, now=1_700_000_000.0)
    again = rp.write_incident(cfg, "n1", {**doc, "fault": "later"}, lambda folder: {},
                              now=1_700_000_000.0)  # fmt: skip
    assert again == first
    text = (Path(again) / "incident.json").read_text()
    assert json.loads(text)["fault"] == "later"
    assert json.loads(text)["log"] == str(tmp_path / "x.log")  # written as its text
    assert text.splitlines()[1] == '  "schema": "slurmhealth.remediation-incident/1",'


def test_dry_run_reads_each_nodes_own_history_file_and_the_partitions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """paths.db with {node}: each node's file; [remediate] partitions from Slurm's listing;
    the node's latest drain (not a later row of another state), its own steps only."""
    from slurmhealth import slurm as slurm_mod
    from slurmhealth.history import Batch, History

    (tmp_path / "config.toml").write_text("")
    cfg = load_config(
        str(tmp_path / "config.toml"),
        env={},
        flags={"remediate.enabled": True, "node.name": "n1", "remediate.partitions": ["gpu"],
               "paths.db": str(tmp_path / "history-{node}.db")},
    )  # fmt: skip

    def drained(node: str, findings: list[dict[str, Any]], ts: float = 10.0) -> dict[str, Any]:
        return {"ts": ts, "node": node, "state": "drained", "reason": OURS, "actor": "x",
                "detail": {"findings": findings}}  # fmt: skip

    later = {**drained("n1", []), "ts": 20.0, "state": "suppressed"}
    theirs = {"ts": 1.0, "node": "n9", "action": "reset", "outcome": "failed",
              "started": time.time() - 60}  # fmt: skip
    with History(tmp_path / "history-n1.db") as history:
        history.write(Batch(inserts=[("drains", drained("n1", [RESET])), ("drains", later),
                                     ("remediations", theirs)]))  # fmt: skip
    with History(tmp_path / "history-n2.db") as history:
        history.write(Batch(inserts=[("drains", drained("n2", [{**RESET, "action": "drain"}]))]))
    nodes = [NodeInfo(n, "drained", OURS, "root") for n in ("n1", "n2", "n3")]
    asked: list[float] = []

    def partitions(timeout: float) -> dict[str, list[str]]:
        asked.append(timeout)
        return {"n1": ["gpu"], "n2": ["gpu", "debug"], "n3": ["debug"]}

    monkeypatch.setattr(slurm_mod, "open_slurm", lambda backend, timeout: RecordingSlurm(nodes))
    monkeypatch.setattr(slurm_mod, "node_partitions", partitions)
    rows = {r["node"]: r for r in rp.dry_run(cfg)["nodes"]}
    assert asked and set(asked) == {cfg.slurm.command_timeout_s}
    assert (rows["n1"]["action"], rows["n1"]["gpus"], rows["n1"]["attempts"]) == ("reset", [4], 0)
    assert (rows["n2"]["action"], rows["n2"]["why"]) == (
        "none", "needs hands: row_remap gpu4 pending"
    )  # fmt: skip
    assert rows["n3"]["why"] == "outside [remediate] partitions/nodes"
