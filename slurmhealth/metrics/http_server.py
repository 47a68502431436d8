"""The exporter's HTTP listener, bounded against any host that can reach the node.

A thread per connection (``ThreadingHTTPServer``) let 1,200 half-open requests grow the
exporter to a thousand threads and starve real scrapes. Here one thread reads every
connection's request head without blocking (``selectors``), each within
``header_timeout_s`` of its accept; at most ``max_connections`` connections are open (at
the cap the oldest one still sending its head is dropped for the new one, so a flood of
half-open connections cannot lock out a scrape); a complete request goes to a fixed pool
of ``workers`` threads, at most ``max_requests`` in flight (node_exporter's
``--web.max-requests``, 40 by default; beyond it: 503). Dropped and broken connections are
counted (:class:`Counts`, served as ``slurmhealth_exporter_http_dropped_total``), never a
traceback each. The request itself is parsed by the standard ``BaseHTTPRequestHandler``
(400/404/414/431/501 as before).
"""

from __future__ import annotations

import collections
import contextlib
import io
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from collections.abc import Iterator

    from slurmhealth.config.sections import MetricsConfig

log = logging.getLogger("slurmhealth.exporter")

MAX_HEAD = 70 << 10  # past the handler's 64 KiB request line, so it answers 414 itself
_BUSY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


@dataclass(frozen=True)
class Limits:
    header_timeout_s: float = 5.0  # the whole request head within this of the accept
    max_connections: int = 512  # open at once (stay under the usual 1024 file limit)
    max_requests: int = 40  # complete requests in flight (node_exporter's default)
    workers: int = 4  # threads that answer requests


