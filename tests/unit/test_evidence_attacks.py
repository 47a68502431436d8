"""Attacks by a job's user on the evidence root reads and writes (DESIGN.md 5b,
docs/threat-model.md): each one fails, and says so.

The summaries and manifests here are written by the real epilog writer
(:func:`write_summary`), then changed the way a user who could write the bundle would:
the bundles are root's now, so these tests change them as root, standing in for an older
bundle the job's user owned, or for anyone else with write access to the shared dir."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from slurmhealth.config import load_config
from slurmhealth.evidence.summary import write_summary
from tests.support.skips import root_only
from tests.unit.test_report import _invoke, build, make_cluster

root_only = root_only("needs root (chown, runuser)")


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    """Job 42 on n[1-3] (test_report's), with n1's summary.json as the epilog writes it."""
    top = make_cluster(tmp_path)
    write_summary(load_config(str(top / "config.toml"), env={}), "42", "n1")
    return top


def _summary(cluster: Path) -> Path:
    return cluster / "evidence" / "42" / "n1" / "summary.json"


def _report_cli(cluster: Path) -> tuple[dict[str, Any], float, int]:
    """``slurmhealth report 42 --json`` in its own process: its JSON, seconds, max RSS KiB."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env["SLURMHEALTH_CONFIG"] = str(cluster / "config.toml")
    t0 = time.monotonic()
    argv = [sys.executable, "-m", "slurmhealth", "report", "42", "--json"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)
    took = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return json.loads(proc.stdout), took, rss


def _tampered(report: Any) -> list[str]:
    unreached = report.unreached if hasattr(report, "unreached") else [
        (u["source"], u["why"]) for u in report["unreached"]]  # fmt: skip
    return [why for source, why in unreached if source.endswith("n1/summary.json")]


def test_the_real_summary_stands_in_for_the_history(cluster: Path) -> None:
    report = build(cluster)
    assert report.sources[0][:2] == ("n1", "summary-current")
    assert not _tampered(report)


def test_forged_utilisation_is_tampered_and_the_history_is_used(cluster: Path) -> None:
    path = _summary(cluster)
    doc = json.loads(path.read_text())
    for gpu in doc["gpus"]:
        gpu["util_mean"] = 97.0  # the job that never used its GPUs, made to look busy
    path.write_text(json.dumps(doc))
    report = build(cluster)
    assert report.sources[0][:2] == ("n1", "history")
    assert [g.util_mean for g in report.nodes[0].gpus] == [95.0 - i for i in range(8)]
    assert _tampered(report) == ["tampered: its sha256 differs from the manifest's; not used"]
    if os.getuid() == 0:  # job 42 is root's: the terminal report says it too
        out = _invoke(cluster, "42").output
        assert "not used:" in out and "tampered: its sha256 differs" in out, out


@root_only
def test_a_manifest_rewritten_to_match_is_not_roots_so_not_trusted(cluster: Path) -> None:
    path = _summary(cluster)
    doc = json.loads(path.read_text())
    doc["gpus"][0]["util_mean"] = 97.0
    data = json.dumps(doc).encode()
    manifest = path.parent / "manifest.json"
    m = json.loads(manifest.read_text())
    import hashlib

    m["files"][-1].update(size=len(data), sha256=hashlib.sha256(data).hexdigest())
    path.write_bytes(data)
    manifest.write_text(json.dumps(m))
    os.chown(manifest, 4242, -1)  # what the job's user could do to a bundle it owned
    report = build(cluster)
    assert report.sources[0][:2] == ("n1", "history")
    assert _tampered(report) == ["tampered: no root-written manifest vouches for it; not used"]
    os.chown(manifest, 0, -1)
    manifest.write_text(manifest.read_text() + "garbage appended")  # the other trick
    assert _tampered(build(cluster)) == [
        "tampered: no root-written manifest vouches for it; not used"
    ]


def test_summary_made_a_symlink_to_dev_zero_is_refused_quickly(cluster: Path) -> None:
    path = _summary(cluster)
    path.unlink()
    path.symlink_to("/dev/zero")
    report, took, rss = _report_cli(cluster)
    assert took < 30 and rss < 1024 * 1024, (took, rss)  # it read 8 GB in 13 s before
    assert [s["source"] for s in report["sources"]] == ["history", "history", "summary"]
    why = [u["why"] for u in report["unreached"] if u["source"] == str(path)]
    assert why and "cannot open" in why[0] and "symbolic links" in why[0], why


def test_summary_made_a_fifo_never_stalls_the_report(cluster: Path) -> None:
    path = _summary(cluster)
    path.unlink()
    os.mkfifo(path)
    report, _took, _rss = _report_cli(cluster)  # it hung before; now 60 s would fail it
    why = [u["why"] for u in report["unreached"] if u["source"] == str(path)]
    assert why == [f"tampered: {path} is not a regular file; not used"]


def test_a_symlink_planted_in_a_bundle_is_never_followed(cluster: Path) -> None:
    folder = _summary(cluster).parent
    (folder / "nccl").mkdir()
    secret = cluster / "secret.txt"
    secret.write_text("root's secret\n")
    (folder / "nccl" / "rank0.log").symlink_to(secret)
    (folder / "stderr.tail").symlink_to(secret)
    written = write_summary(load_config(str(cluster / "config.toml"), env={}), "42", "n1")
    assert "secret" not in json.dumps(written.summary["logs"])
    assert build(cluster).sources[0][:2] == ("n1", "summary-current")


# -- as the job's user, on a bundle root captured for their job --------------------------------


@pytest.fixture
def users_bundle(user: str, tmp_path: Path) -> Any:
    """A capture and summary of job 77, the user's, in a folder the user can reach."""
    import pwd
    import tempfile

    from slurmhealth.evidence.capture import capture

    pw = pwd.getpwnam(user)
    top = Path(tempfile.mkdtemp(prefix="slurmhealth-attack-"))
    top.chmod(0o755)
    home = top / "home"
    (top / "config.toml").write_text(
        f'[node]\nname = "n1"\n[paths]\ndb = "{top}/db/history.db"\n'
        f'evidence_dir = "{top}/evidence"\n[report]\naccounting = false\n'
        '[gpu]\nbackend = "sim"\n[kernel_log]\nsource = "none"\n'
        f'[evidence]\nnccl_globs = ["{home}/nccl/{{job_id}}/*.log"]\n'
        f'drop_globs = ["{home}/drop/{{job_id}}/*"]\ndrop_max_files = 8\ndrop_kib = 64\n'
    )
    cfg = load_config(str(top / "config.toml"), env={})
    secret = top / "secret"  # a root-only folder the NCCL folder is made a link to
    secret.mkdir(mode=0o700)
    (secret / "rank0.log").write_text("ROOT ONLY\n")
    drop = home / "drop" / "77"
    drop.mkdir(parents=True)
    (home / "nccl").mkdir()
    (home / "nccl" / "77").symlink_to(secret)
    (drop / "a-link").symlink_to("/etc/shadow")
    os.mkfifo(drop / "a-pipe")
    (drop / "a-roots.txt").write_text("ROOT ONLY\n")  # root's file in the user's folder
    for i in range(10):
        (drop / f"f{i}.txt").write_bytes(b"u" * (300 << 10))
    err = home / "job.err"
    err.write_text("RuntimeError: CUDA error\n")
    for path in (home, home / "nccl", home / "nccl" / "77", home / "drop", drop, err,
                 drop / "a-link", drop / "a-pipe", *drop.glob("f*")):  # fmt: skip
        os.chown(path, pw.pw_uid, pw.pw_gid, follow_symlinks=False)
    result = capture(cfg, "77", "n1", reason="job failed", user=user, uid=pw.pw_uid,
                     stderr_path=str(err), budget_s=5)  # fmt: skip
    write_summary(cfg, "77", "n1", uid=pw.pw_uid)
    yield top, Path(result.dir), pw
    shutil.rmtree(top)


def _as_user(user: str, code: str) -> subprocess.CompletedProcess[str]:
    argv = ["runuser", "-u", user, "--", "/usr/bin/python3", "-c", code]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, cwd="/")


