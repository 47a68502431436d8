"""The fast Prometheus text exposition (slurmhealth.exposition): what a scraper reads, escaped
so that a real parser gets the label values and help texts back; plain families rendered
without the client's slow path; the /metrics server and its port choice."""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import prometheus_client
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    UnknownMetricFamily,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Exemplar

from slurmhealth import exposition
from slurmhealth.exposition import CONTENT_TYPE, render, serve

ODD = 'o"brien\\x\ny'  # a quote, a backslash and a newline in one label value


@pytest.fixture(autouse=True)
def _fresh_label_cache() -> Iterator[None]:
    """Label texts are cached per process: each test makes its own (else what it checks
    was made by an earlier one)."""
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


def _no_client_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(_registry: CollectorRegistry) -> bytes:
        raise AssertionError("a plain family went through generate_latest")

    monkeypatch.setattr(exposition, "generate_latest", refuse)


def _gauge() -> GaugeMetricFamily:
    gauge = GaugeMetricFamily("gpu_temp_celsius", "GPU temperature", labels=["gpu", "user"])
    gauge.add_metric(["0", ODD], 71.5)
    gauge.add_metric(["1", "bob"], 40.0)
    return gauge


def test_label_values_are_escaped_as_a_parser_reads_them() -> None:
    text = render(_registry(_gauge())).decode()
    assert 'gpu_temp_celsius{gpu="0",user="o\\"brien\\\\x\\ny"} 71.5\n' in text
    (family,) = text_string_to_metric_families(text)
    assert [(s.labels, s.value) for s in family.samples] == [
        ({"gpu": "0", "user": ODD}, 71.5),
        ({"gpu": "1", "user": "bob"}, 40.0),
    ]


def test_labels_are_sorted_by_name_and_a_sample_without_labels_has_no_braces() -> None:
    gauge = GaugeMetricFamily("up", "up", labels=["zone", "a"])
    gauge.add_metric(["z1", "x"], 1)
    bare = GaugeMetricFamily("nodes", "node count", value=3)
    text = render(_registry(gauge, bare)).decode()
    assert 'up{a="x",zone="z1"} 1.0\n' in text
    assert "\nnodes 3.0\n" in text


def test_help_text_is_escaped() -> None:
    gauge = GaugeMetricFamily("x_ratio", "a \\ backslash\nand a newline", value=0.5)
    text = render(_registry(gauge)).decode()
    assert text.startswith(
        "# HELP x_ratio a \\\\ backslash\\nand a newline\n# TYPE x_ratio gauge\n"
    )
    (family,) = text_string_to_metric_families(text)
    assert family.documentation == "a \\ backslash\nand a newline"


