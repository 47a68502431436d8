"""Evidence bundles on a simulated node: capture, limits, permissions, summary, prune, CLI."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from slurmhealth.cli.evidence import evidence
from slurmhealth.cli.options import Ctx
from slurmhealth.config import Config, load_config
from slurmhealth.diagnose.facts import NodeFacts
from slurmhealth.errors import UsageError
from slurmhealth.evidence import kernel as evidence_kernel
from slurmhealth.evidence import list_bundles, prune, read_manifest, registry
from slurmhealth.evidence.capture import capture
from slurmhealth.evidence.sources import find_py_spy
from slurmhealth.evidence.summary import write_summary
from slurmhealth.history import Batch, History
from slurmhealth.history.read import job_node_rows
from tests.support.skips import root_only, unavailable

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
JOB, NODE, UID = "77", "n1", 4242
MiB = 1024 * 1024


def _toml(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value) if isinstance(value, str) else repr(value).lower()


def _script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A folder other users may traverse (pytest's own is root-only): the capture opens a
    job's files with the job's uid's rights, as it does on a node."""
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="slurmhealth-evidence-"))
    top.chmod(0o755)
    yield top
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def make_cfg(tmp_path: Path) -> Callable[..., Config]:
    """A config for node n1 of a scenario, every path in tmp_path, fake scontrol/nvidia-smi."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = _script(bin_dir / "scontrol", 'echo "scontrol $*"')
    smi = _script(bin_dir / "nvidia-smi", 'echo "nvidia-smi $*"')

    def make(scenario: str = "gpu-lost", **evidence: Any) -> Config:
        settings = {
            "scontrol": scontrol,
            "nvidia_smi": smi,
            "nccl_globs": [str(tmp_path / "nccl" / "{job_id}" / "*.log")],
            "drop_globs": [str(tmp_path / "drop" / "{job_id}" / "*")],
            **evidence,
        }
        text = f"""
