"""The exporter's HTTP listener under a hostile host: half-open connections (slowloris),
malformed requests, broken connections. A real server on a loopback port, real sockets."""

from __future__ import annotations

import dataclasses
import resource
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Gauge

from slurmhealth.config_sections import MetricsConfig
from slurmhealth.http_server import BoundedServer, listen

HALF_OPEN = 1000


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[BoundedServer]:
    registry = CollectorRegistry()
    Gauge("slurmhealth_test_up", "a series to scrape", registry=registry).set(1)
    extra = getattr(request, "param", {})
    mc = dataclasses.replace(MetricsConfig(), bind="127.0.0.1", port=0, **extra)
    srv = listen(registry, mc)
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(srv: BoundedServer, path: str = "/metrics") -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}{path}"


def _scrape(srv: BoundedServer) -> tuple[float, bytes]:
    t0 = time.monotonic()
    with urllib.request.urlopen(_url(srv), timeout=10) as resp:
        body: bytes = resp.read()
    return time.monotonic() - t0, body


def _half_open(srv: BoundedServer) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: node\r\n")  # never the blank line
    return s


def test_slowloris_1000_half_open_connections_do_not_stop_a_scrape(
    server: BoundedServer,
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 3 * HALF_OPEN:
        pytest.skip(f"file limit {hard}: cannot hold {HALF_OPEN} connections on both ends")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 3 * HALF_OPEN), hard))
    threads_before = threading.active_count()
    held = []
    try:
        for _ in range(HALF_OPEN):
            held.append(_half_open(server))
        times = []
        for _ in range(5):
            took, body = _scrape(server)
            times.append(took)
            assert b"slurmhealth_test_up 1.0" in body
            held.append(_half_open(server))  # and the flood goes on between scrapes
        assert max(times) < 2.0, times
        # one selector thread and a fixed pool, whatever the number of connections
        assert threading.active_count() <= threads_before + MetricsConfig().http_workers + 1
        assert server.counts.snapshot().get("evicted", 0) >= HALF_OPEN - 512
    finally:
        for s in held:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("server", [{"header_timeout_s": 0.3}], indirect=True)
def test_a_request_head_not_done_in_time_is_dropped_and_counted(server: BoundedServer) -> None:
    s = _half_open(server)
    with s:
        assert s.recv(100) == b""  # closed by the server (recv's own timeout is 10 s)
    _took, body = _scrape(server)
    assert b'slurmhealth_exporter_http_dropped_total{reason="timeout"} 1.0' in body


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"BLAH\r\n\r\n", 400),
        (b"GET /nope HTTP/1.0\r\n\r\n", 404),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.0\r\n\r\n", 414),
        (b"GET / HTTP/1.0\r\n" + b"X-A: b\r\n" * 150 + b"\r\n", 431),
        (b"DELETE /metrics HTTP/1.0\r\n\r\n", 501),
    ],
)
def test_malformed_requests_still_get_their_status(
    server: BoundedServer, raw: bytes, status: int
) -> None:
    with socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10) as s:
        s.sendall(raw)
        reply = s.recv(400)
    if raw.startswith(b"BLAH"):  # no version given: an HTTP/0.9 answer, the body only
        assert f"Error code: {status}".encode() in reply, reply
    else:
        assert reply.split(b"\r\n")[0].split()[1] == str(status).encode(), reply


def test_connections_reset_mid_request_leave_no_traceback(
    server: BoundedServer, capfd: pytest.CaptureFixture[str]
) -> None:
    for _ in range(50):
        s = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        s.close()  # RST: the answer meets a reset connection
    took, _body = _scrape(server)
    assert took < 2.0
    assert "Traceback" not in capfd.readouterr().err
