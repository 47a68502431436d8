"""The exporter's HTTP listener under a hostile host: half-open connections (slowloris),
malformed requests, broken connections. A real server on a loopback port, real sockets."""

from __future__ import annotations

import base64
import dataclasses
import resource
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge

from slurmhealth.config.sections import MetricsConfig
from slurmhealth.metrics.http_server import BoundedServer, listen
from tests.support.skips import require_module, unavailable

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
        unavailable(f"file limit {hard}: cannot hold {HALF_OPEN} connections on both ends")
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
    for _ in range(30):  # fewer than max_requests (40): the scrape after them is not a 503
        s = socket.create_connection(("127.0.0.1", server.server_address[1]), timeout=10)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        s.close()  # RST: the answer meets a reset connection
    took, _body = _scrape(server)
    assert took < 2.0
    assert "Traceback" not in capfd.readouterr().err


# -- TLS and basic auth from a Prometheus web-config file -------------------------------------


@pytest.fixture
def web_config(tmp_path: Path) -> Path:
    bcrypt = require_module("bcrypt", "bcrypt (the web extra) is not installed")
    if shutil.which("openssl") is None:
        unavailable("openssl not installed (to make a test certificate)")
    key, cert = str(tmp_path / "key.pem"), str(tmp_path / "cert.pem")
    argv = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
            "/CN=localhost", "-keyout", key, "-out", cert]  # fmt: skip
    subprocess.run(argv, check=True, capture_output=True)
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode().replace("$2b$", "$2y$")
    path = tmp_path / "web.yml"
    path.write_text(
        "tls_server_config:\n"
        f"  cert_file: {tmp_path / 'cert.pem'}\n"
        f"  key_file: {tmp_path / 'key.pem'}\n"
        "basic_auth_users:\n"
        f"  prometheus: '{hashed}'\n"
    )
    return path


def _tls_get(srv: BoundedServer, cert: Path, auth: str | None) -> tuple[int, bytes]:
    ctx = ssl.create_default_context(cafile=str(cert))
    ctx.check_hostname = False
    req = urllib.request.Request(_url(srv).replace("http:", "https:"))
    if auth:
        req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def test_tls_and_basic_auth_from_a_prometheus_web_config(web_config: Path) -> None:
    registry = CollectorRegistry()
    Gauge("slurmhealth_test_up", "a series to scrape", registry=registry).set(1)
    mc = dataclasses.replace(MetricsConfig(), bind="127.0.0.1", port=0, header_timeout_s=0.5,
                             web_config_file=str(web_config))  # fmt: skip
    srv = listen(registry, mc)
    cert = web_config.parent / "cert.pem"
    try:
        assert _tls_get(srv, cert, None)[0] == 401
        assert _tls_get(srv, cert, "prometheus:wrong")[0] == 401
        assert _tls_get(srv, cert, "mallory:s3cret")[0] == 401
        status, body = _tls_get(srv, cert, "prometheus:s3cret")
        assert status == 200 and b"slurmhealth_test_up 1.0" in body
        assert _tls_get(srv, cert, "prometheus:s3cret")[0] == 200  # remembered: no bcrypt
        with pytest.raises(OSError):  # plain HTTP on the TLS port gets nothing it can read
            _scrape(srv)
        s = socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=10)
        with s:  # a connection that never starts its handshake goes at the head timeout
            assert s.recv(100) == b""
        assert srv.counts.snapshot().get("timeout", 0) >= 1
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("tls_server_config:\n  cert_file: /x\n  keyfile: /y\n", "tls_server_config.keyfile"),
        ("basic_auth_user:\n  a: b\n", "basic_auth_user: unknown key"),
        ("basic_auth_users:\n  prometheus: plain-text\n", "basic_auth_users.prometheus"),
        ("tls_server_config:\n  cert_file: /nonexistent.pem\n  key_file: /x\n", "No such file"),
    ],
)
def test_a_web_config_that_is_wrong_is_refused_with_its_key(
    tmp_path: Path, text: str, error: str
) -> None:
    require_module("yaml", "pyyaml (the web extra) is not installed")
    require_module("bcrypt", "bcrypt (the web extra) is not installed")
    from slurmhealth.errors import ConfigError
    from slurmhealth.metrics import web_config

    path = tmp_path / "web.yml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=error):
        web_config.load(str(path))


def test_requests_beyond_max_requests_get_503_and_are_counted() -> None:
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector

    release, entered = threading.Event(), threading.Event()

    class Slow(Collector):
        def collect(self) -> Iterator[GaugeMetricFamily]:
            entered.set()
            release.wait(30)
            yield GaugeMetricFamily("slurmhealth_test_slow", "a scrape that takes its time", 1)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Slow())
    mc = dataclasses.replace(MetricsConfig(), bind="127.0.0.1", port=0, max_requests=1)
    srv = listen(registry, mc)
    first = threading.Thread(target=_scrape, args=(srv,), daemon=True)
    try:
        first.start()
        assert entered.wait(10)
        with pytest.raises(urllib.error.HTTPError) as busy:
            _scrape(srv)
        assert busy.value.code == 503
        assert srv.counts.snapshot() == {"overloaded": 1}
    finally:
        release.set()
        first.join(10)
        srv.shutdown()
        srv.server_close()
