"""`slurmhealth exporter`: one static target per node, scraped by Debian's Prometheus, and
node_exporter's textfile collector reading what it writes; real sidecar processes on a
simulated node start, crash and stop under them."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.prometheus_util import (
    answers,
    free_port,
    get_text,
    query,
    start_node_exporter,
    start_prometheus,
)
from tests.support.sim_config import sidecar_config, sidecar_env

pytestmark = pytest.mark.prometheus

SCENARIO = """
name = "busy"
[all_gpus]
utilization_gpu = 60
"""
METRICS = """[metrics]
bind = "127.0.0.1"
port = {port}
textfile_dir = "{tmp}/textfile"
textfile_interval_s = 1.0
fail_open_log = "{tmp}/fail-open.log"
final_linger_s = 600
"""
PROMETHEUS = """
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: slurmhealth
    scrape_timeout: 1s
    static_configs:
      - targets: ["127.0.0.1:{port}"]
"""


@dataclass
class Node:
    tmp: Path
    env: dict[str, str]
    exporter_url: str
    prometheus: str
    node_exporter: str
    exporter: subprocess.Popen[bytes]

    def sidecar(self, job: str) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "slurmhealth", "sidecar", "--job", job, "--gpus", "0-7"]
        return subprocess.Popen(argv, env=self.env, stderr=subprocess.DEVNULL)

    def series(self, expr: str) -> list[dict[str, object]]:
        answer = query(self.prometheus, expr)
        assert answer["status"] == "success", answer
        result: list[dict[str, object]] = answer["data"]["result"]
        return result


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    tmp = tmp_path_factory.mktemp("exporter")
    (tmp / "textfile").mkdir()
    port = free_port()
    metrics = METRICS.format(tmp=tmp, port=port)
    env = sidecar_env(sidecar_config(tmp, SCENARIO, db="history.db", extra=metrics))
    exporter = subprocess.Popen([sys.executable, "-m", "slurmhealth", "exporter"], env=env)
    stops: list[Callable[[], None]] = []
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        wait(lambda: answers(url), 20, "the exporter to listen")
        prom, stop = start_prometheus(tmp, PROMETHEUS.format(port=port))
        stops.append(stop)
        ne, stop = start_node_exporter(tmp, tmp / "textfile")
        stops.append(stop)
        yield Node(tmp, env, url, prom, f"{ne}/metrics", exporter)
    finally:
        for stop in stops:
            stop()
        if exporter.poll() is None:
            exporter.kill()
            exporter.wait()


def wait(cond: Callable[[], object], timeout: float, what: str) -> float:
    """Seconds until ``cond()`` is true; fails after ``timeout``."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, f"timed out waiting for {what}"
        time.sleep(0.1)
    return time.monotonic() - t0


def test_node_series_exist_before_any_job(node: Node) -> None:
    wait(lambda: node.series('slurmhealth_node_health_state{node="node1"} == 1'), 10, "a scrape")
    (state,) = node.series('slurmhealth_node_health_state{node="node1"} == 1')
    assert state["metric"]["state"] == "unknown"  # type: ignore[index]
    running = node.series('slurmhealth_sidecars{node="node1",state="running"}')
    assert [r["value"][1] for r in running] == ["0"]  # type: ignore[index]
    assert node.series('slurmhealth_config_valid{node="node1"} == 1')


def test_job_series_come_and_go_within_one_interval(node: Node) -> None:
    state_file = node.tmp / "run" / "export" / "job-601.json"
    crashed, stopped = node.sidecar("601"), node.sidecar("602")
    try:
        wait(state_file.exists, 30, "the sidecar's first state file")
        seen = wait(lambda: len(node.series('slurmhealth_gpu_up{job_id="601"}')) == 8, 10,
                    "Prometheus to see job 601")  # fmt: skip
        assert seen <= 2.5  # one 1 s interval + one 1 s scrape, and a little
        (info,) = node.series('slurmhealth_job_info{job_id="601"}')
        assert info["metric"]["node"] == "node1"  # type: ignore[index]
        # the same series through node_exporter's textfile collector
        wait(lambda: 'job_id="601"' in get_text(node.node_exporter), 3, "the textfile")
        wait(lambda: len(node.series('slurmhealth_gpu_up{job_id="602"}')) == 8, 30, "job 602")
    finally:
        crashed.send_signal(signal.SIGKILL)  # a crash: its state file stays behind
        stopped.send_signal(signal.SIGTERM)  # the epilog's way: it removes its file
        crashed.wait(10)
        assert stopped.wait(10) == 0
    assert state_file.exists()
    gone = wait(lambda: not node.series('slurmhealth_gpu_up{job_id=~"601|602"}'), 10,
                "the jobs' series to vanish")  # fmt: skip
    assert gone <= 2.5
    text = get_text(node.exporter_url)
    assert 'job_id="601"' not in text and 'job_id="602"' not in text
    assert 'slurmhealth_sidecars{node="node1",state="dead"} 1.0' in text
    wait(lambda: 'job_id="60' not in get_text(node.node_exporter), 3, "the textfile to drop them")