@root_only
def test_nothing_in_the_evidence_dir_is_the_job_users_yet_they_read_it(
    users_bundle: Any, user: str
) -> None:
    top, bundle, pw = users_bundle
    found = subprocess.run(["find", str(top / "evidence"), "-uid", str(pw.pw_uid)],
                           capture_output=True, text=True, check=True)  # fmt: skip
    assert found.stdout == ""
    assert (bundle / "stderr.tail").read_text() == "RuntimeError: CUDA error\n"
    read = _as_user(user, f"print(open({str(bundle / 'stderr.tail')!r}).read(), end='')")
    assert read.stdout == "RuntimeError: CUDA error\n", read.stderr
    repo = Path(__file__).resolve().parents[2]
    site = next((repo / ".venv" / "lib").glob("python3*/site-packages"))
    proc = subprocess.run(
        ["runuser", "-u", user, "--", "env", f"PYTHONPATH={repo}:{site}",
         f"SLURMHEALTH_CONFIG={top / 'config.toml'}", "/usr/bin/python3", "-m", "slurmhealth",
         "report", "77", "--json"],
        capture_output=True, text=True, timeout=120, check=False, cwd="/",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [(s["node"], s["source"]) for s in report["sources"]] == [("n1", "summary")]
    assert not report["unreached"]  # the user's own report trusts root's summary


@root_only
def test_user_folders_are_read_with_the_users_rights_and_bounded(users_bundle: Any) -> None:
    _top, bundle, _pw = users_bundle
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert not (bundle / "nccl").exists()  # the linked root-only folder listed nothing
    assert "rank0" not in (bundle / "manifest.json").read_text()
    assert manifest["skipped"]["nccl"] == "no NCCL debug file matched evidence.nccl_globs"
    dropped = [e for e in manifest["files"] if e["name"].startswith("user/")]
    assert dropped and all(e["source"] == "user-supplied" for e in dropped)
    by_name = {e["name"]: e for e in dropped}
    assert "user/a-link" not in by_name  # never followed, so never opened
    assert "not a regular file" in by_name["user/a-pipe"]["error"]
    assert "belongs to uid 0" in by_name["user/a-roots.txt"]["error"]
    copied = [e for e in dropped if e["size"]]
    assert len(dropped) <= 8 and copied  # drop_max_files
    assert all(e["size"] == 64 << 10 and e["truncated"] for e in copied)  # drop_kib each
    assert b"ROOT ONLY" not in b"".join(p.read_bytes() for p in (bundle / "user").iterdir())


@root_only
@pytest.mark.parametrize(
    "attack",
    [
        "os.symlink('/etc/shadow', B + '/shadow.txt')",
        "open(B + '/manifest.json', 'a').write('x')",
        "os.rename(B + '/nvml.json', B + '/nvml.old')",
        "open(B + '/big.bin', 'wb').write(b'0' * 1000)",
        "os.unlink(B + '/summary.json')",
    ],
)
def test_the_job_user_cannot_change_their_bundle(users_bundle: Any, user: str, attack: str) -> None:
    _top, bundle, _pw = users_bundle
    before = sorted((p.name, p.stat().st_size) for p in bundle.iterdir())
    proc = _as_user(user, f"import os\nB = {str(bundle)!r}\n{attack}")
    assert proc.returncode != 0 and "PermissionError" in proc.stderr, proc.stderr
    assert sorted((p.name, p.stat().st_size) for p in bundle.iterdir()) == before