[node]
name = "{NODE}"
[gpu]
backend = "sim"
sim_scenario = "{SCENARIOS / f"{scenario}.toml"}"
sim_kernel_log = "{tmp_path / "kmsg"}"
[paths]
db = "{tmp_path / "{node}" / "history.db"}"
evidence_dir = "{tmp_path / "evidence"}"
[evidence]
""" + "\n".join(f"{k} = {_toml(v)}" for k, v in settings.items())
        path = tmp_path / "config.toml"
        path.write_text(text)
        return load_config(str(path), env={})

    return make


def _prolog(cfg: Config, start_ts: float) -> None:
    """What the prolog and sidecar leave in the history (and the simulated kernel log)."""
    from slurmhealth.hooks.check import run_check

    row = {
        "job_id": JOB,
        "node": NODE,
        "user": "alice",
        "uid": UID,
        "gpus": [4, 5],
        "start_ts": start_ts,
    }
    run_check(cfg, gpus=[4, 5], phase="prolog", job_id=JOB, job_row=row)
    batch = Batch(
        inserts=[
            (
                "samples",
                {
                    "ts": start_ts + i,
                    "node": NODE,
                    "job_id": JOB,
                    "gpu": 5,
                    "metrics": {"utilization_gpu_pct": 90 + i},
                },
            )
            for i in range(3)
        ]
        + [
            (
                "events",
                {
                    "ts": start_ts + 5,
                    "node": NODE,
                    "job_id": JOB,
                    "gpu": 5,
                    "kind": "gpu_lost",
                    "severity": "critical",
                    "message": "GPU 5 lost",
                },
            )
        ]
    )
    with History(cfg.db_path(NODE)) as h:
        assert h.write(batch)


def _owned(path: Path, text: str | bytes, uid: int = UID) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    os.chown(path, uid, 0)
    return str(path)


@pytest.fixture
def python_proc() -> Iterator[subprocess.Popen[bytes]]:
    code = "import time\ndef stuck_in_allreduce():\n    time.sleep(60)\nstuck_in_allreduce()\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    time.sleep(0.3)
    yield proc
    proc.kill()
    proc.wait()


def _check_manifest(bundle: Path, files: tuple[Any, ...]) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((bundle / "manifest.json").read_text())
    assert manifest["files"] == [dict(f) for f in files]
    for entry in manifest["files"]:
        data = (bundle / entry["name"]).read_bytes()
        assert entry["size"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    return manifest


def test_capture_writes_every_source_and_a_matching_manifest(
    make_cfg: Callable[..., Config], tmp_path: Path
) -> None:
    cfg = make_cfg()
    start = time.time() - 60
    _prolog(cfg, start)
    _owned(tmp_path / "nccl" / JOB / "rank0.log", "NCCL WARN Call to ibv_poll_cq failed\n")
    _owned(tmp_path / "drop" / JOB / "my notes.txt", "rank 3 saw the loss explode\n")
    out = _owned(tmp_path / "job.out", "step 100 loss 1.23\n")
    err = _owned(tmp_path / "job.err", "RuntimeError: CUDA error: unknown error\n")
    result = capture(
        cfg,
        JOB,
        NODE,
        reason="job failed",
        gpus=[4, 5],
        user="alice",
        uid=UID,
        start_ts=start,
        stdout_path=out,
        stderr_path=err,
        budget_s=10,
    )
    bundle = Path(result.dir)
    assert bundle == tmp_path / "evidence" / JOB / NODE
    names = {f["name"] for f in result.files}
    assert names == {
        "nvml.json",
        "nvidia-smi-q.txt",
        "nvidia-smi-nvlink.txt",
        "kernel.log",
        "nccl/rank0.log",
        "stdout.tail",
        "stderr.tail",
        "samples.jsonl",
        "events.jsonl",
        "slurm-job.txt",
        "slurm-node.txt",
        "host.txt",
        "user/my_notes.txt",
    }
    assert not result.truncated and result.skipped == {"stacks": "no pids given"}
    dropped = next(f for f in result.files if f["name"] == "user/my_notes.txt")
    assert dropped["source"] == "user-supplied"  # the user's word, marked as such
    assert (bundle / "user" / "my_notes.txt").read_text() == "rank 3 saw the loss explode\n"
    assert all(f["error"] is None for f in result.files), result.files
    manifest = _check_manifest(bundle, result.files)
    assert manifest["reason"] == "job failed" and manifest["job_id"] == JOB
    nvml = json.loads((bundle / "nvml.json").read_text())
    assert [g["index"] for g in nvml["gpus"]] == [4, 5]
    assert nvml["gpus"][1]["status"] == "lost"
    assert "Xid (PCI:0000:ab:00): 79" in (bundle / "kernel.log").read_text()
    assert (bundle / "nvidia-smi-nvlink.txt").read_text() == "nvidia-smi nvlink -s -e\n"
    assert (bundle / "slurm-job.txt").read_text() == f"scontrol show job -o {JOB}\n"
    assert (bundle / "slurm-node.txt").read_text() == f"scontrol show node -o {NODE}\n"
    assert "ibv_poll_cq" in (bundle / "nccl" / "rank0.log").read_text()
    assert "CUDA error" in (bundle / "stderr.tail").read_text()
    samples = [json.loads(x) for x in (bundle / "samples.jsonl").read_text().splitlines()]
    assert [s["metrics"]["utilization_gpu_pct"] for s in samples] == [90, 91, 92]
    assert json.loads((bundle / "events.jsonl").read_text())["kind"] == "gpu_lost"
    host = (bundle / "host.txt").read_text()
    assert "driver_version: 550.90.07" in host and "uname -a: Linux" in host
    with History(cfg.db_path(NODE)) as h:
        rows = list(job_node_rows(h, "evidence", JOB, NODE))
    assert result.recorded
    assert {r["path"]: r["sha256"] for r in rows} == {
        str(bundle / f["name"]): f["sha256"] for f in manifest["files"]
    } | {
        str(bundle / "manifest.json"): hashlib.sha256(
            (bundle / "manifest.json").read_bytes()
        ).hexdigest()
    }


def test_stacks_hold_a_py_spy_dump_of_each_pid(
    make_cfg: Callable[..., Config], python_proc: subprocess.Popen[bytes]
) -> None:
    if find_py_spy("py-spy") is None:
        unavailable("py-spy is not installed (pip install py-spy)")
    result = capture(make_cfg(), JOB, NODE, reason="test", pids=[python_proc.pid], budget_s=10)
    entry = next(f for f in result.files if f["name"] == "stacks.txt")
    assert entry["error"] is None and not entry["truncated"], entry
    stacks = (Path(result.dir) / "stacks.txt").read_text()
    assert f"py-spy dump --pid {python_proc.pid}" in stacks and "stuck_in_allreduce" in stacks


def test_flooding_nccl_file_is_cut_to_its_cap(
    make_cfg: Callable[..., Config], tmp_path: Path
) -> None:
    cfg = make_cfg(source_max_bytes=MiB, nccl_tail_kib=64 * 1024)
    log = tmp_path / "nccl" / JOB / "flood.log"
    log.parent.mkdir(parents=True)
    with open(log, "wb") as fh:
        fh.truncate(50 * MiB - 4)  # sparse: 50 MiB without writing them
        fh.seek(0, os.SEEK_END)
        fh.write(b"END\n")
    result = capture(cfg, JOB, NODE, reason="test", budget_s=5)
    entry = next(f for f in result.files if f["name"] == "nccl/flood.log")
    assert entry["size"] == MiB and entry["truncated"] and result.truncated
    data = (Path(result.dir) / "nccl" / "flood.log").read_bytes()
    assert len(data) == MiB and data.endswith(b"END\n")  # the tail is what is kept
    _check_manifest(Path(result.dir), result.files)


@pytest.mark.parametrize("source_timeout_s", [1.0, 30.0])
def test_hanging_source_is_timed_out_within_budget(
    make_cfg: Callable[..., Config], tmp_path: Path, source_timeout_s: float
) -> None:
    pid_file = tmp_path / "smi.pid"
    smi = _script(tmp_path / "hang-smi", f"echo partial; echo $$ >> {pid_file}; exec sleep 60")
    cfg = make_cfg(nvidia_smi=smi, source_timeout_s=source_timeout_s)
    t0 = time.monotonic()
    result = capture(cfg, JOB, NODE, reason="test", budget_s=3)
    elapsed = time.monotonic() - t0
    assert elapsed < 4.5 and result.elapsed_s < 4.5
    by_name = {f["name"]: f for f in result.files}
    for name in ("nvidia-smi-q.txt", "nvidia-smi-nvlink.txt"):
        assert by_name[name]["timed_out"] and by_name[name]["truncated"]
        assert by_name[name]["error"]
        assert (Path(result.dir) / name).read_text() == "partial\n"
    assert result.truncated
    assert not by_name["nvml.json"]["timed_out"] and by_name["nvml.json"]["size"] > 0
    for pid in map(int, pid_file.read_text().split()):
        with pytest.raises(ProcessLookupError):  # killed with its process group, and reaped
            os.kill(pid, 0)
    _check_manifest(Path(result.dir), result.files)


def test_a_source_that_never_returns_is_abandoned_at_the_budget(
    make_cfg: Callable[..., Config], monkeypatch: pytest.MonkeyPatch
) -> None:
    def stuck(task: Any, deadline: float) -> None:
        task.out().write(b"started\n")
        time.sleep(30)  # ignores its deadline, like an NVML call on a dying GPU

    def planner(p: registry.Plan) -> None:
        p.add("stuck", "stuck.txt", stuck)

    monkeypatch.setitem(registry.SOURCES, "stuck", planner)  # registered as a site would
    t0 = time.monotonic()
    result = capture(make_cfg(), JOB, NODE, reason="test", budget_s=2)
    assert time.monotonic() - t0 < 3.0
    late = next(f for f in result.files if f["name"] == "stuck.txt")
    assert late["timed_out"] and late["error"] == "did not finish within the capture budget"
    assert late["source"] == "stuck" and result.files[-1] == late  # in registration order
    assert (Path(result.dir) / "stuck.txt").read_bytes() == b"started\n"
    assert {f["name"] for f in result.files} >= {"nvml.json", "host.txt", "kernel.log"}
    _check_manifest(Path(result.dir), result.files)


def test_an_evidence_source_is_registered_once() -> None:
    with pytest.raises(ValueError, match="evidence source 'host' registered twice"):
        registry.source("host")(lambda p: None)
    assert list(registry.SOURCES)[:3] == ["nvml", "nvidia-smi", "kernel"]


def _mode(path: Path) -> tuple[int, int, int]:
    st = path.lstat()
    return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid


def _acl_users(path: Path) -> dict[int, int]:
    """The named-user entries (uid -> rwx bits) of a file's POSIX access ACL."""
    import struct

    raw = os.getxattr(path, "system.posix_acl_access", follow_symlinks=False)
    entries = [struct.unpack_from("<HHI", raw, off) for off in range(4, len(raw), 8)]
    return {uid: perm for tag, perm, uid in entries if tag == 2}


