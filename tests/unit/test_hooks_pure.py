"""The pure parts of the prolog/epilog: job environment, drain reasons."""

from __future__ import annotations

import pytest

from slurmhealth.errors import UsageError
from slurmhealth.hooks.drain import drain_reason
from slurmhealth.hooks.job import job_from_env, parse_gpu_list
from slurmhealth.model import Action, Finding, Severity
from slurmhealth.slurm import MAX_REASON, NodeInfo, clean_reason


def test_job_from_slurm_2205_prolog_env() -> None:
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_USER": "alice",
        "SLURM_JOB_UID": "1001",
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_NODELIST": "n[1-3]",
        "SLURMD_NODENAME": "n2",
        "SLURM_JOB_GPUS": "0,1,5",
    }
    job = job_from_env(env, node="host")
    assert (job.job_id, job.node, job.user, job.uid) == ("4242", "n2", "alice", 1001)
    assert job.gpus == (0, 1, 5) and job.nodes == "n[1-3]"
    assert job.account == "" and job.priority is None  # 22.05 does not pass them


def test_job_from_newer_slurm_env_with_optout() -> None:
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_ACCOUNT": "ml",
        "SLURM_JOB_QOS": "high",
        "SLURM_JOB_EXTRA": "team=x,slurmhealth=off",
        "SLURM_JOB_EXIT_CODE2": "3:0",
    }
    job = job_from_env(env, node="n1")
    assert job.node == "n1" and job.account == "ml" and job.qos == "high"
    assert job.opted_out("slurmhealth=off") and not job.opted_out("")
    assert job.failed
    assert not job_from_env({"SLURM_JOB_ID": "7", "SLURM_JOB_EXIT_CODE2": "0:0"}, "n").failed


def test_job_env_needs_a_job_id() -> None:
    with pytest.raises(UsageError, match="SLURM_JOB_ID"):
        job_from_env({}, node="n1")


@pytest.mark.parametrize(
    ("text", "gpus"), [("", ()), ("3", (3,)), ("0,2", (0, 2)), ("0-3,6", (0, 1, 2, 3, 6))]
)
def test_gpu_list(text: str, gpus: tuple[int, ...]) -> None:
    assert parse_gpu_list(text) == gpus


def test_gpu_list_rejects_garbage() -> None:
    with pytest.raises(UsageError, match="SLURM_JOB_GPUS"):
        parse_gpu_list("gpu:2")


def _f(check: str, sev: Severity, gpu: int | None, msg: str) -> Finding:
    return Finding(check=check, severity=sev, message=msg, action=Action.DRAIN, gpu=gpu)


def test_drain_reason_names_the_worst_check_and_gpu() -> None:
    reason = drain_reason(
        [
            _f("pcie_link", Severity.FAIL, 1, "PCIe x8"),
            _f("gpu_lost", Severity.CRITICAL, 5, "GPU is lost (fallen off the bus)"),
        ]
    )
    assert reason == "slurmhealth: gpu_lost gpu5 GPU is lost (fallen off the bus) (+1 more)"


def test_drain_reason_names_xids_behind_another_finding() -> None:
    xid = Finding(
        check="xid",
        severity=Severity.CRITICAL,
        message="Xid 79 GPU has fallen off the bus on 0000:ab:00.0",
        action=Action.RESET,
        gpu=5,
        evidence={"xid": 79},
    )
    lost = _f("gpu_lost", Severity.CRITICAL, 5, "GPU is lost (fallen off the bus)")
    assert drain_reason([xid, lost]) == (
        "slurmhealth: gpu_lost gpu5 GPU is lost (fallen off the bus) [Xid 79] (+1 more)"
    )
    assert drain_reason([xid]).startswith("slurmhealth: xid gpu5 Xid 79 ")


def test_reason_is_one_short_line() -> None:
    reason = clean_reason("slurmhealth: x\nsecond line\t" + "y" * 500)
    assert "\n" not in reason and "\t" not in reason and len(reason) == MAX_REASON


def test_node_info_knows_our_drains() -> None:
    ours = NodeInfo("n2", "drained", "slurmhealth: xid gpu3 Xid 79")
    admin = NodeInfo("n3", "draining", "bad fan, ticket 123", "root")
    assert ours.drained and ours.ours
    assert admin.drained and not admin.ours
    assert not NodeInfo("n1", "idle").drained
