"""Sidecar -> exporter hand-over (export_state), a job's presence on the node, and the
node-level series read from the history and the wrappers' fail-open log."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from slurmhealth.history import Batch, History, rows
from slurmhealth.metrics import export_state as es
from slurmhealth.metrics.exposition import render
from slurmhealth.metrics.job_series import SidecarCollector
from slurmhealth.metrics.node import NodeFacts, node_families, read_fail_opens, read_history
from slurmhealth.sidecar.presence import JobPresence, job_present
from tests.unit.test_metrics import state

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sidecar() -> Iterator[subprocess.Popen[bytes]]:
    """A process whose argv looks like job 77's sidecar (what sidecar_alive checks)."""
    code = "import time; time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code, "sidecar", "--job", "77"])
    # the parent runs on while the kernel still sets up the child's argv after exec (an
    # empty /proc/PID/cmdline 140 times in 200 right after Popen on a busy machine)
    deadline = time.monotonic() + 30
    while not es.sidecar_alive(proc.pid, "77") and time.monotonic() < deadline:
        time.sleep(0.01)
    yield proc
    proc.kill()
    proc.wait()


def publish(run: Path, job: str, pid: int, ts: float | None = None) -> None:
    fams = SidecarCollector(lambda: state()).collect()
    es.write_state(str(run), job, es.encode(fams, job, pid, time.time() if ts is None else ts))


def test_a_live_sidecars_series_are_served_as_it_wrote_them(
    tmp_path: Path, sidecar: subprocess.Popen[bytes]
) -> None:
    publish(tmp_path, "77", sidecar.pid)
    directory = tmp_path / "export"
    assert directory.stat().st_mode & 0o777 == 0o750
    assert [p.name for p in directory.iterdir()] == ["job-77.json"]  # no temp file left
    states = es.read_states(str(tmp_path))
    assert set(states.live) == {"77"} and not states.dead and not states.stale

    class Merged:
        def collect(self) -> Iterator[object]:
            yield from es.merged(states.live.values())

    served = CollectorRegistry()
    served.register(Merged())  # type: ignore[arg-type]
    direct = CollectorRegistry()
    direct.register(SidecarCollector(lambda: state()))
    assert render(served) == render(direct)


def test_dead_stale_and_gone_sidecars_lose_their_series(
    tmp_path: Path, sidecar: subprocess.Popen[bytes]
) -> None:
    publish(tmp_path, "77", sidecar.pid, ts=time.time() - 30)
    states = es.read_states(str(tmp_path), limits=es.Limits(stale_s=es.stale_after(10)))
    assert states.stale == {"77"} and not states.live  # alive but not writing: hung
    publish(tmp_path, "78", sidecar.pid)  # a pid that is not job 78's sidecar
    (tmp_path / "sidecar-79.pid").write_text(f"{sidecar.pid}\n")  # 79 never published
    states = es.read_states(str(tmp_path))
    assert states.dead == {"78", "79"} and not states.live
    es.remove_state(str(tmp_path), "77")
    es.remove_state(str(tmp_path), "78")
    assert es.read_states(str(tmp_path)).live == {}


def test_what_is_not_roots_own_is_never_read(
    tmp_path: Path, sidecar: subprocess.Popen[bytes]
) -> None:
    publish(tmp_path, "77", sidecar.pid)
    directory = tmp_path / "export"
    outside = tmp_path / "elsewhere.json"
    outside.write_bytes((directory / "job-77.json").read_bytes().replace(b'"77"', b'"80"'))
    os.symlink(outside, directory / "job-80.json")
    (directory / "job-81.json").write_text("{not json")
    states = es.read_states(str(tmp_path), limits=es.Limits(max_bytes=10**6))
    assert set(states.live) == {"77"} and states.skipped == 2
    small = es.read_states(str(tmp_path), limits=es.Limits(max_bytes=100))
    assert small.live == {} and small.skipped == 3  # over the size limit
    few = es.read_states(str(tmp_path), limits=es.Limits(max_files=0))
    assert few.live == {}
    os.chmod(directory, 0o777)  # anyone may plant files: nothing is read
    with pytest.raises(es.UnsafeDir):
        es.read_states(str(tmp_path))
    with pytest.raises(es.UnsafeDir):
        publish(tmp_path, "77", sidecar.pid)
    with pytest.raises(ValueError, match="job id"):
        es.state_path(str(tmp_path), "../../etc/passwd")


