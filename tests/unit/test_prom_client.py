"""The query API adapter against servers that misbehave: each failure is one line naming
the server, never a traceback or a hang past the timeout. (A real Prometheus:
tests/unit/test_prom_source.py.)"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from slurmhealth.errors import PrometheusError
from slurmhealth.metrics import prom_client
from slurmhealth.metrics.prom_client import PromClient

VECTOR = {"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"node": "n1", "gpu": "0"}, "value": [1.0, "0.5"]},
    {"metric": {"node": "n1", "gpu": "1"}, "value": [1.0, "NaN"]},
]}}  # fmt: skip


class Server:
    """A local HTTP server answering every POST with ``status`` and ``body``, or holding
    the request until :attr:`release` is set."""

    def __init__(self) -> None:
        self.status, self.body, self.hold = 200, b"", False
        self.release = threading.Event()
        self.forms: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                outer.forms.append(self.rfile.read(int(self.headers["Content-Length"])).decode())
                if outer.hold:
                    outer.release.wait(30)
                self.send_response(outer.status)
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/prom/"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, body: object, status: int = 200) -> None:
        self.status = status
        self.body = body if isinstance(body, bytes) else json.dumps(body).encode()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.release.set()
    s.httpd.shutdown()
    s.httpd.server_close()


def test_a_vector_comes_back_as_labels_and_floats(server: Server) -> None:
    server.answer(VECTOR)
    got = PromClient(server.url, 5).query('up{job_id="1"}', 1700000000.5)
    assert got[0] == ({"node": "n1", "gpu": "0"}, 0.5)
    assert got[1][1] != got[1][1]  # NaN stays NaN: the caller skips it
    (form,) = server.forms
    assert "time=1700000000.500" in form and "timeout=5000ms" in form  # the server stops too


def test_a_slow_server_is_one_line_within_the_timeout(server: Server) -> None:
    server.hold = True
    with pytest.raises(PrometheusError) as exc:
        PromClient(server.url, 0.3).query("up", 1.0)
    assert str(exc.value) == f"prometheus {server.url.rstrip('/')}: no answer within 0.3 s"


def test_gather_keeps_one_deadline_for_all_its_queries(server: Server) -> None:
    server.hold = True
    client = PromClient(server.url, 0.3)
    calls = {str(i): (lambda timeout_s: client.query("up", 1.0, timeout_s=timeout_s))
             for i in range(12)}  # fmt: skip
    with pytest.raises(PrometheusError, match=r": no answer within 0\.3 s$"):
        client.gather(calls)


@pytest.mark.parametrize(
    ("status", "body", "problem"),
    [
        (200, b"<html>hello</html>", "the answer is not JSON (is this Prometheus' address?)"),
        (200, {"status": "error", "error": "too\nmany samples"}, "too many samples"),
        (200, {"status": "success"}, "the answer holds no data"),
        (400, {"status": "error", "errorType": "bad_data", "error": "parse error"},
         "HTTP 400: bad_data: parse error"),
        (503, b"", "HTTP 503: Service Unavailable"),
        (200, {"status": "success", "data": {"resultType": "matrix", "result": []}},
         "expected a vector, got 'matrix'"),
    ],
)  # fmt: skip
def test_every_bad_answer_is_one_line(
    server: Server, status: int, body: object, problem: str
) -> None:
    server.answer(body, status)
    with pytest.raises(PrometheusError) as exc:
        PromClient(server.url, 5).query("up", 1.0)
    assert str(exc.value).endswith(problem) and "\n" not in str(exc.value)


def test_an_answer_beyond_the_bound_is_refused(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(prom_client, "MAX_ANSWER_BYTES", 64)
    server.answer(VECTOR)
    with pytest.raises(PrometheusError, match="answer larger than"):
        PromClient(server.url, 5).query("up", 1.0)


def test_a_scalar_is_one_series_without_labels(server: Server) -> None:
    server.answer({"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}})
    assert PromClient(server.url, 5).query("1 + 1", 1.0) == [({}, 2.0)]
