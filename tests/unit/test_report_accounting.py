"""The report of a job only Slurm accounting knows (a login node, the nodes' files gone):
facts from sacct, verdict and failing rows from the AdminComment summary, drains from
sacctmgr's node events; the owner check first."""

from __future__ import annotations

import os
import pwd
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import pytest

from slurmhealth.access import AccessDenied
from slurmhealth.config import Config, load_config
from slurmhealth.diagnose.engine import diagnose, verdict
from slurmhealth.diagnose.facts import Facts, NodeFacts
from slurmhealth.model_records import Job
from slurmhealth.report.answer import answer
from slurmhealth.report.efficiency import efficiency
from slurmhealth.report.gather import build_report
from slurmhealth.slurm import SlurmCli
from slurmhealth.summary import admin_comment

T0 = 1_796_156_844
REASON = "slurmhealth: gpu_lost gpu5 GPU is lost (fallen off the bus) [Xid 79]"


def _stored() -> str:
    """What ctld-epilog stored for the job when every node's history was there."""
    finding = {
        "check_name": "gpu_lost",
        "severity": "critical",
        "gpu": 5,
        "ts": T0 + 4.0,
        "message": "GPU 5: GPU is lost (fallen off the bus)",
        "evidence": {"xid": 79},
    }
    nodes = (
        NodeFacts("n1"),
        NodeFacts(
            "n2",
            findings=(finding,),
            drains=({"state": "drained", "reason": REASON, "ts": T0 + 9.0},),
        ),
        NodeFacts("n3"),
    )
    facts = Facts(
        Job(
            "7",
            user="u",
            node_names=("n1", "n2", "n3"),
            state="failed",
            exit_code="3:0",
            start_ts=T0,
            end_ts=T0 + 8.0,
        ),
        nodes,
    )
    diags = diagnose(facts)
    text = verdict(diags, facts)
    report = SimpleNamespace(verdict=text, answer=answer(text, diags, facts),
                             efficiency=efficiency(facts), nodes=nodes)  # fmt: skip
    return admin_comment.fit(report)


@pytest.fixture
def accounting(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """sacct and sacctmgr as slurmdbd answered for job 7 (owned by this process' user)."""
    me = pwd.getpwuid(os.getuid()).pw_name
    out = {
        "sacct": f"7|{me}|acct|gpu|normal|n[1-3]|FAILED|3:0|{T0}|{T0 + 8}|60|gres/gpu=24|"
        + _stored() + "\n",
        "sacctmgr": f"n2|{T0 + 9}|Unknown|DRAIN|root(0)|{REASON}\n"
        f"n3|{T0 - 86400}|{T0 - 80000}|DRAIN|root(0)|yesterday's, not this job's\n",
    }  # fmt: skip
    calls: list[list[str]] = []

    def run(self: SlurmCli, argv: Sequence[str], time_format: str = "standard") -> str:
        calls.append(list(argv))
        return out[argv[0]]

    monkeypatch.setattr(SlurmCli, "_run", run)
    return calls


def _cfg(tmp_path: Path) -> Config:
    """A login node's config: no node history or evidence dir reachable."""
    path = tmp_path / "login.toml"
    path.write_text(f'[paths]\ndb = "{tmp_path}/none/{{node}}.db"\n'
                    f'evidence_dir = "{tmp_path}/none/evidence"\n')  # fmt: skip
    return load_config(str(path), env={})


def test_a_job_only_accounting_knows_gets_the_stored_verdict_and_slurmdbds_drain(
    tmp_path: Path, accounting: list[list[str]]
) -> None:
    report = build_report(_cfg(tmp_path), "7", requester_uid=os.getuid())
    assert report.verdict.startswith("GPU 5 on n2 fell off the bus (Xid 79)")
    assert report.answer is not None and report.answer.fault_class == "hardware"
    assert "--exclude=n2" in report.answer.user_action
    assert report.job.node_names == ("n1", "n2", "n3") and report.job.time_limit_s == 3600
    drains = {nf.node: [d["reason"] for d in nf.drains] for nf in report.nodes}
    assert drains == {"n1": [], "n2": [REASON], "n3": []}  # yesterday's n3 drain is not it
    assert {s for _n, s, _p in report.sources} == {"accounting", "summary", "node events"}
    assert dict(report.unreached)["prometheus"] == "report.prometheus_url is not set"


def test_another_user_is_refused_before_anything_else_is_read(
    tmp_path: Path, accounting: list[list[str]]
) -> None:
    with pytest.raises(AccessDenied, match="job 7 belongs to"):
        build_report(_cfg(tmp_path), "7", requester_uid=65534)
    assert [c[0] for c in accounting] == ["sacct"]  # no node events, no Prometheus


def test_the_terminal_report_names_the_sources_it_read_and_those_it_could_not(
    tmp_path: Path, accounting: list[list[str]]
) -> None:
    from rich.console import Console

    from slurmhealth.report.render import print_report

    con = Console(record=True, width=200)
    print_report(build_report(_cfg(tmp_path), "7", requester_uid=os.getuid()), con)
    text = con.export_text()
    assert "read from Slurm accounting: accounting (sacct), summary (AdminComment)" in text
    assert "not used: prometheus: report.prometheus_url is not set" in text
