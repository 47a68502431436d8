"""slurmhealth.metrics.exposition: the text a scrape gets (escaping a real parser undoes, the
fast path for plain families, the label-text cache and its bound) and the /metrics server."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from slurmhealth.metrics import exposition
from slurmhealth.metrics.exposition import CONTENT_TYPE, render, serve


@pytest.fixture(autouse=True)
def empty_label_cache() -> Iterator[None]:
    """The label texts are cached per process: each test starts from an empty cache, so its
    label sets are escaped by the code under test, not found from an earlier test."""
    exposition._LABEL_TEXT.clear()
    yield
    exposition._LABEL_TEXT.clear()


class _Families(Collector):
    def __init__(self, *families: Metric) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def _registry(*families: Metric) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(_Families(*families))
    return registry


@pytest.fixture
def client_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The families render() handed to prometheus_client's own (4x slower) exposition."""
    calls: list[str] = []

    def counted(registry: CollectorRegistry) -> bytes:
        calls.extend(m.name for m in registry.collect())
        return generate_latest(registry)

    monkeypatch.setattr(exposition, "generate_latest", counted)
    return calls


ODD = 'o"brien\\x\ny'  # a quote, a backslash and a newline: each must be escaped


def test_plain_families_are_rendered_without_the_client_and_escaped(
    client_calls: list[str],
) -> None:
    gauge = GaugeMetricFamily("slurmhealth_gpu_temp_celsius", 'doc\\ with "a"\nnewline',
                              labels=["user", "gpu"])  # fmt: skip
    gauge.add_metric([ODD, "0"], 61.0)
    gauge.add_metric(["bob", "1"], 1e-7)
    counter = CounterMetricFamily("slurmhealth_xid_events", "Xids seen", labels=["xid"])
    counter.add_metric(["79"], 3)
    bare = GaugeMetricFamily("slurmhealth_up", "no labels")
    bare.add_metric([], 1)
    unknown = Metric("slurmhealth_odd", "of unknown type", "unknown")
    unknown.add_sample("slurmhealth_odd", {"b": "2", "a": "1"}, 4)
    registry = _registry(gauge, counter, bare, unknown)
    text = render(registry).decode()
    assert client_calls == []  # every family took the fast path
    assert text == generate_latest(registry).decode()
    assert text == (
        '# HELP slurmhealth_gpu_temp_celsius doc\\\\ with "a"\\nnewline\n'
        "# TYPE slurmhealth_gpu_temp_celsius gauge\n"
        'slurmhealth_gpu_temp_celsius{gpu="0",user="o\\"brien\\\\x\\ny"} 61.0\n'
        'slurmhealth_gpu_temp_celsius{gpu="1",user="bob"} 1e-07\n'
        "# HELP slurmhealth_xid_events_total Xids seen\n"
        "# TYPE slurmhealth_xid_events_total counter\n"
        'slurmhealth_xid_events_total{xid="79"} 3.0\n'
        "# HELP slurmhealth_up no labels\n"
        "# TYPE slurmhealth_up gauge\n"
        "slurmhealth_up 1.0\n"
        "# HELP slurmhealth_odd of unknown type\n"
        "# TYPE slurmhealth_odd untyped\n"
        'slurmhealth_odd{a="1",b="2"} 4.0\n'
    )
    # a real parser gets back exactly what was exported
    parsed = {f.name: f for f in text_string_to_metric_families(text)}
    temp = parsed["slurmhealth_gpu_temp_celsius"]
    assert temp.documentation == 'doc\\ with "a"\nnewline'
    assert [(s.labels, s.value) for s in temp.samples] == [
        ({"user": ODD, "gpu": "0"}, 61.0),
        ({"user": "bob", "gpu": "1"}, 1e-7),
    ]
    assert parsed["slurmhealth_xid_events"].samples[0].labels == {"xid": "79"}


def test_other_families_go_to_the_client_byte_for_byte(client_calls: list[str]) -> None:
    states = StateSetMetricFamily("slurmhealth_mode", "a stateset", value={"a": True, "b": False})
    bad = GaugeMetricFamily("slurmhealth_bad", "an invalid label name", labels=["bad-name"])
    bad.add_metric(["x"], 1)
    bad_name = GaugeMetricFamily("9lives", "an invalid metric name")
    bad_name.add_metric([], 1)
    registry = _registry(states, bad, bad_name)
    prometheus_client.Counter("jobs", "with a _created sample", ["l"], registry=registry).labels(
        "v"
    ).inc()
    prometheus_client.Histogram("h_seconds", "a histogram", registry=registry).observe(0.2)
    text = render(registry)
    assert text == generate_latest(registry)
    assert client_calls == ["slurmhealth_mode", "slurmhealth_bad", "9lives", "jobs", "h_seconds"]
    assert b"# TYPE slurmhealth_mode gauge\n" in text
    assert b'slurmhealth_bad{bad_name="x"} 1.0\n' in text  # the client's own escaping
    assert b"# TYPE jobs_created gauge\n" in text