def test_a_hung_sidecars_series_go_once_its_file_is_two_intervals_old(node: Node) -> None:
    from slurmhealth.metrics.export_state import stale_after

    hung = node.sidecar("603")
    promql = 'slurmhealth_gpu_up{job_id="603"}'
    try:
        wait(lambda: len(node.series(promql)) == 8, 30, "Prometheus to see job 603")
        hung.send_signal(signal.SIGSTOP)  # alive, but its file no longer changes
        gone = wait(lambda: not node.series(promql), 30, "the hung job's series to vanish")
        assert gone <= stale_after(1.0) + 3.0  # its last write, then one scrape
        text = get_text(node.exporter_url)
        assert 'slurmhealth_sidecars{node="node1",state="stale"} 1.0' in text
    finally:
        hung.send_signal(signal.SIGCONT)
        hung.terminate()
        hung.wait(10)


def test_a_finished_jobs_published_stats_are_scraped_read_back_and_then_removed(
    node: Node,
) -> None:
    """What the epilog publishes (sidecar.lifecycle.publish_final) reaches a real
    Prometheus, a report reads it back as the same stats, and the exporter drops and
    removes the file once it is older than final_linger_s."""
    from slurmhealth.config import load_config
    from slurmhealth.diagnose.facts import GpuStats
    from slurmhealth.metrics.export_state import encode_families, final_path, write_final
    from slurmhealth.metrics.final_series import families
    from slurmhealth.model_records import Job
    from slurmhealth.report.prometheus import PromSource
    from slurmhealth.sidecar.lifecycle import publish_final

    cfg = load_config(node.env["SLURMHEALTH_CONFIG"], env=node.env)
    job = Job(job_id="604", node="node1", user="alice", priority=7)
    stats = [GpuStats(gpu=g, uuid=f"GPU-{g}", samples=360, util_mean=55.5 + g, util_p5=50.0,
                      util_min=3.0, util_max=99.0, util_swings=2, mem_peak_bytes=2**34,
                      mem_total_bytes=80 * 2**30, power_mean_w=412.25, temp_max_c=71.0,
                      margin_min_c=9.0, throttle_seconds={"hw_thermal": 40.0} if g == 1 else {},
                      pcie_gen_min=5, pcie_width_min=16, nvlink_active_min=18,
                      nvlink_errors_delta=g, pcie_replays_delta=0)
             for g in range(2)]  # fmt: skip
    t0 = time.time()
    assert publish_final(cfg, job, [dataclasses.asdict(g) for g in stats])
    promql = 'slurmhealth_job_gpu_stat{job_id="604",stat="util_mean_percent"}'
    wait(lambda: len(node.series(promql)) == 2, 30, "Prometheus to scrape the job's stats")
    (throttle,) = node.series('slurmhealth_job_gpu_throttle_seconds{job_id="604"}')
    assert throttle["metric"]["reason"] == "hw_thermal"  # type: ignore[index]
    source = PromSource(node.prometheus, 30)
    source.skipped = ("util_swings",)  # what an earlier call from the series left
    got = source.gpu_stats("604", t0 - 3600, t0)
    assert got == {"node1": tuple(stats)}  # exactly; no series of the job: no plot
    assert source.skipped == ()  # published stats skip nothing
    # older than final_linger_s (its time set back): dropped at the next scrape, removed
    run_dir = str(node.tmp / "run")
    old = time.time() - 601
    data = encode_families(families(job, "node1", []), "604", 1, old)
    write_final(run_dir, "604", data, 600, old)
    wait(lambda: not Path(final_path(run_dir, "604")).exists(), 30, "the file's removal")
    assert "604" not in get_text(node.exporter_url)


def test_stopping_the_exporter_takes_its_textfile_away(node: Node) -> None:
    textfile = node.tmp / "textfile" / "slurmhealth.prom"
    assert textfile.exists() and oct(textfile.stat().st_mode & 0o777) == "0o644"
    node.exporter.send_signal(signal.SIGTERM)
    assert node.exporter.wait(10) == 0
    assert not textfile.exists()
    assert list((node.tmp / "textfile").iterdir()) == []  # no temp file left either


def test_a_config_that_stops_loading_keeps_the_last_good_one(tmp_path: Path) -> None:
    from slurmhealth.agent.exporter import ConfigWatch
    from slurmhealth.config import load_config

    path = tmp_path / "config.toml"
    path.write_text('[metrics]\nport = 9451\n[paths]\nrun_dir = "/run/x"\n')
    watch = ConfigWatch(lambda: load_config(str(path), env={}), every_s=0)
    cfg, valid = watch.current()
    assert valid and cfg.metrics.port == 9451
    path.write_text("[metrics]\nport = 9452\nprot = 1\n")  # a typo
    cfg, valid = watch.current()
    assert not valid and cfg.metrics.port == 9451 and cfg.paths.run_dir == "/run/x"
    path.write_text("[metrics]\nport = 9453\n")
    assert watch.current()[0].metrics.port == 9453 and watch.current()[1]


def test_the_textfile_goes_only_into_a_directory_not_everyone_can_write(tmp_path: Path) -> None:
    from slurmhealth.agent.exporter import write_textfile

    ok, open_dir = tmp_path / "ok", tmp_path / "open"
    ok.mkdir()
    open_dir.mkdir()
    open_dir.chmod(0o777)
    write_textfile(str(ok), b"slurmhealth_x 1\n")
    assert (ok / "slurmhealth.prom").read_bytes() == b"slurmhealth_x 1\n"
    assert [p.name for p in ok.iterdir()] == ["slurmhealth.prom"]
    with pytest.raises(OSError, match="writable by everyone"):
        write_textfile(str(open_dir), b"slurmhealth_x 1\n")
    assert list(open_dir.iterdir()) == []
