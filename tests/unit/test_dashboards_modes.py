"""The dashboards and the alert rules on a real Prometheus, in both ``[metrics] job_labels``
modes: one Prometheus per mode (deploy/prometheus/prometheus.yml and its rules, 1 s
intervals) scrapes the same node, whose job's per-GPU series carry the job's labels
(``series``) or not (``info``, attributed by ``slurmhealth_job_gpu_info``). Every dashboard
query answers with data in one mode exactly when it does in the other, the job's per-GPU
panels show its 8 GPUs with its id and owner, and the per-GPU alerts name the job."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from slurmhealth.metrics.exposition import serve
from slurmhealth.metrics.job_series import SidecarCollector
from slurmhealth.metrics.node import node_families
from tests.prometheus_util import query, start_prometheus
from tests.unit.test_prometheus_rules import (
    DCGM_FIXTURE,
    FACTS,
    FULL,
    PROM_DIR,
    RULES,
    _static_server,
    all_queries,
    dcgm_mode_jobs,
    load,
    substitute,
    wait_for,
)

pytestmark = pytest.mark.prometheus

MODES = ("series", "info")
# per-GPU panels of the job-detail dashboard: the job's GPUs, by the join in either mode
JOB_PANELS = ("GPUs", "GPU utilisation", "Power", "Thermal margin", "NVLink errors")


DCGM_JOB = """
  - job_name: dcgm
    scrape_interval: 1s
    scrape_timeout: 1s
    honor_labels: true
    static_configs:
      - targets: [{0}]
"""
# docs/metrics.md: dcgm-exporter's series joined per GPU, without its job mapping (hpc_job)
DCGM_BY_GPU = (
    "DCGM_FI_DEV_GPU_UTIL / 100 * on (Hostname, gpu) group_left (job_id, user) "
    'topk by (Hostname, gpu) (1, label_replace(slurmhealth_job_gpu_info{job_id="4243"}, '
    '"Hostname", "$1", "node", "(.*)"))'
)


class Node:
    def __init__(self, job_labels: str) -> None:
        self.job = SidecarCollector(lambda: FULL, job_labels=job_labels)

    def collect(self) -> Iterator[Any]:
        yield from node_families(FACTS)
        yield from self.job.collect()


def _prometheus(tmp: Path, targets: list[str], dcgm: list[str]) -> tuple[str, Callable[[], None]]:
    """deploy/prometheus/prometheus.yml (1 s intervals, its rules) on ``targets``, and a
    ``dcgm`` scrape job on those."""
    config = (PROM_DIR / "prometheus.yml").read_text()
    listed = ", ".join(f'"{t}"' for t in targets)
    for old, new in (('"gpu-a01:9450", "gpu-a02:9450", "gpu-a03:9450"', listed),
                     ("15s", "1s"), ("scrape_timeout: 10s", "scrape_timeout: 1s"),
                     ("- slurmhealth.rules.yml", f"- {RULES}")):  # fmt: skip
        assert old in config, old
        config = config.replace(old, new)
    if dcgm:
        config += DCGM_JOB.format(", ".join(f'"{t}"' for t in dcgm))
    return start_prometheus(tmp, config)


@pytest.fixture(scope="module")
def proms(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Per mode: a Prometheus on the node (its own series and its job's), and one on
    dcgm-exporter (recorded, its hpc_job from the job-mapping files) beside slurmhealth in
    metrics.mode = "dcgm" on the nodes it reports (``MODE-dcgm``: other jobs on gpu-a01)."""
    urls, stops, servers = {}, [], []
    try:
        for mode in MODES:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(Node(mode))  # type: ignore[arg-type]
            endpoint = serve(registry, "127.0.0.1", [0])
            dcgm = _static_server(DCGM_FIXTURE.read_bytes())
            jobs = serve(dcgm_mode_jobs(mode), "127.0.0.1", [0])
            servers += [endpoint, dcgm, jobs]
            addr = [f"127.0.0.1:{s.server_address[1]}" for s in (endpoint, dcgm, jobs)]
            for name, targets, other in ((mode, addr[:1], []), (f"{mode}-dcgm", [], addr[1:])):
                urls[name], stop = _prometheus(tmp_path_factory.mktemp(name), targets, other)
                stops.append(stop)
        for url in urls.values():  # a few scrapes: rates and increases have two samples
            wait_for(url, "count_over_time(slurmhealth_gpu_up[1m]) >= 4", 8, timeout=30)
        yield urls
    finally:
        for stop in stops:
            stop()
        for server in servers:
            server.shutdown()
            server.server_close()