def test_a_timestamped_sample_keeps_its_milliseconds(client_calls: list[str]) -> None:
    stamped = GaugeMetricFamily("stamped", "with a timestamp", labels=["a"])
    stamped.add_metric(["b"], 1.5, timestamp=1_700_000_000.25)
    registry = _registry(stamped)
    assert render(registry) == generate_latest(registry)
    assert render(registry).endswith(b'stamped{a="b"} 1.5 1700000000250\n')
    assert client_calls == []


def test_a_label_set_is_escaped_once_and_reused_by_later_scrapes(
    monkeypatch: pytest.MonkeyPatch, client_calls: list[str]
) -> None:
    escaped: list[tuple[tuple[str, str], ...]] = []
    real = exposition._label_text

    def counting(items: tuple[tuple[str, str], ...]) -> str | None:
        escaped.append(items)
        return real(items)

    monkeypatch.setattr(exposition, "_label_text", counting)
    gauge = GaugeMetricFamily("g", "doc", labels=["user"])
    gauge.add_metric([ODD], 1)
    gauge.add_metric(["bob"], 2)
    registry = _registry(gauge)
    first = render(registry)
    assert escaped == [(("user", ODD),), (("user", "bob"),)]
    assert exposition._LABEL_TEXT[(("user", ODD),)] == '{user="o\\"brien\\\\x\\ny"}'
    assert render(registry) == first == generate_latest(registry)
    assert len(escaped) == 2  # the second scrape found both texts in the cache
    assert client_calls == []


def test_the_label_cache_is_bounded_at_50000_label_sets() -> None:
    """An exporter whose label values churn (a job id per scrape) must not grow forever."""
    for i in range(49_999):
        exposition._LABEL_TEXT[(("job", str(i)),)] = f'{{job="{i}"}}'
    gauge = GaugeMetricFamily("g", "doc", labels=["job"])
    gauge.add_metric(["a"], 1)
    render(_registry(gauge))
    assert len(exposition._LABEL_TEXT) == 50_000
    gauge = GaugeMetricFamily("g", "doc", labels=["job"])
    gauge.add_metric(["b"], 1)
    assert render(_registry(gauge)).endswith(b'g{job="b"} 1.0\n')
    assert list(exposition._LABEL_TEXT) == [(("job", "b"),)]  # emptied, then this one kept


# -- the /metrics server --------------------------------------------------------------------


def _get(port: int, path: str) -> tuple[int, http.client.HTTPMessage, bytes]:
    """Status, headers (looked up case-insensitively, as HTTP says) and body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        conn.close()


@pytest.fixture
def served() -> Iterator[tuple[int, CollectorRegistry]]:
    gauge = GaugeMetricFamily("slurmhealth_up", "up", labels=["node"])
    gauge.add_metric(["gpu-a01"], 1)
    registry = _registry(gauge)
    server = serve(registry, "127.0.0.1", [0])
    try:
        yield server.server_address[1], registry
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("path", ["/metrics", "/", "/metrics?name[]=slurmhealth_up"])
def test_a_scrape_gets_the_registry_with_its_type_and_length(
    served: tuple[int, CollectorRegistry], path: str
) -> None:
    port, registry = served
    status, headers, body = _get(port, path)
    assert status == 200
    assert body == render(registry)
    assert body.endswith(b'# TYPE slurmhealth_up gauge\nslurmhealth_up{node="gpu-a01"} 1.0\n')
    assert headers["Content-Type"] == CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    assert headers["Content-Length"] == str(len(body))
    [family] = text_string_to_metric_families(body.decode())
    assert family.samples[0].value == 1.0


@pytest.mark.parametrize("path", ["/other", "/metricsx", "/METRICS", "/x?/metrics"])
def test_any_other_path_is_not_found(served: tuple[int, CollectorRegistry], path: str) -> None:
    status, _headers, body = _get(served[0], path)
    assert status == 404 and b"slurmhealth_up" not in body


def test_the_server_runs_in_a_daemon_thread(served: tuple[int, CollectorRegistry]) -> None:
    """A daemon thread, daemon request threads: an exporter's exit never waits on a scrape."""
    [thread] = [t for t in threading.enumerate() if t.name == "metrics"]
    assert thread.daemon


def test_serve_takes_the_first_port_that_binds() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        server = serve(CollectorRegistry(), "127.0.0.1", [busy, 0])
        try:
            port = server.server_address[1]
            assert port not in (busy, 0)
            assert server.daemon_threads is True
            assert _get(port, "/metrics")[0] == 200
        finally:
            server.shutdown()
            server.server_close()


def test_serve_names_the_ports_it_tried_when_none_binds() -> None:
    socks = []
    try:
        for _ in range(3):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen()
            socks.append(s)
        ports = [s.getsockname()[1] for s in socks]
        with pytest.raises(OSError, match=rf"^no free port among {ports[0]}-{ports[2]}$"):
            serve(CollectorRegistry(), "127.0.0.1", ports)
        with pytest.raises(OSError, match=r"^no port to try$"):
            serve(CollectorRegistry(), "127.0.0.1", [])
    finally:
        for s in socks:
            s.close()
