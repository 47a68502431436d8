"""The Prometheus text format, fast, and one ``/metrics`` HTTP server.

:func:`render` is byte for byte what ``generate_latest`` returns, about 4x faster for plain
gauges and counters; :func:`serve` serves a registry on the first port that binds.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client import utils as _client_utils
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # the text format render() returns, for /metrics

_go_float: Callable[[float], str] = _client_utils.floatToGoString
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_PLAIN_TYPES = {"gauge": "gauge", "counter": "counter", "unknown": "untyped"}


class _One(Collector):
    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterator[Metric]:
        yield self.metric


# label set -> its text, kept across scrapes: a sidecar's label sets hardly change
_LABEL_TEXT: dict[tuple[tuple[str, str], ...], str] = {}


def _label_text(items: tuple[tuple[str, str], ...]) -> str | None:
    if not all(_LABEL_NAME.match(k) for k, _ in items):
        return None
    esc = [(k, v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")) for k, v in items]
    text = "{" + ",".join(f'{k}="{v}"' for k, v in sorted(esc)) + "}" if items else ""
    if len(_LABEL_TEXT) >= 50_000:
        _LABEL_TEXT.clear()
    _LABEL_TEXT[items] = text
    return text


def _render_plain(metric: Metric) -> str | None:
    """``generate_latest``'s text for a plain gauge/counter family, or None to let it do it.

    The client escapes and validates every label of every sample (about 20 us a sample);
    here each label set's text is made once and reused by later scrapes.
    """
    mtype = _PLAIN_TYPES.get(metric.type)
    name = metric.name + "_total" if mtype == "counter" else metric.name
    if mtype is None or not _METRIC_NAME.match(name):
        return None
    doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
    out = [f"# HELP {name} {doc}\n# TYPE {name} {mtype}\n"]
    for s in metric.samples:
        if s.name != name or s.exemplar is not None or s.native_histogram is not None:
            return None
        items = tuple(s.labels.items())
        if (labels := _LABEL_TEXT.get(items)) is None and (labels := _label_text(items)) is None:
            return None
        ts = "" if s.timestamp is None else f" {int(float(s.timestamp) * 1000):d}"
        out.append(f"{name}{labels} {_go_float(s.value)}{ts}\n")
    return "".join(out)


def render(registry: CollectorRegistry) -> bytes:
    """The registry's samples in the Prometheus text format (what ``/metrics`` serves).

    Byte for byte what ``generate_latest(registry)`` returns, about 4x faster for plain
    gauges and counters; other families go through ``generate_latest`` itself.
    """
    chunks = []
    for metric in registry.collect():
        text = _render_plain(metric)
        chunks.append(generate_latest(_One(metric)).decode() if text is None else text)
    return "".join(chunks).encode()


def metrics_handler(registry: CollectorRegistry) -> type[BaseHTTPRequestHandler]:
    """The request handler that answers ``/metrics`` (and ``/``) with :func:`render`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            body = render(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # scrapes are not worth a log line
            return

    return Handler


def serve(registry: CollectorRegistry, bind: str, ports: Iterable[int]) -> ThreadingHTTPServer:
    """Serve ``registry`` on ``/metrics`` (by :func:`render`: 4-6 ms for 8 GPUs, where
    prometheus_client's exposition takes ~20 ms) on the first port of ``ports`` that binds
    (0: any free port), in a daemon thread. The bound port is ``server.server_address[1]``.
    The node's exporter uses :mod:`slurmhealth.metrics.http_server` instead (bounded)."""
    handler = metrics_handler(registry)
    tried = []
    for port in ports:
        tried.append(port)
        try:
            server = ThreadingHTTPServer((bind, port), handler)
        except OSError:
            continue
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True, name="metrics").start()
        return server
    raise OSError(f"no free port among {tried[0]}-{tried[-1]}" if tried else "no port to try")