def test_a_finished_jobs_stats_are_served_for_their_linger_then_expire(
    tmp_path: Path, sidecar: subprocess.Popen[bytes]
) -> None:
    """done-<id>.json (the epilog's published stats): served without a live sidecar while
    younger than linger_s, then listed as expired; the next publish removes the old ones."""
    from slurmhealth.metrics.final_series import families
    from slurmhealth.model_records import Job

    def done(job: str, ts: float) -> None:
        gpus = [{"gpu": 0, "uuid": "GPU-0", "samples": 10, "util_mean": 50.0}]
        data = es.encode_families(families(Job(job_id=job, node="n1"), "n1", gpus), job, 1, ts)
        es.write_final(str(tmp_path), job, data, 300, ts)
        os.utime(es.final_path(str(tmp_path), job), (ts, ts))

    now = time.time()
    done("91", now - 10)  # just now
    done("90", now - 400)  # published long ago (its publish removed nothing younger)
    states = es.read_states(str(tmp_path), now=now, limits=es.Limits(linger_s=300))
    assert set(states.finished) == {"91"} and not states.live and not states.dead
    assert states.expired == [es.final_path(str(tmp_path), "90")]
    (fam, _) = es.merged(states.finished.values())
    assert [(s.labels["stat"], s.value) for s in fam.samples] == [
        ("samples", 10.0), ("util_mean_percent", 50.0)]  # fmt: skip
    assert fam.samples[0].labels["job_id"] == "91" and fam.samples[0].labels["uuid"] == "GPU-0"
    future = es.read_states(str(tmp_path), now=now - 1000, limits=es.Limits(linger_s=300))
    assert not future.finished  # a clock stepped back past the linger: not served forever
    done("92", now)  # the next publish removes what expired
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == [
        "done-91.json", "done-92.json"]  # fmt: skip
    few = es.read_states(str(tmp_path), now=now, limits=es.Limits(max_files=1, linger_s=300))
    assert len(few.finished) == 1 and few.skipped == 1  # bounded like the live files
    publish(tmp_path, "77", sidecar.pid)  # a running job comes first within the bound
    few = es.read_states(str(tmp_path), now=now, limits=es.Limits(max_files=1, linger_s=300))
    assert set(few.live) == {"77"} and not few.finished and few.skipped == 2
    with pytest.raises(ValueError, match="job id"):
        es.final_path(str(tmp_path), "../x")


def test_publishing_a_finished_jobs_stats_never_fails_the_epilog(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from slurmhealth.config import load_config
    from slurmhealth.model_records import Job
    from slurmhealth.sidecar.lifecycle import publish_final

    cfg_path = tmp_path / "c.toml"
    cfg_path.write_text(f'[paths]\nrun_dir = "{tmp_path}/run"\n')
    cfg = load_config(str(cfg_path), env={})
    job, gpus = Job(job_id="93", node="n1"), [{"gpu": 0, "samples": 5}]
    assert publish_final(cfg, job, gpus)
    assert (tmp_path / "run" / "export" / "done-93.json").exists()
    (tmp_path / "run" / "export").chmod(0o777)  # anyone could plant files: not written
    assert not publish_final(cfg, Job(job_id="94", node="n1"), gpus)
    assert "not published for Prometheus: UnsafeDir" in caplog.text
    assert not publish_final(cfg, job, [])  # nothing known of the GPUs: nothing to serve
    (tmp_path / "run" / "export").chmod(0o750)
    cfg_path.write_text(cfg_path.read_text() + "[metrics]\nfinal_linger_s = 0\n")
    off = load_config(str(cfg_path), env={})
    assert off.metrics.final_linger_s == 0 and not publish_final(off, job, gpus)
    # turned off: what was published before goes with the next epilog, exporter or not
    assert not list((tmp_path / "run" / "export").iterdir())


def test_families_of_several_jobs_merge_under_one_type_line() -> None:
    one = [{"name": "slurmhealth_x", "type": "gauge", "help": "h",
            "samples": [["slurmhealth_x", {"job_id": "1"}, 1.0]]}]  # fmt: skip
    two = [{"name": "slurmhealth_x", "type": "gauge", "help": "h",
            "samples": [["slurmhealth_x", {"job_id": "2"}, 2.0]]},
           {"name": "broken", "type": "nonsense", "help": "", "samples": []},
           {"name": "slurmhealth_x", "type": "counter", "help": "h", "samples": []}]  # fmt: skip
    (fam,) = es.merged([one, two])
    assert [s.labels["job_id"] for s in fam.samples] == ["1", "2"]


def fake_proc(root: Path, pid: int, argv: list[str], env: dict[str, str]) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()))


def test_the_job_is_present_by_its_processes_stepd_or_cgroup(tmp_path: Path) -> None:
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    proc.mkdir()
    cg.mkdir()
    fake_proc(proc, 10, ["/usr/bin/python3", "train.py"], {"SLURM_JOB_ID": "5"})
    fake_proc(proc, 11, ["slurmstepd: [6.extern]"], {})
    fake_proc(proc, 12, ["python3", "-m", "slurmhealth", "sidecar", "--job", "7"],
              {"SLURM_JOB_ID": "7"})  # fmt: skip
    (cg / "system.slice" / "slurmstepd.scope" / "job_8").mkdir(parents=True)
    (cg / "freezer" / "slurm" / "uid_1000" / "job_9").mkdir(parents=True)
    present = {j: job_present(j, str(proc), str(cg)) for j in ("5", "6", "7", "8", "9", "50")}
    assert present == {"5": True, "6": True, "7": False, "8": True, "9": True, "50": False}


