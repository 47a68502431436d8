"""Slurm 24.11 (Debian 13 trixie's slurm-wlm) with the .deb's Prolog and Epilog: a clean
trixie root (debootstrap, cached as a tarball: debian_root.py), Debian's slurmctld, slurmd
and munge in it, the package built there (its venv links to trixie's Python 3.13) and
installed, slurm.conf from the installed snippet, two slurmd (n1, n2) in their own
namespaces (slurm_node.py: nothing touches the host's Slurm or munge).

On the simulator, GPU 3 of n1 has an NVLink down: a job lands on n1 first (lower Weight), the
prolog drains n1 with slurmhealth's reason, Slurm requeues the job (not failed, not held), it
completes on n2, the epilog records it, and ``slurmhealth report`` answers. With slurmdbd over
MariaDB in the root, a failed job's summary reaches ``sacct`` (AdminComment) after the job
completed, with no EpilogSlurmctld. The Slurm adapter
(slurmhealth/slurm/__init__.py) reads 24.11's real sinfo, squeue and scontrol output.

Root only; about a minute with a cached root, a few more without: marked slow."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.package.debian_root import REPO, chroot, debian_root, remove_root, sh
from tests.package.slurm_node import SlurmNode
from tests.support.skips import root_only

pytestmark = [
    pytest.mark.slow,
    root_only("debootstrap, chroot and namespaces need root"),
]
INCLUDE = "python3,python3-venv"
PACKAGES = "slurmctld slurmd slurm-client munge slurmdbd mariadb-server"
N1_NVLINK_DOWN = """name = "n1-nvlink-down"
[nodes.n1.gpu.3]
nvlink.7.state = "inactive"
"""
# for the two slurmd on one host: their own history, run dir and kernel log
SLURMHEALTH_TEST_CONFIG = """
[gpu]
backend = "sim"
sim_scenario = "/etc/slurmhealth/scenario.toml"
sim_kernel_log = "/var/lib/slurmhealth/{node}/kmsg"

[paths]
db = "/var/lib/slurmhealth/{node}/history.db"
run_dir = "/run/slurmhealth/{node}"

