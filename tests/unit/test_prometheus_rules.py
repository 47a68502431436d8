"""deploy/prometheus, deploy/alertmanager and deploy/grafana: promtool and amtool checks, a
real Alertmanager applying the inhibit rules, and a real Prometheus that scrapes a node's
endpoint (job and node series), evaluates the alert rules and runs every dashboard query,
including the dcgm-exporter joins against a recorded dcgm-exporter exposition."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from slurmhealth.history.node_queries import DrainInForce, LastCheck
from slurmhealth.metrics.exposition import serve
from slurmhealth.metrics.job_series import SidecarCollector
from slurmhealth.metrics.node import NodeFacts, node_families
from slurmhealth.model_records import TaskStats
from slurmhealth.rdma.model import Hca, IbPort, Rate, RdmaSnapshot
from tests.prometheus_util import (
    answers,
    free_port,
    promtool,
    query,
    require_tool,
    start_prometheus,
)
from tests.unit.test_metrics import state

pytestmark = pytest.mark.prometheus

REPO = Path(__file__).resolve().parents[2]
PROM_DIR = REPO / "deploy" / "prometheus"
GRAFANA_DIR = REPO / "deploy" / "grafana"
ALERTMANAGER = REPO / "deploy" / "alertmanager" / "alertmanager.yml"
RULES = PROM_DIR / "slurmhealth.rules.yml"
DCGM_FIXTURE = REPO / "tests" / "fixtures" / "dcgm-exporter" / "metrics.prom"

DASHBOARDS = {
    "cluster-overview.json": ("slurmhealth / Cluster overview", {"datasource"}),
    "node-detail.json": ("slurmhealth / Node detail", {"datasource", "node"}),
    "job-detail.json": ("slurmhealth / Job detail", {"datasource", "job_id", "user"}),
    "fleet.json": ("slurmhealth / Fleet", {"datasource"}),
    "dcgm-jobs.json": ("slurmhealth / Jobs on dcgm-exporter", {"datasource", "job_id", "user"}),
}
# what Grafana puts in place of its variables, for sending the queries to Prometheus
VALUES = {
    "__rate_interval": "1m",
    "__interval": "30s",
    "__range": "1h",
    "node": "gpu-a01",
    "job_id": "4242",
    "user": "alice",
}
# Grafana's variables; `$1` (a label_replace group) is not one
VARIABLE = re.compile(r"\$\{([A-Za-z_]\w*)(?::\w+)?\}|\[\[([A-Za-z_]\w*)\]\]|\$([A-Za-z_]\w*)")
JOB_ALERTS = {
    "SlurmhealthGpuLost", "SlurmhealthXid", "SlurmhealthNvlinkDown",
    "SlurmhealthEccUncorrectable", "SlurmhealthGpuHot", "SlurmhealthThrottling",
    "SlurmhealthJobHang", "SlurmhealthThroughputDrop", "SlurmhealthStraggler",
    "SlurmhealthRdmaPortErrors",
}  # fmt: skip
NODE_ALERTS = {
    "SlurmhealthFailOpen", "SlurmhealthConfigInvalid", "SlurmhealthNodeDrainedLong",
    "SlurmhealthChecksStopped", "SlurmhealthExporterDown", "SlurmhealthTextfileStale",
    "SlurmhealthSidecarDead", "SlurmhealthHistoryUnreadable", "SlurmhealthDrainCircuitBreaker",
    "SlurmhealthNodeServiceRequired",
}  # fmt: skip
ALERTS = JOB_ALERTS | NODE_ALERTS


def substitute(expr: str) -> str:
    def value(m: re.Match[str]) -> str:
        name = next(g for g in m.groups() if g)
        assert name in VALUES, f"unknown variable ${name} in {expr!r}"
        return VALUES[name]

    return VARIABLE.sub(value, expr)


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GRAFANA_DIR / name).read_text())
    return data


def walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from walk(v)


def variable_query(var: dict[str, Any]) -> str | None:
    """The PromQL inside a Grafana query variable (label_values(SELECTOR, label) etc.)."""
    q = var.get("query")
    text = q.get("query", "") if isinstance(q, dict) else str(q or "")
    if m := re.fullmatch(r"\s*label_values\((.+),\s*\w+\s*\)\s*", text):
        return m.group(1)
    if m := re.fullmatch(r"\s*query_result\((.+)\)\s*", text):
        return m.group(1)
    assert re.fullmatch(r"\s*(label_values\(\s*\w+\s*\)|label_names\(\)|metrics\(.*\))\s*", text)
    return None


def dashboard_queries(name: str) -> list[str]:
    data = load(name)
    exprs = [n["expr"] for n in walk(data) if isinstance(n.get("expr"), str)]
    for var in data["templating"]["list"]:
        if var["type"] == "query" and (expr := variable_query(var)) is not None:
            exprs.append(expr)
    return exprs


def all_queries() -> list[tuple[str, str]]:
    return [(name, expr) for name in DASHBOARDS for expr in dashboard_queries(name)]


PORT = IbPort("mlx5_0", 1, 4, "ACTIVE", 5, "LinkUp", Rate(400.0, 4, "NDR"), "InfiniBand",
              {"symbol_error": 3, "port_xmit_data": 10**9, "port_rcv_data": 10**9})  # fmt: skip
RDMA = RdmaSnapshot(1.7e9, (Hca("mlx5_0", (PORT,)),))
FULL = state(task=TaskStats(1, 0.4, 1.0, 1.0, 0.4, 0.1, 0.01, 1.0), rdma=RDMA)
FACTS = NodeFacts(
    "gpu-a01",
    last_checks=[LastCheck("prolog", "ok", 1.7e9), LastCheck("healthcheck", "warn", 1.7e9)],
    runs={("prolog", "ok"): 5, ("epilog", "fail"): 1},
    drains={"drained": 1, "suppressed": 1},
    drain=DrainInForce(1.7e9, "slurmhealth: nvlink gpu2 link 7 inactive"),
    sidecars={"running": 1},
)
FACTS.fail_opens[("prolog", "config")] = 3


class Node:
    """What one node's endpoint serves: a job's series and the node's own."""

    def __init__(self, per_link: bool = False) -> None:
        self.job = SidecarCollector(lambda: FULL, per_link_nvlink=per_link)

    def collect(self) -> Iterator[Any]:
        yield from node_families(FACTS)
        yield from self.job.collect()