def test_a_job_seen_running_ends_after_two_checks_without_it(tmp_path: Path) -> None:
    proc, cg = tmp_path / "proc", tmp_path / "cgroup"
    proc.mkdir()
    cg.mkdir()
    presence = JobPresence("5", unseen_grace_s=3600, proc=str(proc), cgroup_root=str(cg))
    assert [presence.ended() for _ in range(5)] == [False] * 5  # allocated, no step yet
    fake_proc(proc, 10, ["bash", "job.sh"], {"SLURM_JOB_ID": "5"})
    assert presence.ended() is False
    (proc / "10" / "environ").unlink()
    (proc / "10" / "cmdline").unlink()
    (proc / "10").rmdir()
    assert [presence.ended(), presence.ended()] == [False, True]  # two misses in a row


def test_node_series_from_the_history(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    now = time.time()
    run_rows = [
        {"run_id": f"r{i}", "ts": now - 100 + i, "node": "n1", "phase": phase,
         "status": status, "job_id": str(i)}
        for i, (phase, status) in enumerate([("prolog", "ok"), ("prolog", "ok"),
                                             ("epilog", "fail"), ("healthcheck", "ok")])
    ]  # fmt: skip
    reason = "slurmhealth: xid gpu2 Xid 79 (GPU has fallen off the bus)"
    drains = [rows.drain_row(now - 50 + 10 * i, "n1", state, reason, "slurmhealth epilog", {})
              for i, state in enumerate(("drained", "suppressed"))]  # fmt: skip
    with History(str(db)) as history:
        history.write(Batch(inserts=[("check_runs", r) for r in run_rows]
                            + [("drains", d) for d in drains]))  # fmt: skip
    facts = NodeFacts("n1")
    read_history(facts, str(db))
    assert facts.health == "drained" and facts.history_ok
    reg = CollectorRegistry()
    reg.register(type("C", (), {"collect": lambda self: node_families(facts)})())
    get = reg.get_sample_value
    assert get("slurmhealth_node_drained", {"node": "n1", "check": "xid"}) == 1
    since = get("slurmhealth_node_drained_since_timestamp_seconds", {"node": "n1", "check": "xid"})
    assert since == pytest.approx(now - 50)
    assert get("slurmhealth_node_health_state", {"node": "n1", "state": "drained"}) == 1
    assert get("slurmhealth_node_health_state", {"node": "n1", "state": "healthy"}) == 0
    runs = "slurmhealth_hook_runs_total"
    assert get(runs, {"node": "n1", "phase": "prolog", "status": "ok"}) == 2
    assert get(runs, {"node": "n1", "phase": "epilog", "status": "fail"}) == 1
    assert get("slurmhealth_node_last_check_result", {"node": "n1", "phase": "epilog"}) == 2
    last = get(
        "slurmhealth_node_last_check_timestamp_seconds", {"node": "n1", "phase": "healthcheck"}
    )
    assert last == pytest.approx(now - 97)
    assert get("slurmhealth_node_drains_total", {"node": "n1", "state": "suppressed"}) == 1
    # a prolog after the drain: someone resumed the node (scontrol), it ran a job
    with History(str(db)) as history:
        history.write(Batch(inserts=[("check_runs", {**run_rows[0], "run_id": "r9", "ts": now})]))
    facts = NodeFacts("n1")
    read_history(facts, str(db))
    assert facts.drain is None and facts.health == "healthy"


def test_an_unreadable_history_is_a_series_not_an_error(tmp_path: Path) -> None:
    db = tmp_path / "history.db"
    db.write_bytes(b"not sqlite at all" * 100)
    facts = NodeFacts("n1")
    read_history(facts, str(db))
    assert facts.history_ok is False and facts.health == "unknown"
    read_history(missing := NodeFacts("n1"), str(tmp_path / "none.db"))
    assert missing.history_ok is True


def test_a_config_typo_makes_the_prolog_fail_open_and_is_counted(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text("[sidecar]\ninterval_z = 10\n")  # the typo
    log = tmp_path / "fail-open-{node}.log"
    env = {
        "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}",
        "SLURMHEALTH_ENV_FILE": os.devnull,
        "SLURMHEALTH_BIN": str(REPO / ".venv" / "bin" / "slurmhealth"),
        "SLURMHEALTH_CONFIG": str(config),
        "SLURMHEALTH_FAIL_OPEN_LOG": str(log),
        "SLURMD_NODENAME": "n1",
        "SLURM_JOB_ID": "4242",
    }
    for _ in range(2):
        done = subprocess.run([str(REPO / "prolog" / "slurmhealth-prolog")], env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr  # the job runs: fail open
        assert "slurmhealth config check" in done.stderr
    lines = (tmp_path / "fail-open-n1.log").read_text().splitlines()
    assert [line.split()[1:] for line in lines] == [["prolog", "config", "4242"]] * 2
    assert read_fail_opens(str(tmp_path / "fail-open-n1.log")) == {("prolog", "config"): 2}
    # the exporter still starts on the broken config and says so
    out = subprocess.run([env["SLURMHEALTH_BIN"], "exporter", "--once", "--port", "0"],
                         env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert 'slurmhealth_config_valid{node="n1"} 0.0' in out.stdout
    assert 'slurmhealth_fail_opens_total{cause="config",hook="prolog",node="n1"} 2.0' in out.stdout