class Counts:
    """Connections dropped, by reason: timeout, evicted, overloaded, broken, closed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.dropped: collections.Counter[str] = collections.Counter()
        self.accepted = 0

    def drop(self, reason: str) -> None:
        with self._lock:
            first = reason not in self.dropped
            self.dropped[reason] += 1
        if first:  # one line per reason for the process's life; the counter says the rest
            log.warning("HTTP connection dropped (%s); later ones only counted", reason)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.dropped)


class _Prefixed(io.RawIOBase):
    """The bytes already read by the selector thread, then the socket."""

    def __init__(self, prefix: bytes, sock: socket.socket) -> None:
        self._prefix, self._sock = memoryview(prefix), sock

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        if self._prefix:
            n = min(len(buf), len(self._prefix))
            buf[:n], self._prefix = self._prefix[:n], self._prefix[n:]
            return n
        return self._sock.recv_into(buf)


class _HeadRead(BaseHTTPRequestHandler):
    """Mixed in before the handler class: its request is (socket, the head already read);
    with basic auth configured, a request without the right credentials gets 401."""

    request: tuple[socket.socket, bytes]
    server: BoundedServer  # type: ignore[assignment]

    def setup(self) -> None:
        sock, head = self.request
        self.connection = sock
        self.rfile = io.BufferedReader(_Prefixed(head, sock))
        self.wfile = sock.makefile("wb", buffering=0)  # type: ignore[assignment]

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        auth = self.server.auth
        if auth is None or auth(self.headers.get("Authorization")):
            return True
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="slurmhealth"')
        self.send_header("Content-Length", "0")
        self.end_headers()
        return False


class _Conn:
    __slots__ = ("deadline", "head", "ready", "sock")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock, self.deadline, self.head = sock, deadline, bytearray()
        self.ready = not isinstance(sock, ssl.SSLSocket)  # TLS: after its handshake


class BoundedServer:
    """Serve ``handler`` (a ``BaseHTTPRequestHandler`` class) on ``address`` within
    ``limits``: ``serve_forever`` runs the selector loop, ``shutdown`` stops it (the
    interface of ``socketserver``'s servers that the exporter uses)."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        limits: Limits,
        tls: ssl.SSLContext | None = None,
        auth: Callable[[str | None], bool] | None = None,
    ) -> None:
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.socket.bind(address)
            self.socket.listen(min(socket.SOMAXCONN, 1024))
        except OSError:
            self.socket.close()
            raise
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        self._handler = type(handler.__name__, (_HeadRead, handler), {})
        self.limits, self.tls, self.auth = limits, tls, auth
        self.counts = Counts()
        self._pool = ThreadPoolExecutor(max(1, limits.workers), thread_name_prefix="http")
        self._inflight = threading.Semaphore(max(1, limits.max_requests))
        self._conns: collections.OrderedDict[socket.socket, _Conn] = collections.OrderedDict()
        self._stop = threading.Event()
        self._done = threading.Event()

    def serve_forever(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.socket, selectors.EVENT_READ, None)
        try:
            while not self._stop.is_set():
                for key, _mask in sel.select(self._wait()):
                    if key.data is None:
                        self._accept(sel)
                    else:
                        self._read(sel, key.data)
                self._expire(sel)
        finally:
            for conn in list(self._conns.values()):
                self._close(sel, conn)
            sel.close()
            self._done.set()

    def _wait(self) -> float:
        if not self._conns:
            return 0.5
        oldest = next(iter(self._conns.values()))
        return max(0.0, min(0.5, oldest.deadline - time.monotonic()))

    def _accept(self, sel: selectors.BaseSelector) -> None:
        for _ in range(256):
            try:
                sock, _addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of file descriptors: the oldest pending one makes room
                if not self._evict(sel):
                    return
                continue
            if len(self._conns) >= self.limits.max_connections:
                self._evict(sel)
            sock.setblocking(False)
            if self.tls is not None:  # the handshake, too, within the head's deadline
                sock = self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
            conn = _Conn(sock, time.monotonic() + self.limits.header_timeout_s)
            self._conns[sock] = conn
            self.counts.accepted += 1
            sel.register(sock, selectors.EVENT_READ, conn)

    def _evict(self, sel: selectors.BaseSelector) -> bool:
        if not self._conns:
            return False
        self.counts.drop("evicted")
        self._close(sel, next(iter(self._conns.values())))
        return True

    def _read(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        try:
            if not conn.ready:
                conn.sock.do_handshake()  # type: ignore[attr-defined]  # an SSLSocket
                conn.ready = True
                sel.modify(conn.sock, selectors.EVENT_READ, conn)
            data = conn.sock.recv(16384)
        except ssl.SSLWantWriteError:
            sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
            return
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
            sel.modify(conn.sock, selectors.EVENT_READ, conn)
            return
        except OSError:
            self.counts.drop("broken")  # counted before the peer sees the close
            self._close(sel, conn)
            return
        if not data:
            self.counts.drop("closed")  # counted before the peer sees the close
            self._close(sel, conn)
            return
        conn.head += data
        if b"\r\n\r\n" in conn.head or b"\n\n" in conn.head or len(conn.head) > MAX_HEAD:
            sel.unregister(conn.sock)
            del self._conns[conn.sock]
            self._dispatch(conn)

    def _expire(self, sel: selectors.BaseSelector) -> None:
        now = time.monotonic()
        while self._conns:
            conn = next(iter(self._conns.values()))
            if conn.deadline > now:
                return
            self.counts.drop("timeout")  # counted before the peer sees the close
            self._close(sel, conn)

    def _close(self, sel: selectors.BaseSelector, conn: _Conn) -> None:
        self._conns.pop(conn.sock, None)
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(conn.sock)
        conn.sock.close()

    def _dispatch(self, conn: _Conn) -> None:
        if not self._inflight.acquire(blocking=False):
            self.counts.drop("overloaded")  # counted before the peer sees the answer
            with contextlib.suppress(OSError):
                conn.sock.send(_BUSY)
            conn.sock.close()
            return
        self._pool.submit(self._answer, conn.sock, bytes(conn.head), conn.deadline)

    def _answer(self, sock: socket.socket, head: bytes, deadline: float) -> None:
        try:
            sock.settimeout(max(0.5, deadline - time.monotonic()))
            self._handler((sock, head), sock.getpeername(), self)
        except Exception:  # a broken or hostile connection: counted, no traceback
            self.counts.drop("broken")
        finally:
            with contextlib.suppress(OSError):
                sock.close()
            self._inflight.release()

    def shutdown(self) -> None:
        self._stop.set()
        self._done.wait(5.0)

    def server_close(self) -> None:
        self.socket.close()
        self._pool.shutdown(wait=False, cancel_futures=True)


class _DroppedCollector(Collector):
    def __init__(self, counts: Counts) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        fam = CounterMetricFamily("slurmhealth_exporter_http_dropped",
                                  "HTTP connections the exporter dropped, by reason",
                                  labels=["reason"])  # fmt: skip
        for reason, n in sorted(self._counts.snapshot().items()):
            fam.add_metric([reason], n)
        yield fam


def listen(registry: CollectorRegistry, mc: MetricsConfig) -> BoundedServer:
    """The exporter's ``/metrics`` on ``metrics.bind``:``metrics.port`` within the
    ``[metrics]`` limits, with TLS and basic auth when ``metrics.web_config_file`` names a
    web config (:mod:`slurmhealth.metrics.web_config`), served from a daemon thread; its drops
    join ``registry``. Raises ConfigError for a web config that does not load."""
    from slurmhealth.metrics import web_config
    from slurmhealth.metrics.exposition import metrics_handler

    limits = Limits(mc.header_timeout_s, mc.max_connections, mc.max_requests, mc.http_workers)
    web = web_config.load(mc.web_config_file) if mc.web_config_file else web_config.WebConfig()
    server = BoundedServer((mc.bind, mc.port), metrics_handler(registry), limits, web.tls,
                           web_config.checker(web))  # fmt: skip
    registry.register(_DroppedCollector(server.counts))
    threading.Thread(target=server.serve_forever, daemon=True, name="metrics").start()
    return server