[sidecar]
interval_s = 1.0
"""
TIMINGS: dict[str, float] = {}


def slurm_conf(snippet: str) -> str:
    """The cluster's slurm.conf: the installed snippet's lines as they are, except the
    scheduler's pace (a requeued job starts within seconds) and no periodic health check
    (slurmd would run it at start and drain n1 before the prolog could)."""
    lines = []
    for line in snippet.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("SchedulerParameters="):
            line += ",sched_interval=2"
        if line.startswith("HealthCheckInterval="):
            line = "HealthCheckInterval=0"
        lines.append(line)
    return "\n".join([
        "ClusterName=trixie", "SlurmctldHost=n1", "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", "CredType=cred/munge", "AuthInfo=cred_expire=10",
        "StateSaveLocation=/var/lib/slurm/slurmctld", "SlurmdSpoolDir=/var/lib/slurm/slurmd/%n",
        "SlurmctldPidFile=/run/slurmctld.pid", "SlurmdPidFile=/run/slurmd.%n.pid",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "SlurmdLogFile=/var/log/slurm/slurmd.%n.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "GresTypes=gpu",
        "SlurmdParameters=config_overrides", "ReturnToService=2", "SchedulerType=sched/backfill",
        "MessageTimeout=10", "KillWait=5", "MinJobAge=600", "InactiveLimit=0",
        "AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=n1",
        "JobCompType=jobcomp/none",
        "JobAcctGatherType=jobacct_gather/none", "MpiDefault=none", "MailProg=/bin/true",
        *lines,
        "NodeName=n1 NodeHostname=n1 NodeAddr=127.0.0.1 Port=17001 Weight=1 CPUs=2 "
        "RealMemory=1000 Gres=gpu:h100:8 State=UNKNOWN",
        "NodeName=n2 NodeHostname=n1 NodeAddr=127.0.0.1 Port=17002 Weight=2 CPUs=2 "
        "RealMemory=1000 Gres=gpu:h100:8 State=UNKNOWN",
        "PartitionName=gpu Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP",
    ]) + "\n"  # fmt: skip


def install_slurmhealth(root: Path) -> None:
    """Build the package in the root (its python3 makes the venv) from a wheel of this
    checkout and the dependencies' wheels fetched here (the root needs no network), then
    ``dpkg -i`` it."""
    py = sys.executable
    if sh(py, "-c", "import build").returncode != 0:
        assert sh(py, "-m", "pip", "install", "-q", "build").returncode == 0
    wheels = root / "src/wheels"
    built = sh(py, "-m", "build", "--wheel", "--outdir", str(wheels), str(REPO))
    assert built.returncode == 0, built.stderr[-2000:]
    pyver = chroot(root, "python3 -c 'import sys; print(\"%d%d\" % sys.version_info[:2])'")
    (wheel,) = wheels.glob("slurmhealth-*.whl")
    deps = sh(py, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version",
              pyver.stdout.strip(), "--implementation", "cp", "--platform",
              f"manylinux_2_17_{os.uname().machine}", "--platform", "any", "-d", str(wheels),
              str(wheel))  # fmt: skip
    assert deps.returncode == 0, deps.stderr[-2000:]
    shutil.copytree(REPO / "scripts", root / "src/scripts")
    shutil.copytree(REPO / "deploy/debian", root / "src/deploy/debian")
    deb = chroot(root, f"cd /src && scripts/build-deb --wheel wheels/{wheel.name} "
                 "--outdir /src/dist && dpkg -i /src/dist/*.deb",
                 PIP_NO_INDEX="1", PIP_FIND_LINKS="/src/wheels")  # fmt: skip
    assert deb.returncode == 0, deb.stdout[-2000:] + deb.stderr[-3000:]


def configure(root: Path) -> None:
    snippet = (root / "usr/share/slurmhealth/slurm.conf.snippet").read_text()
    (root / "etc/slurm/slurm.conf").write_text(slurm_conf(snippet))
    (root / "etc/slurm/gres.conf").write_text(
        "NodeName=n[1-2] Name=gpu Type=h100 File=/dev/nvidia[0-7]\n"
    )
    (root / "etc/slurm/cgroup.conf").write_text("CgroupPlugin=disabled\n")
    dbd = root / "etc/slurm/slurmdbd.conf"  # MariaDB's root over its socket: no password
    dbd.write_text("AuthType=auth/munge\nDbdHost=n1\nSlurmUser=root\n"
                   "PidFile=/run/slurmdbd.pid\nLogFile=/var/log/slurm/slurmdbd.log\n"
                   "StorageType=accounting_storage/mysql\nStorageHost=localhost\n"
                   "StorageUser=root\nStorageLoc=slurm_acct_db\n")  # fmt: skip
    dbd.chmod(0o600)
    (root / "etc/hosts").write_text("127.0.0.1 localhost n1\n")
    config = root / "etc/slurmhealth/config.toml"
    config.write_text(config.read_text() + SLURMHEALTH_TEST_CONFIG)
    (root / "etc/slurmhealth/scenario.toml").write_text(N1_NVLINK_DOWN)
    for node in ("n1", "n2"):
        (root / "var/lib/slurmhealth" / node).mkdir(parents=True, exist_ok=True)
        (root / "run/slurmhealth" / node).mkdir(parents=True, exist_ok=True)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmNode]:
    for tool in ("unshare", "nsenter", "ip", "zstd"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed (util-linux, iproute2, zstd)")
    root = tmp_path_factory.mktemp("trixie") / "root"
    t0 = time.monotonic()
    TIMINGS["root"] = debian_root("trixie", root, include=INCLUDE, packages=PACKAGES)
    t1 = time.monotonic()
    install_slurmhealth(root)
    configure(root)
    TIMINGS["package"] = time.monotonic() - t1
    t2 = time.monotonic()
    cluster = SlurmNode(root)
    try:
        cluster.start_slurm()
        TIMINGS["slurm up"] = time.monotonic() - t2
        yield cluster
    finally:
        cluster.stop()
        TIMINGS["total"] = time.monotonic() - t0
        print("\ntrixie smoke timings (s): " + ", ".join(
            f"{k} {v:.1f}" for k, v in TIMINGS.items()), file=sys.stderr)  # fmt: skip
        remove_root(root)  # its namespace's mounts were never seen out here


def show_job(node: SlurmNode, job_id: str) -> dict[str, str]:
    out = node.run(f"scontrol show job -o {job_id}").stdout
    return dict(re.findall(r"(\S+?)=(\S*)", out))


def wait_job(node: SlurmNode, job_id: str, timeout: float = 120) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        job = show_job(node, job_id)
        if job.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return job
        assert time.monotonic() < deadline, f"job {job}\n{node.logs()}"
        time.sleep(1)


def rows(db: Path, sql: str, *params: object) -> list[sqlite3.Row]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        conn.row_factory = sqlite3.Row
        return list(conn.execute(sql, params))


def test_slurm_24_11_prolog_drains_requeues_and_epilog_and_report_follow(
    node: SlurmNode,
) -> None:
    assert "24.11" in node.run("sinfo --version").stdout
    sub = node.run("sbatch --parsable -N1 --gres=gpu:8 -o /tmp/job-%j.out --wrap "
                   "'echo ran on $SLURMD_NODENAME'")  # fmt: skip
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    job = wait_job(node, job_id)
    # requeued after n1's prolog failed, not failed and not held: it ran on n2
    assert job["JobState"] == "COMPLETED", (job, node.logs())
    assert job["NodeList"] == "n2" and int(job["Restarts"]) >= 1, job
    assert (node.root / f"tmp/job-{job_id}.out").read_text().strip() == "ran on n2"
    # n1 drained with slurmhealth's reason, as `sinfo -R` shows it
    plain = node.run("sinfo -R").stdout  # REASON cut at 20 characters, as admins see it
    assert re.search(r"^slurmhealth: nvlink_ +root .* n1$", plain, re.M), plain
    reasons = node.run("sinfo -R -h -o '%n|%E'").stdout
    assert re.search(r"^n1\|slurmhealth: nvlink_inactive gpu3", reasons, re.M), reasons
    assert "drain" in node.states()["n1"]
    db = {n: node.root / f"var/lib/slurmhealth/{n}/history.db" for n in ("n1", "n2")}
    (drain,) = rows(db["n1"], "select * from drains where state = 'drained'")
    assert drain["job_id"] == job_id and drain["reason"].startswith("slurmhealth: nvlink")
    # the epilog ran after the failed launch on n1 too; on n2 the prolog let the job start
    # and the epilog recorded its end
    for name, prolog in (("n1", "fail"), ("n2", "ok")):
        sql = "select phase, status from check_runs where job_id = ?"
        phases = [(r["phase"], r["status"]) for r in rows(db[name], sql, job_id)]
        assert ("prolog", prolog) in phases and "epilog" in dict(phases), (name, phases)
    (rec,) = rows(db["n2"], "select * from jobs where job_id = ?", job_id)
    assert rec["state"] == "completed" and rec["partition"] == "gpu"
    report = node.run(f"slurmhealth report {job_id} --json")
    assert report.returncode == 0, report.stderr + node.logs()
    answer = json.loads(report.stdout)
    assert answer["schema"].startswith("slurmhealth.report/") and answer["job"]["job_id"] == job_id
    assert re.search(r"NVLink .* on n1 \(GPU 3\).*n1 drained", answer["verdict"]), answer["verdict"]
    # the requeued attempt on n2 is the job's outcome, not n1's refused launch
    assert answer["job"]["state"] == "completed", answer["job"]
    seen = [(e["node"], e["kind"], e["text"].split(" in ")[0]) for e in answer["timeline"]]
    assert ("n1", "run", "prolog fail on 8 GPU(s)") in seen and (
        "n2",
        "run",
        "prolog ok on 8 GPU(s)",
    ) in seen
    assert {"n1", "n2"} <= {s["node"] for s in answer["sources"]}


def test_slurm_24_11_stores_a_failed_jobs_summary_in_sacct_after_it_completed(
    node: SlurmNode,
) -> None:
    """No EpilogSlurmctld: the job's first node writes its summary through slurmdbd
    (``sacctmgr modify job``) after the job has completed, and 24.11's sacct shows it."""
    from slurmhealth.summary.admin_comment import decode

    conf = node.run("scontrol show config").stdout
    # 22.05 prints "EpilogSlurmctld = (null)", 24.11 no line at all ("EpilogSlurmctld[0]" if set)
    assert not re.search(r"^EpilogSlurmctld\S*\s*=\s*(?!\(null\))\S", conf, re.M), conf
    sub = node.run("sbatch --parsable -N1 -w n2 --gres=gpu:2 -o /dev/null --wrap 'exit 3'")
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    assert wait_job(node, job_id)["JobState"] == "FAILED"
    ended, stored = time.monotonic(), ""
    sacct = f"sacct -j {job_id} -X -n -P -o AdminComment,State"
    while not stored.startswith("sh1:") and time.monotonic() < ended + 30:
        stored = node.run(sacct).stdout.strip()
        time.sleep(0.5)
    took = time.monotonic() - ended
    assert stored.startswith("sh1:"), f"no AdminComment 30 s after the job ended: {stored!r}\n" + (
        node.logs()
    )
    comment, state = stored.rsplit("|", 1)
    assert state == "FAILED"  # completed in slurmdbd when its summary landed there
    summary = decode(comment)
    assert summary is not None and summary["v"], summary
    bundle = node.root / f"var/lib/slurmhealth/evidence/{job_id}/n2"
    assert (bundle / "manifest.json").exists() and (bundle / "summary.json").exists()
    TIMINGS["admin comment after job end"] = took


