"""deploy/prometheus and deploy/grafana: promtool checks, and a real Prometheus that scrapes
the collector, evaluates the alert rules and parses every dashboard query."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from slurmhealth.metrics import SidecarCollector, serve
from slurmhealth.model import TaskStats
from tests.prometheus_util import promtool, query, start_prometheus
from tests.unit.test_metrics import state

pytestmark = pytest.mark.prometheus

REPO = Path(__file__).resolve().parents[2]
PROM_DIR = REPO / "deploy" / "prometheus"
GRAFANA_DIR = REPO / "deploy" / "grafana"
RULES = PROM_DIR / "slurmhealth.rules.yml"

DASHBOARDS = {
    "cluster-overview.json": ("slurmhealth / Cluster overview", {"datasource"}),
    "node-detail.json": ("slurmhealth / Node detail", {"datasource", "node"}),
    "job-detail.json": ("slurmhealth / Job detail", {"datasource", "job_id", "user"}),
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
VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")
ALERTS = {
    "SlurmhealthGpuLost", "SlurmhealthXid", "SlurmhealthNvlinkDown",
    "SlurmhealthEccUncorrectable", "SlurmhealthGpuHot", "SlurmhealthThrottling",
    "SlurmhealthJobHang", "SlurmhealthThroughputDrop", "SlurmhealthStraggler",
    "SlurmhealthDrainCircuitBreaker", "SlurmhealthSidecarDown",
}  # fmt: skip


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


def exported_names() -> set[str]:
    registry = CollectorRegistry()
    full = state(task=TaskStats(1, 0.4, 1.0, 1.0, 0.4, 0.1, 0.01, 1.0))
    registry.register(SidecarCollector(lambda: full))
    return {s.name for fam in registry.collect() for s in fam.samples}


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\bslurmhealth_\w+", expr))


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


def test_every_alert_has_severity_annotations_and_a_unit_test() -> None:
    rules = RULES.read_text()
    tests = (PROM_DIR / "slurmhealth.rules.test.yml").read_text()
    found = set(re.findall(r"- alert: (\w+)", rules))
    assert found == ALERTS
    for alert in ALERTS:
        assert f"alertname: {alert}\n" in tests, f"{alert} has no promtool test"
    blocks = re.split(r"\n\s*- alert: ", rules)[1:]
    for block in blocks:
        assert re.search(r"\n\s+for: \d+[smh]", block), block
        assert re.search(r"severity: (critical|warning)\n", block), block
        assert "summary:" in block and "description:" in block, block
        described = block.split("description:", 1)[1]
        for label in ("node", "job_id", "user"):
            assert f"$labels.{label}" in described, (label, block)


def test_rules_and_dashboards_use_only_exported_metrics() -> None:
    exported = exported_names()
    used = metric_names(RULES.read_text())
    for _, expr in all_queries():
        used |= metric_names(expr)
    assert used <= exported, used - exported


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
                   "slurmhealth_job_info", "slurmhealth_node_drains_suppressed_total"):  # fmt: skip
        assert needle in overview
    node = " ".join(dashboard_queries("node-detail.json"))
    for metric in ("utilization_ratio", "memory_used_bytes", "temperature_celsius",
                   "power_watts", "nvlink_errors_total", "nvlink_up"):  # fmt: skip
        assert f'slurmhealth_gpu_{metric}{{node="$node"}}' in node
    job = load("job-detail.json")
    queries = " ".join(dashboard_queries("job-detail.json"))
    for metric in ("gpu_utilization_ratio", "gpu_power_watts", "job_step_seconds",
                   "job_mfu_ratio", "job_comm_ratio", "job_data_wait_ratio"):  # fmt: skip
        assert f'slurmhealth_{metric}{{job_id="$job_id"}}' in queries
    annotation = [a for a in job["annotations"]["list"] if "expr" in a]
    assert len(annotation) == 1
    assert 'changes(slurmhealth_events_total{job_id="$job_id"}[1m]) > 0' in annotation[0]["expr"]


# ---------------------------------------------------------------------- a real Prometheus


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Prometheus running deploy/prometheus.yml (1 s intervals) against one live sidecar."""
    tmp = tmp_path_factory.mktemp("prometheus")
    exporter = serve(state, "127.0.0.1", [0])  # the sidecar's own /metrics server
    port = exporter.server_address[1]
    sd = tmp / "file_sd"
    sd.mkdir()
    target = {"targets": [f"127.0.0.1:{port}"],
              "labels": {"job_id": "4242", "user": "alice", "node": "gpu-a01"}}  # fmt: skip
    (sd / "4242-gpu-a01.json").write_text(json.dumps([target]))
    config = (PROM_DIR / "prometheus.yml").read_text()
    for old, new in (("/run/slurmhealth/file_sd/*.json", f"{sd}/*.json"), ("10s", "1s"),
                     ("scrape_timeout: 5s", "scrape_timeout: 1s"),
                     ("- slurmhealth.rules.yml", f"- {RULES}")):  # fmt: skip
        assert old in config, old
        config = config.replace(old, new)
    base_url, stop = start_prometheus(tmp, config)
    try:
        yield base_url
    finally:
        stop()
        exporter.shutdown()
        exporter.server_close()


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


def test_prometheus_scrapes_the_collector_with_job_labels(prometheus: str) -> None:
    up = wait_for(prometheus, 'up{job="slurmhealth"} == 1', 1)
    assert [s["metric"]["job_id"] for s in up] == ["4242"]
    gpus = wait_for(prometheus, "slurmhealth_gpu_up", 8)
    assert len(gpus) == 8
    labels = gpus[0]["metric"]
    assert labels["job_id"] == "4242" and labels["user"] == "alice"
    assert labels["node"] == "gpu-a01" and labels["job"] == "slurmhealth"
    assert not any(k.startswith("exported_") for k in labels)  # honor_labels
    heat = wait_for(prometheus, "avg by (node) (slurmhealth_gpu_utilization_ratio)", 1)
    assert float(heat[0]["value"][1]) == pytest.approx(0.87)


def test_rules_fire_on_live_data(prometheus: str) -> None:
    # "for: 0s" alerts on first-seen counters: Xid 79 and 13, the hang event
    xids = wait_for(prometheus, 'ALERTS{alertname="SlurmhealthXid",alertstate="firing"}', 2)
    assert {(a["metric"]["xid"], a["metric"]["severity"]) for a in xids} == {
        ("79", "critical"),
        ("13", "warning"),
    }
    hang = wait_for(prometheus, 'ALERTS{alertname="SlurmhealthJobHang"}', 1)
    assert hang[0]["metric"]["alertstate"] == "firing"
    down = wait_for(prometheus, 'ALERTS{alertname="SlurmhealthNvlinkDown"}', 1)
    assert [(a["metric"]["gpu"], a["metric"]["link"]) for a in down] == [("2", "7")]
    assert down[0]["metric"]["alertstate"] == "pending"  # for: 1m
    quiet = query(prometheus, 'ALERTS{alertname=~"SlurmhealthGpuLost|SlurmhealthSidecarDown"}')
    assert quiet["data"]["result"] == []