@root_only("chown needs root")
@pytest.mark.parametrize(("group", "gid"), [("", 0), ("4343", 4343)])
def test_bundle_root_owned_readable_by_admin_group_and_job_owner_only(
    make_cfg: Callable[..., Config], tmp_path: Path, group: str, gid: int
) -> None:
    cfg = make_cfg(admin_group=group)
    _owned(tmp_path / "nccl" / JOB / "r0.log", "x\n")
    result = capture(cfg, JOB, NODE, reason="test", uid=UID, budget_s=5)
    summary = Path(write_summary(cfg, JOB, NODE, uid=UID).path)
    bundle = Path(result.dir)
    assert stat.S_IMODE((tmp_path / "evidence").stat().st_mode) == 0o711  # traverse only
    for d in (bundle.parent, bundle, bundle / "nccl"):
        assert _mode(d) == (0o750, 0, gid), d
        assert _acl_users(d) == {UID: 0o5}, d  # the job's user: read and search
    files = [bundle / f["name"] for f in result.files] + [bundle / "manifest.json", summary]
    for f in files:
        assert _mode(f) == (0o640, 0, gid), f
        assert _acl_users(f) == {UID: 0o4}, f
    assert not [p for p in bundle.iterdir() if p.name.startswith(".")]  # no temp files left