ADAPTER = """
import json, sys
from slurmhealth.slurm import SlurmCli, local_job_ids
cli, job_id = SlurmCli(), sys.argv[1]
job, show = cli.job(job_id), cli.show_job(job_id)
print(json.dumps({
    "nodes": {n.name: [n.state, n.reason, n.reason_user] for n in cli.nodes()},
    "job": [job.user, job.account, job.partition, job.qos, job.nodes, job.state, job.comment],
    "show": {k: show.get(k) for k in ("JobState", "StdOut", "Comment", "Extra", "NodeList")},
    "unknown": cli.job("99999") is None,
    "steps": {n: local_job_ids(n) for n in ("n1", "n2", "n9")},
}))
"""


def test_slurm_adapter_reads_24_11_output_and_the_prolog_env_opt_out(node: SlurmNode) -> None:
    """slurm/__init__.py's formats on 24.11's own sinfo, squeue, scontrol and listpids output; the
    opt-out token arrives in the prolog's environment (SLURM_JOB_EXTRA, new since 23.x)."""
    node.run("scontrol update NodeName=n1 State=RESUME")  # ours: the first test drained it
    sub = node.run("sbatch --parsable -N1 -w n2 --gres=gpu:8 --comment='needs a|pipe' "
                   "--extra=slurmhealth=off -o /dev/null --wrap 'sleep 30'")  # fmt: skip
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 60
    while show_job(node, job_id).get("JobState") != "RUNNING":
        assert time.monotonic() < deadline, show_job(node, job_id)
        time.sleep(0.5)
    node.run("scontrol update NodeName=n1 State=DRAIN Reason='slurmhealth: test'")
    deadline = time.monotonic() + 60  # RUNNING comes before the batch step's slurmstepd
    while True:
        ran = node.run(f"/opt/slurmhealth/bin/python -c '{ADAPTER}' {job_id}")
        assert ran.returncode == 0, ran.stderr
        seen = json.loads(ran.stdout)
        if seen["steps"]["n2"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert seen["nodes"]["n1"] == ["drained", "slurmhealth: test", "root"]
    assert seen["nodes"]["n2"] == ["mixed", "", ""]  # sinfo prints "root" as %u here
    # with slurmdbd: root's default account and the default QOS
    assert seen["job"] == ["root", "root", "gpu", "normal", "n2", "running", "needs a|pipe"]
    assert seen["show"] == {"JobState": "RUNNING", "StdOut": "/dev/null",
                            "Comment": "needs a|pipe", "Extra": "slurmhealth=off",
                            "NodeList": "n2"}  # fmt: skip
    assert seen["unknown"] is True
    assert seen["steps"] == {"n1": [], "n2": [job_id], "n9": None}
    log = (node.root / "var/log/slurmhealth/slurmhealth.log").read_text()
    assert f"prolog[job={job_id} node=n2]: WARNING: job {job_id} opted out" in log
    node.run(f"scancel {job_id}")