def exported_names() -> set[str]:
    registry = CollectorRegistry()
    registry.register(Node(per_link=True))  # type: ignore[arg-type]
    return {s.name for fam in registry.collect() for s in fam.samples}


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bslurmhealth_\w+", expr))


def dcgm_names() -> set[str]:
    return set(re.findall(r"^(DCGM_FI_\w+)\{", DCGM_FIXTURE.read_text(), re.M))


# ---------------------------------------------------------------------- promtool


def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_rule_unit_tests() -> None:
    result = promtool("test", "rules", str(PROM_DIR / "slurmhealth.rules.test.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_check_config() -> None:
    result = promtool("check", "config", str(PROM_DIR / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_amtool_accepts_the_alertmanager_config_with_its_inhibit_rules() -> None:
    tool = require_tool("/usr/bin/amtool")
    done = subprocess.run([tool, "check-config", str(ALERTMANAGER)], capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout and "8 inhibit rules" in done.stdout


def alert_blocks() -> dict[str, list[str]]:
    blocks: dict[str, list[str]] = {}
    for block in re.split(r"\n\s*- alert: ", RULES.read_text())[1:]:
        blocks.setdefault(block.split("\n", 1)[0].strip(), []).append(block)
    return blocks


def test_every_alert_has_severity_annotations_a_next_step_and_a_unit_test() -> None:
    tests = (PROM_DIR / "slurmhealth.rules.test.yml").read_text()
    blocks = alert_blocks()
    assert set(blocks) == ALERTS
    for alert, found in blocks.items():
        assert f"alertname: {alert}\n" in tests, f"{alert} has no promtool test"
        for block in found:
            assert re.search(r"\n\s+for: \d+[smh]", block), block
            assert re.search(r"severity: (critical|warning)\n", block), block
            for key in ("summary:", "description:", "next_step:"):
                assert key in block, (key, block)
            step = block.split("next_step:", 1)[1]
            if alert in JOB_ALERTS:  # a job is involved: its report is the next step
                assert "slurmhealth report {{ $labels.job_id }}" in step, block
                described = block.split("description:", 1)[1]
                assert "$labels.job_id" in described and "$labels.user" in described
            assert "$labels.node" in block or "$labels.instance" in block, block
            # slurmhealth drains by itself: no alert asks a human to do it
            assert not re.search(r"\b[Dd]rain (the|this) node\b", block), block


def test_alertmanager_pages_once_for_an_xid_79(tmp_path: Path) -> None:
    """One Xid 79: the critical Xid, the lost GPU, its links and the job's hang all fire;
    the real Alertmanager inhibits all but the Xid."""
    tool = require_tool("/usr/bin/prometheus-alertmanager")
    port, cluster = free_port(), free_port()
    proc = subprocess.Popen(
        [tool, f"--config.file={ALERTMANAGER}", f"--storage.path={tmp_path}",
         f"--web.listen-address=127.0.0.1:{port}", f"--cluster.listen-address=127.0.0.1:{cluster}",
         "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}/api/v2"
    try:
        deadline = time.monotonic() + 20
        while not answers(f"{base}/status"):
            assert time.monotonic() < deadline and proc.poll() is None, "alertmanager"
            time.sleep(0.1)
        gpu = {"node": "gpu-a01", "gpu": "1", "uuid": "GPU-1111", "job_id": "4242",
               "user": "alice"}  # fmt: skip
        sent = [
            {**gpu, "alertname": "SlurmhealthXid", "severity": "critical", "xid": "79"},
            {**gpu, "alertname": "SlurmhealthGpuLost", "severity": "critical", "status": "lost"},
            {**gpu, "alertname": "SlurmhealthNvlinkDown", "severity": "critical"},
            {"node": "gpu-a01", "job_id": "4242", "user": "alice", "kind": "hang",
             "alertname": "SlurmhealthJobHang", "severity": "critical"},
            {**gpu, "gpu": "5", "alertname": "SlurmhealthGpuHot", "severity": "warning"},
        ]  # fmt: skip
        body = json.dumps([{"labels": labels} for labels in sent]).encode()
        req = urllib.request.Request(f"{base}/alerts", body, {"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=5).close()

        def active() -> set[str]:
            with urllib.request.urlopen(f"{base}/alerts?inhibited=false", timeout=5) as resp:
                return {a["labels"]["alertname"] for a in json.load(resp)}

        deadline = time.monotonic() + 10
        while active() != {"SlurmhealthXid", "SlurmhealthGpuHot"}:
            assert time.monotonic() < deadline, active()
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(10)


def test_rules_and_dashboards_use_only_exported_metrics() -> None:
    exported = exported_names()
    used = metric_names(RULES.read_text())
    dcgm = set()
    for _, expr in all_queries():
        used |= metric_names(expr)
        dcgm |= set(re.findall(r"\bDCGM_FI_\w+", expr))
    assert used <= exported, used - exported
    assert dcgm and dcgm <= dcgm_names(), dcgm - dcgm_names()


# ---------------------------------------------------------------------- dashboards


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_structure(name: str) -> None:
    data = load(name)
    title, variables = DASHBOARDS[name]
    assert data["title"] == title
    assert 36 <= data["schemaVersion"] <= 39
    templating = {v["name"]: v for v in data["templating"]["list"]}
    assert set(templating) == variables
    assert templating["datasource"]["type"] == "datasource"
    assert templating["datasource"]["query"] == "prometheus"
    panels = data["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
    used = {next(g for g in m.groups() if g) for m in VARIABLE.finditer(json.dumps(data))}
    assert used - set(VALUES) - {"datasource"} == set()
    assert set(templating) - {"datasource"} <= used  # every variable is used somewhere


def test_dashboard_contents() -> None:
    overview = " ".join(dashboard_queries("cluster-overview.json"))
    types = {p["type"] for p in load("cluster-overview.json")["panels"]}
    assert {"heatmap", "table"} <= types
    for needle in ("avg by (node) (slurmhealth_gpu_utilization_ratio)",
                   "slurmhealth_gpu_thermal_margin_celsius < 5", "slurmhealth_events_total",
                   "slurmhealth_job_info", 'slurmhealth_node_drains_total{state="suppressed"}',
                   "* on (node, gpu) group_left (account) topk by (node, gpu) (1, "
                   "slurmhealth_job_gpu_info)"):  # fmt: skip
        assert needle in overview
    node = " ".join(dashboard_queries("node-detail.json"))
    for metric in ("gpu_utilization_ratio", "gpu_memory_used_bytes", "gpu_temperature_celsius",
                   "gpu_power_watts", "gpu_nvlink_errors_total", "gpu_nvlink_links_down",
                   "node_health_state", "fail_opens_total", "hook_runs_total"):  # fmt: skip
        assert f'slurmhealth_{metric}{{node="$node"}}' in node
    job = load("job-detail.json")
    queries = " ".join(dashboard_queries("job-detail.json"))
    for metric in ("job_step_seconds", "job_mfu_ratio", "job_comm_ratio", "job_data_wait_ratio"):
        assert f'slurmhealth_{metric}{{job_id="$job_id"}}' in queries
    join = (
        "* on (node, gpu) group_left (job_id, user) topk by (node, gpu) "
        '(1, slurmhealth_job_gpu_info{job_id="$job_id"})'
    )
    for metric in ("gpu_utilization_ratio", "gpu_power_watts"):  # either job_labels mode
        # (or the job's labels: series from sidecars older than slurmhealth_job_gpu_info)
        assert f'slurmhealth_{metric} {join} or slurmhealth_{metric}{{job_id="$job_id"}}' in queries
    annotation = [a for a in job["annotations"]["list"] if "expr" in a]
    assert len(annotation) == 1
    assert 'changes(slurmhealth_events_total{job_id="$job_id"}[1m]) > 0' in annotation[0]["expr"]
    fleet = " ".join(dashboard_queries("fleet.json"))
    for needle in ("sum by (state) (slurmhealth_node_health_state)",
                   "sum by (check) (slurmhealth_node_drained == 1)",
                   "slurmhealth_fail_opens_total",
                   "topk(20, sum by (node, gpu, uuid)"):  # fmt: skip
        assert needle in fleet


# ---------------------------------------------------------------------- a real Prometheus


def _static_server(body: bytes) -> ThreadingHTTPServer:
    """A recorded exposition served on loopback, as its exporter would."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def dcgm_mode_jobs(job_labels: str = "series") -> CollectorRegistry:
    """slurmhealth in metrics.mode = "dcgm" on two nodes: job 4242 on gpu-a01 GPUs 0-3 and
    gpu-a02 GPUs 0-7, job 4243 on gpu-a01 GPUs 4-7 (as the fixture's hpc_job labels say)."""
    snap = FULL.snapshot
    assert snap is not None
    registry = CollectorRegistry()
    for job, node, gpus in (("4242", "gpu-a01", range(4)), ("4242", "gpu-a02", range(8)),
                            ("4243", "gpu-a01", range(4, 8))):  # fmt: skip
        labels = dataclasses.replace(FULL.labels, job_id=job, node=node)
        picked = tuple(g for g in snap.gpus if g.index in gpus)
        st = dataclasses.replace(
            FULL, labels=labels, snapshot=dataclasses.replace(snap, node=node, gpus=picked)
        )
        registry.register(
            SidecarCollector(lambda st=st: st, mode="dcgm", job_labels=job_labels)  # type: ignore[misc]
        )
    return registry


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Prometheus running deploy/prometheus.yml (1 s intervals) against one node's endpoint,
    plus a recorded dcgm-exporter and slurmhealth in dcgm mode for the dcgm dashboard."""
    tmp = tmp_path_factory.mktemp("prometheus")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Node())  # type: ignore[arg-type]
    endpoint = serve(registry, "127.0.0.1", [0])  # the node's one target
    dcgm = _static_server(DCGM_FIXTURE.read_bytes())
    dcgm_jobs = serve(dcgm_mode_jobs(), "127.0.0.1", [0])
    config = (PROM_DIR / "prometheus.yml").read_text()
    extra = f"""
  - job_name: dcgm
    scrape_interval: 1s
    scrape_timeout: 1s
    honor_labels: true
    static_configs:
      - targets: ["127.0.0.1:{dcgm.server_address[1]}", "127.0.0.1:{dcgm_jobs.server_address[1]}"]
"""
    target = '"gpu-a01:9450", "gpu-a02:9450", "gpu-a03:9450"'
    for old, new in ((target, f'"127.0.0.1:{endpoint.server_address[1]}"'), ("15s", "1s"),
                     ("scrape_timeout: 10s", "scrape_timeout: 1s"),
                     ("- slurmhealth.rules.yml", f"- {RULES}")):  # fmt: skip
        assert old in config, old
        config = config.replace(old, new)
    base_url, stop = start_prometheus(tmp, config + extra)
    try:
        yield base_url
    finally:
        stop()
        for server in (endpoint, dcgm, dcgm_jobs):
            server.shutdown()
            server.server_close()


def wait_for(base_url: str, expr: str, count: int, timeout: float = 20.0) -> list[Any]:
    deadline = time.monotonic() + timeout
    while True:
        answer = query(base_url, expr)
        assert answer["status"] == "success", answer
        result: list[Any] = answer["data"]["result"]
        if len(result) >= count or time.monotonic() > deadline:
            return result
        time.sleep(0.2)


@pytest.mark.parametrize(("dashboard", "expr"), all_queries())
def test_dashboard_query_is_valid_promql(prometheus: str, dashboard: str, expr: str) -> None:
    answer = query(prometheus, substitute(expr))
    assert answer["status"] == "success", (dashboard, expr, answer)


def test_prometheus_scrapes_one_target_per_node(prometheus: str) -> None:
    up = wait_for(prometheus, 'up{job="slurmhealth"} == 1', 1)
    assert [s["metric"]["node"] for s in up] == ["127.0.0.1"]  # from the target's address
    gpus = wait_for(prometheus, 'slurmhealth_gpu_up{job="slurmhealth"}', 8)
    assert len(gpus) == 8
    labels = gpus[0]["metric"]
    assert labels["job_id"] == "4242" and labels["user"] == "alice"
    assert labels["node"] == "gpu-a01" and labels["job"] == "slurmhealth"  # honor_labels
    assert not any(k.startswith("exported_") for k in labels)
    assert "account" not in labels
    heat = wait_for(prometheus, "avg by (node) (slurmhealth_gpu_utilization_ratio)", 1)
    assert float(heat[0]["value"][1]) == pytest.approx(0.87)
    by_account = wait_for(prometheus, substitute(dashboard_queries("cluster-overview.json")[-1]), 1)
    assert [r["metric"]["account"] for r in by_account] == ["ml"]  # joined from job_info
    state = wait_for(prometheus, "slurmhealth_node_health_state == 1", 1)
    assert [s["metric"]["state"] for s in state] == ["drained"]


def test_dcgm_dashboard_joins_dcgm_exporter_and_slurmhealth_on_hpc_job(prometheus: str) -> None:
    panel = next(p for p in load("dcgm-jobs.json")["panels"] if "utilisation" in p["title"])
    expr = substitute(panel["targets"][0]["expr"])  # job_id = 4242
    result = wait_for(prometheus, expr, 12)
    gpus = sorted((r["metric"]["Hostname"], int(r["metric"]["gpu"])) for r in result)
    assert gpus == [("gpu-a01", i) for i in range(4)] + [("gpu-a02", i) for i in range(8)]
    assert {r["metric"]["user"] for r in result} == {"alice"}  # slurmhealth's job facts
    assert {r["metric"]["account"] for r in result} == {"ml"}
    util = {(r["metric"]["Hostname"], r["metric"]["gpu"]): float(r["value"][1]) for r in result}
    assert util[("gpu-a01", "3")] == pytest.approx(0.93) and util[("gpu-a02", "0")] == 0.8
    idle = wait_for(prometheus, 'DCGM_FI_DEV_GPU_UTIL{Hostname="gpu-a03"}', 8)
    assert len(idle) == 8  # GPUs without a job stay out of the job's view
    own = query(prometheus, 'slurmhealth_gpu_utilization_ratio{job="dcgm"}')
    assert own["data"]["result"] == []  # dcgm mode: no GPU counters of slurmhealth's own


def test_rules_fire_on_live_data(prometheus: str) -> None:
    # "for: 0s" alerts on first-seen counters: Xid 79 and 13, the hang event, the fail-opens
    xids = wait_for(
        prometheus, 'ALERTS{alertname="SlurmhealthXid",alertstate="firing",job="slurmhealth"}', 2
    )
    assert {(a["metric"]["xid"], a["metric"]["severity"]) for a in xids} == {
        ("79", "critical"),
        ("13", "warning"),
    }
    hang = wait_for(prometheus, 'ALERTS{alertname="SlurmhealthJobHang"}', 1)
    assert hang[0]["metric"]["alertstate"] == "firing"
    fail = wait_for(prometheus, 'ALERTS{alertname="SlurmhealthFailOpen"}', 1)
    assert [(a["metric"]["cause"], a["metric"]["alertstate"]) for a in fail] == [
        ("config", "firing")
    ]
    down = wait_for(prometheus, 'ALERTS{alertname="SlurmhealthNvlinkDown"}', 1)
    assert [a["metric"]["gpu"] for a in down] == ["2"]
    assert down[0]["metric"]["alertstate"] == "pending"  # for: 1m
    quiet = query(prometheus, 'ALERTS{alertname=~"SlurmhealthGpuLost|SlurmhealthExporterDown"}')
    assert quiet["data"]["result"] == []