def test_unknown_owner_keeps_root_and_admin_group(
    make_cfg: Callable[..., Config],
) -> None:
    result = capture(make_cfg(), JOB, NODE, reason="test", budget_s=5)
    assert _mode(Path(result.dir) / "manifest.json") == (0o640, os.geteuid(), 0)


@root_only("chown needs root")
def test_user_files_that_are_not_the_users_are_not_copied(
    make_cfg: Callable[..., Config], tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    link = tmp_path / "job.err"
    link.symlink_to(secret)
    foreign = _owned(tmp_path / "job.out", "someone else's\n", uid=UID + 1)
    result = capture(
        make_cfg(),
        JOB,
        NODE,
        reason="test",
        uid=UID,
        stdout_path=foreign,
        stderr_path=str(link),
        budget_s=5,
    )
    by_name = {f["name"]: f for f in result.files}
    for name in ("stdout.tail", "stderr.tail"):
        assert by_name[name]["size"] == 0 and by_name[name]["error"], by_name[name]


def test_kernel_log_excerpt_keeps_matching_lines_of_the_job_window(
    make_cfg: Callable[..., Config], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the dmesg lines' times count from a boot 10,000 s ago (whenever the machine booted:
    # a CI machine may be younger than the line placed before the window)
    uptime = 10_000.0
    monkeypatch.setattr(evidence_kernel, "_boot_time", lambda now: now - uptime)
    now = time.time()

    def line(ago: float, text: str) -> str:
        return f"[{uptime - ago:.6f}] {text}\n"

    klog = tmp_path / "dmesg.txt"
    klog.write_text(
        line(600, "NVRM: Xid (PCI:0000:18:00): 13, before the job")
        + line(30, "mlx5_core 0000:3b:00.0: port down")
        + line(20, "usb 1-1: new device")
        + line(10, "Out of memory: Killed process 1234 (python3)")
    )
    cfg = make_cfg(kernel_margin_s=60.0)
    path = tmp_path / "config.toml"
    path.write_text(path.read_text() + f'\n[kernel_log]\nsource = "{klog}"\n')
    cfg = load_config(str(path), env={})
    result = capture(cfg, JOB, NODE, reason="test", start_ts=now - 120, end_ts=now, budget_s=5)
    text = (Path(result.dir) / "kernel.log").read_text()
    assert "mlx5_core" in text and "Killed process 1234" in text
    assert "before the job" not in text and "usb" not in text


def test_summary_round_trips_through_node_facts(
    make_cfg: Callable[..., Config], tmp_path: Path
) -> None:
    cfg = make_cfg()
    _prolog(cfg, time.time() - 60)
    err = _owned(tmp_path / "job.err", "x" * 20000 + "\nNCCL error: unhandled system error\n")
    capture(cfg, JOB, NODE, reason="test", uid=UID, stderr_path=err, budget_s=5)
    path = write_summary(cfg, JOB, NODE).path
    data = json.loads(Path(path).read_text())
    facts = NodeFacts.from_dict(data)
    assert json.loads(json.dumps(facts.to_dict())) == data
    assert facts.node == NODE and facts.bundle_dir == str(Path(path).parent)
    assert {f["check_name"] for f in facts.findings} >= {"gpu_lost"}
    assert [e["kind"] for e in facts.events] == ["gpu_lost"]
    assert facts.logs["stderr"].endswith("unhandled system error\n")
    assert len(facts.logs["stderr"]) <= 8 * 1024
    assert "Xid" in facts.logs["kernel"]
    assert _mode(Path(path)) == (0o640, 0, 0)  # root's, readable by the jobs row's uid:
    assert _acl_users(Path(path)) == {UID: 0o4}


def test_summary_without_history_or_bundle(make_cfg: Callable[..., Config]) -> None:
    cfg = make_cfg()
    path = write_summary(cfg, "5", NODE).path
    facts = NodeFacts.from_dict(json.loads(Path(path).read_text()))
    assert facts == NodeFacts(node=NODE)


def _fake_bundle(cfg: Config, job: str, size: int, mtime: float) -> Path:
    d = Path(cfg.paths.evidence_dir) / job / NODE
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps({"reason": "t", "files": []}))
    (d / "blob").write_bytes(b"x" * size)
    for p in (d / "manifest.json", d / "blob", d):
        os.utime(p, (mtime, mtime))
    return d


def test_prune_by_age_then_oldest_first_by_size(make_cfg: Callable[..., Config]) -> None:
    cfg = make_cfg()
    now = 1_800_000_000.0
    day = 86400.0
    paths = {
        job: _fake_bundle(cfg, job, MiB, now - age * day)
        for job, age in (("1", 40), ("2", 10), ("3", 5), ("4", 1))
    }
    assert [b["job"] for b in list_bundles(cfg)] == ["4", "3", "2", "1"]
    assert prune(cfg, 30, None, now, dry_run=True) == [str(paths["1"])]
    assert paths["1"].exists()
    assert prune(cfg, 30, None, now) == [str(paths["1"])]
    assert not paths["1"].parent.exists()  # the empty job dir goes too
    removed = prune(cfg, None, 2 * MiB + 4096, now)
    assert removed == [str(paths["2"])]
    assert [b["job"] for b in list_bundles(cfg)] == ["4", "3"]
    assert prune(cfg, None, None, now) == []


def _cli(cfg_path: Path, *args: str) -> Any:
    @click.group()
    @click.pass_context
    def root(ctx: click.Context) -> None:
        ctx.obj = Ctx(str(cfg_path), None, False)

    root.add_command(evidence)
    return CliRunner().invoke(root, ["evidence", *args])


def test_cli_capture_list_show_prune(make_cfg: Callable[..., Config], tmp_path: Path) -> None:
    cfg = make_cfg()
    _prolog(cfg, time.time() - 60)
    cfg_path = tmp_path / "config.toml"
    res = _cli(cfg_path, "capture", JOB, "--reason", "manual", "--json")
    assert res.exit_code == 0, res.output
    captured = json.loads(res.output)
    nvml = json.loads((Path(captured["dir"]) / "nvml.json").read_text())
    assert [g["index"] for g in nvml["gpus"]] == [4, 5]  # from the history's jobs row
    res = _cli(cfg_path, "list", "--json")
    assert [(b["job"], b["node"]) for b in json.loads(res.output)["bundles"]] == [(JOB, NODE)]
    res = _cli(cfg_path, "show", JOB, "--json")
    assert json.loads(res.output)["manifests"] == [read_manifest(cfg, JOB, NODE)]
    res = _cli(cfg_path, "list")
    assert res.exit_code == 0 and JOB in res.output, res.output
    for args in (["show", JOB], ["capture", JOB, "--budget", "3"]):
        res = _cli(cfg_path, *args)
        assert res.exit_code == 0 and "nvml.json" in res.output, res.output
    res = _cli(cfg_path, "show", "999")
    assert isinstance(res.exception, UsageError)
    res = _cli(cfg_path, "prune", "--max-total-gb", "1e-9", "--dry-run")
    assert res.exit_code == 0 and "would remove 1 bundle" in res.output
    assert Path(captured["dir"]).exists()
    res = _cli(cfg_path, "prune", "--max-total-gb", "1e-9", "--json")
    assert json.loads(res.output)["removed"] == [captured["dir"]]
    assert list_bundles(cfg) == []
