"""The report of a job whose node slurmhealth already drained says so and what is left:
no "drain n2" for a node drained for that very reason, the way back (validate, resume), and
each piece of evidence once though the prolog and the epilog both cite it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from slurmhealth.report.build import Report
from slurmhealth.report.render import print_report, to_json, to_markdown
from tests.unit.test_report import T0, build, job_row, run_row, write

END = T0 + 600


def nvlink_finding(run_id: str, ts: float) -> dict[str, Any]:
    return {"run_id": run_id, "ts": ts, "node": "n2", "job_id": "50",
            "check_name": "nvlink_inactive", "severity": "fail", "severity_value": 30,
            "gpu": 3, "uuid": "GPU-n2-3", "message": "NVLink 7 inactive", "action": "drain",
            "hint": "an NVLink is down", "evidence": {"link": 7}}  # fmt: skip


def drain(ts: float, state: str, actor: str, reason: str) -> dict[str, Any]:
    return {"ts": ts, "node": "n2", "job_id": "50", "run_id": "p50", "state": state,
            "reason": reason, "actor": actor, "detail": {"note": ""}}  # fmt: skip


def nvlink_job(tmp: Path, *later: dict[str, Any]) -> Path:
    """Job 50 on n2: the prolog found GPU 3's NVLink 7 inactive and drained n2; the epilog
    (of the requeued attempt's cleanup) found it again; ``later`` drains rows follow."""
    dbs = tmp / "db"
    (tmp / "config.toml").write_text(
        f'[node]\nname = "n2"\n[paths]\ndb = "{dbs}/{{node}}.db"\n'
        f'evidence_dir = "{tmp / "evidence"}"\n'
    )
    reason = "slurmhealth: nvlink_inactive gpu3 NVLink 7 inactive"
    write(
        dbs / "n2.db",
        ("check_runs", run_row("p50", T0, "n2", "50", "prolog", "fail")),
        ("findings", nvlink_finding("p50", T0)),
        ("drains", drain(T0 + 1, "drained", "slurmhealth prolog", reason)),
        ("check_runs", run_row("e50", END, "n2", "50", "epilog", "fail")),
        ("findings", nvlink_finding("e50", END)),
        *(("drains", row) for row in later),
        job=job_row("50", "n2", "root", nodes="n2", start_ts=T0, end_ts=END, state="failed"),
    )
    return tmp


def lines(r: Report) -> list[str]:
    con = Console(record=True, width=100)
    print_report(r, con)
    return [line.rstrip() for line in con.export_text().splitlines()]


def test_a_node_slurmhealth_drained_says_already_drained_and_the_way_back(tmp_path: Path) -> None:
    r = build(nvlink_job(tmp_path), "50")
    a = r.answer
    assert a is not None and a.fault_class == "hardware"
    assert a.admin_action.startswith("n2 is already drained (by slurmhealth at 22:13Z)")
    assert "drain n2;" not in a.admin_action and "reset the GPUs" in a.admin_action
    assert "`slurmhealth validate`" in a.admin_action
    assert '`slurmhealth resume n2 --reason "what was fixed"`' in a.admin_action
    assert a.admin_done == ("n2 drained by slurmhealth prolog at 22:13Z (slurmhealth: "
                            "nvlink_inactive gpu3 NVLink 7 inactive); the prolog failed, so "
                            "Slurm requeued the job",)  # fmt: skip
    text = lines(r)
    done = next(i for i, x in enumerate(text) if x.startswith("already done: n2 drained"))
    left = next(i for i, x in enumerate(text) if x.startswith("what the admins should do:"))
    assert done < left and "already drained" in text[left]
    assert "already drained" in to_markdown(r) and "already drained" in str(to_json(r)["answer"])


def test_the_same_evidence_from_prolog_and_epilog_is_listed_once(tmp_path: Path) -> None:
    a = build(nvlink_job(tmp_path), "50").answer
    assert a is not None
    cited = [e for e in a.evidence if "NVLink 7 inactive" in e]
    assert len(cited) == 1 and cited[0].endswith("(x2)"), a.evidence


def test_after_a_resume_the_report_asks_to_drain_again(tmp_path: Path) -> None:
    """Resumed (by an admin) since: slurmhealth's drain is history, the rule's advice stands."""
    r = build(nvlink_job(tmp_path, drain(END + 60, "resumed", "alice", "cable reseated")), "50")
    assert r.answer is not None
    assert r.answer.admin_action.startswith("drain n2;")
    assert any("resumed" in d for d in r.answer.admin_done)


def test_a_node_someone_else_drained_keeps_the_rules_advice(tmp_path: Path) -> None:
    """The epilog found n2 drained by alice since ("held": left as is)."""
    tmp = nvlink_job(tmp_path, drain(END + 60, "held", "slurmhealth epilog", "maintenance"))
    r = build(tmp, "50")
    assert r.answer is not None and r.answer.admin_action.startswith("drain n2;")