def test_per_gpu_series_carry_the_jobs_labels_only_in_series_mode(proms: dict[str, str]) -> None:
    for mode in MODES:
        url = proms[mode]
        gpus = wait_for(url, 'slurmhealth_gpu_up{job="slurmhealth"}', 8)
        assert len(gpus) == 8
        assert {("job_id" in g["metric"], "user" in g["metric"]) for g in gpus} == {
            (mode == "series", mode == "series")
        }
        info = wait_for(url, 'slurmhealth_job_gpu_info{job="slurmhealth",job_id="4242"}', 8)
        assert sorted(int(i["metric"]["gpu"]) for i in info) == list(range(8))
        assert {i["metric"]["user"] for i in info} == {"alice"}


def test_every_dashboard_query_has_data_in_both_modes_or_in_neither(
    proms: dict[str, str],
) -> None:
    found: dict[str, set[str]] = {}
    for mode in MODES:
        found[mode] = set()
        for _, expr in all_queries():
            for url in (proms[mode], proms[f"{mode}-dcgm"]):
                answer = query(url, substitute(expr))
                assert answer["status"] == "success", (mode, expr, answer)
                if answer["data"]["result"]:
                    found[mode].add(expr)
    assert found["series"] == found["info"]
    assert len(found["info"]) > 45  # most panels have data for these nodes


def test_the_job_panels_show_the_same_gpus_and_values_in_both_modes(
    proms: dict[str, str],
) -> None:
    panels = {p["title"]: p for p in load("job-detail.json")["panels"]}
    for title in JOB_PANELS:
        expr = substitute(panels[title]["targets"][0]["expr"])
        got = {}
        for mode in MODES:
            result = query(proms[mode], expr)["data"]["result"]
            got[mode] = sorted(
                (r["metric"].get("gpu"), r["metric"].get("job_id"), r["metric"].get("user"),
                 r["value"][1]) for r in result
            )  # fmt: skip
        assert got["series"] == got["info"], title
        assert got["info"], title
    util = query(proms["info"], substitute(panels["GPU utilisation"]["targets"][0]["expr"]))
    rows = util["data"]["result"]
    assert len(rows) == 7  # GPU 1 is lost: no utilisation
    assert {(r["metric"]["job_id"], r["metric"]["user"]) for r in rows} == {("4242", "alice")}


@pytest.mark.parametrize("mode", MODES)
def test_the_gpu_alerts_name_the_job(proms: dict[str, str], mode: str) -> None:
    deadline = time.monotonic() + 30
    expr = 'ALERTS{alertname="SlurmhealthXid",alertstate="firing",job="slurmhealth"}'
    xids = wait_for(proms[mode], expr, 2, timeout=max(1.0, deadline - time.monotonic()))
    assert {(a["metric"]["xid"], a["metric"]["job_id"], a["metric"]["user"]) for a in xids} == {
        ("79", "4242", "alice"),
        ("13", "4242", "alice"),
    }
    down = wait_for(proms[mode], 'ALERTS{alertname="SlurmhealthNvlinkDown",job="slurmhealth"}', 1)
    assert [(a["metric"]["gpu"], a["metric"]["job_id"]) for a in down] == [("2", "4242")]


def test_dcgm_exporter_joins_in_both_modes(proms: dict[str, str]) -> None:
    """The dcgm dashboard joins on dcgm-exporter's hpc_job (its job mapping) and the job's
    facts; without the mapping, per GPU on slurmhealth_job_gpu_info: both modes alike."""
    panel = next(p for p in load("dcgm-jobs.json")["panels"] if "utilisation" in p["title"])
    got = {}
    for mode in MODES:
        url = proms[f"{mode}-dcgm"]
        rows = wait_for(url, substitute(panel["targets"][0]["expr"]), 12)
        by_gpu = wait_for(url, DCGM_BY_GPU, 4)
        got[mode] = (
            sorted((r["metric"]["Hostname"], r["metric"]["gpu"], r["value"][1]) for r in rows),
            sorted((r["metric"]["Hostname"], r["metric"]["gpu"], r["metric"]["job_id"],
                    r["metric"]["user"], r["value"][1]) for r in by_gpu),
        )  # fmt: skip
    assert got["series"] == got["info"]
    assert len(got["info"][0]) == 12  # job 4242: gpu-a01 GPUs 0-3, gpu-a02 GPUs 0-7
    assert got["info"][1] == [("gpu-a01", str(g), "4243", "alice", str((94 + g - 4) / 100))
                              for g in range(4, 8)]  # fmt: skip
