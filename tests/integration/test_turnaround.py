"""Job turnaround on the real cluster: the epilog returns with its decision and the rest
(the evidence bundle, summary.json, the AdminComment in slurmdbd) follows detached, from
the job's first node, with no EpilogSlurmctld; a failed job still gets all of it."""

from __future__ import annotations

import json
import subprocess
import time

from slurmhealth.summary.admin_comment import decode
from tests.integration.conftest import Cluster

WITHIN_S = 30.0  # the acceptance: AdminComment in sacct this long after the job's end


def _sacct(job_id: str, fields: str) -> str:
    out = subprocess.run(["sacct", "-j", job_id, "-X", "-o", fields, "-P", "-n"],
                         capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    return out.stdout.strip()


def test_a_failed_job_gets_its_bundle_summary_and_admin_comment_after_it_completed(
    healthy: Cluster,
) -> None:
    conf = healthy.scontrol("show", "config").splitlines()
    (ctld,) = [line for line in conf if line.startswith("EpilogSlurmctld ")]
    assert ctld.split("=", 1)[1].strip() == "(null)"  # the nodes store it themselves
    job = healthy.sbatch("-N1", "-w", "n1", "--gres=gpu:2", "-o", "/dev/null", "--wrap",
                         "exit 3", timeout=60)  # fmt: skip
    assert job.state == "FAILED"
    ended = time.time()
    deadline = time.monotonic() + WITHIN_S
    stored = ""
    while not stored and time.monotonic() < deadline:
        stored = _sacct(job.job_id, "AdminComment")
        time.sleep(0.25)
    took = time.time() - ended
    assert stored.startswith("sh1:"), f"no AdminComment {WITHIN_S:g} s after the job ended"
    summary = decode(stored)
    assert summary is not None and summary["v"], summary
    # the job was already COMPLETED in slurmdbd when its summary landed there
    assert _sacct(job.job_id, "State").startswith("FAILED")
    node_dir = healthy.dir / "evidence" / job.job_id / "n1"
    assert (node_dir / "manifest.json").exists()  # the full bundle: the job failed
    node_summary = json.loads((node_dir / "summary.json").read_text())
    assert node_summary["node"] == "n1"
    assert not list((healthy.node_dir("n1") / "run" / "pending").glob(f"{job.job_id}.*"))
    print(f"AdminComment in sacct {took:.1f} s after the job's end")
