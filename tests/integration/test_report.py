"""Evidence and `slurmhealth report` on the real cluster: a 3-node job that loses a GPU,
and a hang caught while the job's Python process is still alive."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.conftest import Cluster
from tests.support.skips import unavailable

REPO = Path(__file__).resolve().parents[2]
GPU5_OFF_THE_BUS_ON_N2 = """
name = "n2-gpu5-lost"
[[nodes.n2.faults]]
gpu = 5
at = 4
xid = 79
xid_message = "GPU has fallen off the bus."
set = { lost = true }
"""
ALL_IDLE = """
name = "all-idle"
[all_gpus]
utilization_gpu = 0
"""


def _as_user(
    user: str, *args: str, cluster: Cluster, config: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`slurmhealth ARGS` run by an ordinary user: Debian's python3 with the checkout and the
    venv's (pure-Python) packages on the path, since the venv's interpreter lives under
    /root here. ``config``: the user's config file (default: the cluster's)."""
    site = next((REPO / ".venv" / "lib").glob("python3*/site-packages"))
    return subprocess.run(
        [
            "runuser",
            "-u",
            user,
            "--",
            "env",
            f"PYTHONPATH={REPO}:{site}",
            f"SLURMHEALTH_CONFIG={config or cluster.dir / 'slurmhealth.toml'}",
            "/usr/bin/python3",
            "-m",
            "slurmhealth",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
    )


def _needs_user_python() -> None:
    if not Path("/usr/bin/python3").exists():
        unavailable("no /usr/bin/python3 to run slurmhealth as an ordinary user")


def test_gpu_lost_mid_job_bundles_every_node_and_report_says_why(
    healthy: Cluster, tmp_path: Path
) -> None:
    _needs_user_python()
    healthy.set_scenario(GPU5_OFF_THE_BUS_ON_N2)
    job = healthy.sbatch("-N3", "--gres=gpu:8", "-o", "/dev/null", "--wrap",
                       "srun sleep 8; exit 3", timeout=90)  # fmt: skip
    assert job.state == "FAILED"
    evidence = healthy.dir / "evidence" / job.job_id
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(
        (evidence / n / "summary.json").exists() for n in ("n1", "n2", "n3")
    ):
        time.sleep(0.2)
    for node in ("n1", "n2", "n3"):
        manifest = json.loads((evidence / node / "manifest.json").read_text())
        for entry in manifest["files"]:
            data = (evidence / node / entry["name"]).read_bytes()
            import hashlib

            assert hashlib.sha256(data).hexdigest() == entry["sha256"], entry["name"]
            assert len(data) == entry["size"]
        assert (evidence / node / "summary.json").exists()
    assert "NVRM: Xid (PCI:0000:ab:00): 79" in (evidence / "n2" / "kernel.log").read_text()
    assert healthy.sinfo_reasons()["n2"].startswith("slurmhealth:")

    proc = _as_user("shuser", "report", job.job_id, "--json", cluster=healthy)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    verdict = report["verdict"]
    assert "Xid 79" in verdict and "n2" in verdict and "GPU 5" in verdict, verdict
    assert "drained" in verdict, verdict
    times = [e["ts"] for e in report["timeline"]]
    assert times == sorted(times)
    assert {e["node"] for e in report["timeline"] if e["node"]} >= {"n1", "n2", "n3"}
    html = tmp_path / "report.html"
    proc = _as_user("shuser", "report", job.job_id, "--html", "/tmp/shuser-report.html",
                    cluster=healthy)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    shutil.copy("/tmp/shuser-report.html", html)
    chromium = shutil.which("chromium")
    if chromium is None:
        unavailable("Debian's chromium is not installed")
    dom = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'chrome'}",
            "--dump-dom",
            f"file://{html}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    ).stdout
    # the browser built the DOM: one utilisation and one power plot per node, a line per GPU
    import re

    assert len(re.findall(r"<svg[^>]*\bplot-util\b", dom)) == 3, dom[:300]
    assert len(re.findall(r"<svg[^>]*\bplot-power\b", dom)) == 3
    assert dom.count("<polyline") >= 3 * 8

    # another user: refused, and cannot read the evidence either
    if subprocess.run(["id", "shuser2"], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "-M", "shuser2"], check=True)
    refused = _as_user("shuser2", "report", job.job_id, "--json", cluster=healthy)
    assert refused.returncode == 4 and "belongs to shuser" in refused.stderr
    peek = subprocess.run(
        ["runuser", "-u", "shuser2", "--", "cat", str(evidence / "n2" / "kernel.log")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert peek.returncode != 0 and "Permission denied" in peek.stderr
    # the evidence is root's: nothing in it is the job user's, who reads it through an ACL
    assert (evidence / "n2" / "kernel.log").stat().st_uid == 0
    uid = str(pwd.getpwnam("shuser").pw_uid)
    found = subprocess.run(["find", str(healthy.dir / "evidence"), "-uid", uid],
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert found.stdout == ""
    cat = ["runuser", "-u", "shuser", "--", "cat", str(evidence / "n2" / "kernel.log")]
    mine = subprocess.run(cat, capture_output=True, text=True, check=False)
    assert "Xid" in mine.stdout, mine.stderr


def test_hang_is_caught_with_a_live_stack(healthy: Cluster) -> None:
    config = healthy.dir / "slurmhealth.toml"
    saved = config.read_text()
    config.write_text(saved.replace("job_check_interval_s = 15.0",
                                    "job_check_interval_s = 15.0\nhang_after_s = 3.0"))  # fmt: skip
    healthy.set_scenario(ALL_IDLE)
    script = "import time\ndef wait_for_allreduce():\n    time.sleep(40)\nwait_for_allreduce()\n"
    try:
        job = healthy.sbatch("-N1", "-w", "n1", "--gres=gpu:8", "-o", "/dev/null", "--wrap",
                           f"python3 -c '{script}'", wait=False)  # fmt: skip
        healthy.wait_job(job.job_id, states=frozenset({"RUNNING"}), timeout=30)
        stacks = healthy.dir / "evidence" / job.job_id / "n1" / "stacks.txt"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (stacks.exists() and stacks.stat().st_size):
            time.sleep(0.3)
        assert "wait_for_allreduce" in stacks.read_text()  # py-spy saw the live process
        subprocess.run(["scancel", job.job_id], check=False)
        healthy.wait_job(job.job_id, timeout=60)
    finally:
        config.write_text(saved)
    proc = subprocess.run(
        [sys.executable, "-m", "slurmhealth", "report", job.job_id, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "SLURMHEALTH_CONFIG": str(config)},
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert any(d["rule"] == "collective_hang" for d in report["diagnoses"])
    assert report["verdict"].startswith("job hung on n1"), report["verdict"]