def test_plain_families_are_rendered_without_the_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gauges, counters and untyped families are the fast path (4x faster than the
    client's); the text is what the client itself would write."""
    counter = CounterMetricFamily("xid_errors", "Xid errors", labels=["xid"])
    counter.add_metric(["79"], 2)
    untyped = UnknownMetricFamily("raw", "raw value", labels=["k"])
    untyped.add_metric(["v"], 7)
    families = (_gauge(), counter, untyped)
    expected = generate_latest(_registry(*families))
    _no_client_path(monkeypatch)
    text = render(_registry(*families))
    assert text == expected
    assert b'# TYPE xid_errors_total counter\nxid_errors_total{xid="79"} 2.0\n' in text
    assert b'# TYPE raw untyped\nraw{k="v"} 7.0\n' in text


def test_a_cached_label_text_is_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = _registry(_gauge())
    first = render(registry)
    _no_client_path(monkeypatch)
    assert render(registry) == first  # the second scrape, from the cache


def test_the_label_cache_is_bounded() -> None:
    exposition._LABEL_TEXT.update({(("k", str(n)),): "" for n in range(50_000)})
    assert exposition._label_text((("gpu", "0"),)) == '{gpu="0"}'
    assert exposition._LABEL_TEXT == {(("gpu", "0"),): '{gpu="0"}'}


def test_other_families_are_the_clients_text_byte_for_byte() -> None:
    """What the fast path leaves to the client: histograms, a Counter's _created series,
    samples with an exemplar, a label name the text format does not allow."""
    registry = CollectorRegistry()
    prometheus_client.Histogram("h_seconds", "a histogram", ["x"], registry=registry).labels(
        "a"
    ).observe(0.2)
    prometheus_client.Counter("req", "requests", ["a"], registry=registry).labels(ODD).inc()
    with_exemplar = CounterMetricFamily("ex", "with an exemplar", labels=["a"])
    with_exemplar.add_metric(["b"], 2, exemplar=Exemplar({"trace": "1"}, 1.0))
    stamped = GaugeMetricFamily("stamped", "timestamped", labels=["a"])
    stamped.add_metric(["b"], 1.5, timestamp=1_700_000_000.25)
    registry.register(_Families(with_exemplar, stamped))
    text = render(registry)
    assert text == generate_latest(registry)
    assert b'req_created{a="o\\"brien\\\\x\\ny"}' in text
    assert b'stamped{a="b"} 1.5 1700000000250\n' in text


def test_a_label_name_the_format_forbids_is_left_to_the_client() -> None:
    """A metric name or label name outside the format's charset: the client's own
    handling (it does not write a line the fast path would have made up)."""
    assert exposition._label_text((("bad-name", "v"),)) is None
    assert exposition._label_text((("gpu", "0"), ("1x", "v"))) is None
    gauge = GaugeMetricFamily("g", "g", labels=["gpu"])
    gauge.add_metric(["0"], 1)
    assert exposition._render_plain(gauge) is not None
    bad = GaugeMetricFamily("g", "g")
    bad.samples.append(type(gauge.samples[0])("g", {"bad-name": "v"}, 1.0, None, None, None))
    assert exposition._render_plain(bad) is None
    assert exposition._render_plain(GaugeMetricFamily("9lives", "g", value=1)) is None


def _get(port: int, path: str) -> tuple[int, str, str, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            body = resp.read()
            return resp.status, resp.headers["Content-Type"], resp.headers["Content-Length"], body
    except urllib.error.HTTPError as e:
        return e.code, "", "", b""


def test_the_server_answers_metrics_and_the_root_only() -> None:
    registry = _registry(_gauge())
    server = serve(registry, "127.0.0.1", [0])
    try:
        port = server.server_address[1]
        status, ctype, length, body = _get(port, "/metrics")
        assert (status, ctype) == (200, CONTENT_TYPE)
        assert body == render(registry) and length == str(len(body))
        assert _get(port, "/?x=1")[0] == 200
        assert _get(port, "/metrics?name[]=up")[3] == body
        assert _get(port, "/other")[0] == 404
        assert _get(port, "/x?/metrics")[0] == 404
        assert server.daemon_threads  # a scrape in progress never holds up the exit
        threads = [t for t in threading.enumerate() if t.name == "metrics"]
        assert threads and all(t.daemon for t in threads)
    finally:
        server.shutdown()
        server.server_close()


def test_the_server_takes_the_first_port_that_binds() -> None:
    with socket.socket() as a, socket.socket() as b, socket.socket() as c:
        for sock in (a, b, c):
            sock.bind(("127.0.0.1", 0))
            sock.listen()
        first, middle, last = (sock.getsockname()[1] for sock in (a, b, c))
        server = serve(_registry(_gauge()), "127.0.0.1", [first, 0])
        try:
            assert server.server_address[1] not in (first, 0)
            assert _get(server.server_address[1], "/metrics")[0] == 200
        finally:
            server.shutdown()
            server.server_close()
        with pytest.raises(OSError, match=rf"^no free port among {first}-{last}$"):
            serve(_registry(), "127.0.0.1", [first, middle, last])
    with pytest.raises(OSError, match=r"^no port to try$"):
        serve(_registry(), "127.0.0.1", [])
