"""Checks know their phase: a previous job's leftovers are judged only where no job should be
running, so `slurmhealth check` by hand on a busy node does not blame the running job."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from slurmhealth.checks import PRE_JOB, catalog, run_checks
from slurmhealth.model import GpuProcess
from tests.conftest import run_cli
from tests.unit.test_checks import ctx, healthy_gpu, node, of

BUSY = replace(
    healthy_gpu(2),
    processes=(GpuProcess(31337, 30 * 2**30),),
    memory_used_bytes=30 * 2**30,
    utilization_gpu_pct=97,
)


@pytest.mark.parametrize("phase", ["check", "epilog", "sidecar"])
def test_a_job_may_be_running_no_leftover_check(phase: str) -> None:
    assert of(run_checks(ctx(node(BUSY), phase=phase)), "stale_job") == []


@pytest.mark.parametrize("phase", ["prolog", "healthcheck", "validate"])
def test_where_no_job_should_run_processes_are_leftovers(phase: str) -> None:
    (f,) = of(run_checks(ctx(node(BUSY), phase=phase)), "stale_job")
    assert f.failing and f.gpu == 2 and f.evidence["pids"] == [31337]


def test_only_leftover_checks_are_pre_job() -> None:
    assert {s.name for s in catalog().values() if s.phases == PRE_JOB} == {
        "stale_job",
        "mig_instance",
    }


def test_check_by_hand_on_a_busy_node_passes_pre_job_fails(sim_env) -> None:
    env = sim_env("stale-process")
    by_hand = run_cli("check", "--json", env=env)
    assert by_hand.returncode == 0, by_hand.stderr
    assert json.loads(by_hand.stdout)["findings"] == []
    idle = run_cli("check", "--pre-job", "--json", env=env)
    assert idle.returncode == 1, idle.stderr
    data = json.loads(idle.stdout)
    assert data["phase"] == "healthcheck"
    assert [(f["check"], f["gpu"]) for f in data["findings"]] == [("stale_job", 2)]
