"""The fault knowledge base: add an incident for a job, find it again, relate it."""

from __future__ import annotations

import json
from pathlib import Path

from slurmhealth.config import load_config
from slurmhealth.history import Batch, History
from slurmhealth.report import incidents
from tests.conftest import run_cli


def _env(sim_env, tmp_path: Path) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return sim_env("healthy", SLURMHEALTH_EVIDENCE_DIR=str(tmp_path / "evidence"))


def test_add_attaches_the_jobs_context_and_search_finds_it(sim_env, tmp_path: Path) -> None:
    env = _env(sim_env, tmp_path)
    with History(env["SLURMHEALTH_DB"]) as db:
        db.write(
            Batch(
                inserts=[
                    (
                        "findings",
                        {
                            "run_id": "r1",
                            "ts": 1.0,
                            "node": "n2",
                            "job_id": "42",
                            "check_name": "xid",
                            "severity": "critical",
                            "severity_value": 40,
                            "gpu": 5,
                            "uuid": "GPU-5",
                            "message": "Xid 79",
                            "action": "reset",
                            "hint": "",
                            "evidence": {"xid": 79},
                        },
                    ),
                ]
            )
        )
    proc = run_cli(
        "incident", "add", "42", "--symptom", "NCCL timeout then GPU lost",
        "--root-cause", "riser cable on GPU 5", "--fix", "reseated riser",
        "--prevention", "burn-in after moves", "--json", env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    added = json.loads(proc.stdout)
    assert added["schema"] == "slurmhealth.incident/1"
    assert added["nodes"] == ["n2"] and added["gpus"] == ["n2:5"] and added["xids"] == [79]
    out = json.loads(run_cli("incident", "search", "riser", "xid", "--json", env=env).stdout)
    assert out["schema"] == "slurmhealth.incidents/1"
    found = out["incidents"]
    assert [f["job_id"] for f in found] == ["42"] and found[0]["score"] == 1.0
    none = json.loads(run_cli("incident", "search", "thermal", "--json", env=env).stdout)
    assert none["incidents"] == []
    table = run_cli("incident", "search", "riser", env={**env, "COLUMNS": "200"})
    assert "riser cable on GPU 5" in table.stdout


def test_related_links_same_job_and_similar(tmp_path: Path) -> None:
    cfg = load_config(None, env={"SLURMHEALTH_EVIDENCE_DIR": str(tmp_path)}, flags={})
    ctx = {"nodes": {"n2"}, "gpus": {"n2:5"}, "xids": {79}, "checks": {"xid"}}
    incidents.add(cfg, "42", symptom="lost", root_cause="riser", context=ctx, now=100)
    incidents.add(cfg, "7", symptom="lost again", root_cause="riser", context=ctx, now=200)
    other = {"nodes": {"n9"}, "gpus": {"n9:1"}, "xids": {13}, "checks": {"xid"}}
    incidents.add(cfg, "8", symptom="app bug", root_cause="code", context=other, now=300)
    related = incidents.related(cfg, "42", ctx)
    assert [(why, i.job_id) for why, i in related] == [
        ("linked", "42"),
        ("same GPU, same Xid, same node and check", "7"),
    ]


def test_incident_needs_symptom_and_cause(sim_env, tmp_path: Path) -> None:
    env = _env(sim_env, tmp_path)
    proc = run_cli("incident", "add", "42", "--symptom", " ", "--root-cause", "x", env=env)
    assert proc.returncode == 2 and "--symptom" in proc.stderr
