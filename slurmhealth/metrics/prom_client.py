"""Prometheus' HTTP query API (``/api/v1/query``, ``/api/v1/query_range``): the one place
that speaks it. Answers come back as plain tuples; every failure (refused, slow, an HTTP
error, a query Prometheus rejects, an answer that is no API JSON) is one
:class:`PrometheusError` line naming the server. Queries go out as POST forms (a selector
naming 64 nodes stays out of the URL), each with Prometheus' own ``timeout`` so the server
stops work the client no longer waits for.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any

from slurmhealth.errors import PrometheusError

Labels = dict[str, str]
Vector = list[tuple[Labels, float]]
"""An instant query's answer: one (labels, value) per series; NaN stays NaN."""
Matrix = list[tuple[Labels, list[tuple[float, float]]]]
"""A range query's answer: one (labels, [(ts, value), ...]) per series."""

MAX_ANSWER_BYTES = 256 * 1024 * 1024  # one answer at most (a 64-node job's plots: ~20 MB)
MAX_PARALLEL = 4  # queries in flight at once (Prometheus runs 20; each takes a core)
Opener = Callable[..., Any]
Call = Callable[..., Any]  # one request, called with timeout_s= the seconds left


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class PromClient:
    """The query API of the Prometheus at ``url`` (its base URL); ``timeout_s`` bounds one
    request, and one :meth:`gather` (all its requests together) unless given a deadline."""

    def __init__(self, url: str, timeout_s: float, *, opener: Opener | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._open = opener or urllib.request.urlopen

    def query(self, expr: str, at: float, *, timeout_s: float | None = None) -> Vector:
        """``expr`` evaluated at ``at`` (UTC s): an instant vector (a scalar as one series)."""
        data = self._call("query", {"query": expr, "time": _ts(at)}, timeout_s)
        if data.get("resultType") == "scalar":
            return [({}, _value(data.get("result")))]
        return [(_labels(r), _value(r.get("value"))) for r in self._result(data, "vector")]

    def query_range(
        self, expr: str, start: float, end: float, step: float, *, timeout_s: float | None = None
    ) -> Matrix:
        """``expr`` at every ``step`` seconds from ``start`` to ``end``."""
        params = {"query": expr, "start": _ts(start), "end": _ts(end), "step": _ts(step)}
        return self._matrix(self._call("query_range", params, timeout_s))

    def query_samples(self, expr: str, at: float, *, timeout_s: float | None = None) -> Matrix:
        """The raw samples a range selector (``metric{...}[5m]``) holds at ``at``."""
        return self._matrix(self._call("query", {"query": expr, "time": _ts(at)}, timeout_s))

    def gather(self, calls: Mapping[str, Call], deadline: float | None = None) -> dict[str, Any]:
        """Run each named call (given the seconds left) :data:`MAX_PARALLEL` at a time, all
        before ``deadline`` (``time.monotonic()``; default ``timeout_s`` from now); the
        first failure is raised."""
        deadline = time.monotonic() + self.timeout_s if deadline is None else deadline
        if not calls:
            return {}
        pool = ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, len(calls))))
        try:
            futures = {
                name: pool.submit(self._bounded, call, deadline) for name, call in calls.items()
            }
            left = max(0.0, deadline - time.monotonic())
            done, pending = wait(futures.values(), left, return_when=FIRST_EXCEPTION)
            for fut in done:
                if (exc := fut.exception()) is not None:
                    raise exc
            if pending:
                raise self._error(f"no answer within {self.timeout_s:g} s")
            return {name: fut.result() for name, fut in futures.items()}
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _bounded(self, call: Call, deadline: float) -> Any:
        left = deadline - time.monotonic()
        if left <= 0:
            raise self._error(f"no answer within {self.timeout_s:g} s")
        return call(timeout_s=left)

    def _result(self, data: dict[str, Any], kind: str) -> list[dict[str, Any]]:
        result = data.get("result")
        if data.get("resultType") != kind or not isinstance(result, list):
            raise self._error(f"expected a {kind}, got {data.get('resultType')!r}")
        return [r for r in result if isinstance(r, dict)]

    def _matrix(self, data: dict[str, Any]) -> Matrix:
        out = []
        for r in self._result(data, "matrix"):
            try:  # the hot loop of a big answer: no call per point ("NaN" parses as NaN)
                points = [(float(ts), float(v)) for ts, v in r.get("values") or ()]
            except (TypeError, ValueError, IndexError, KeyError):
                raise self._error("a series' samples are no [time, value] pairs") from None
            out.append((_labels(r), points))
        return out

    def _error(self, problem: str) -> PrometheusError:
        return PrometheusError(f"prometheus {self.url}: {problem}")

    def _call(
        self, endpoint: str, params: dict[str, str], timeout_s: float | None
    ) -> dict[str, Any]:
        timeout = self.timeout_s if timeout_s is None else timeout_s
        form = urllib.parse.urlencode({**params, "timeout": f"{max(1, int(timeout * 1000))}ms"})
        request = urllib.request.Request(
            f"{self.url}/api/v1/{endpoint}",
            data=form.encode(),
            headers={"Content-Type": "application/x-www-form-urlencoded"},
            method="POST",
        )
        try:
            with self._open(request, timeout=timeout) as resp:
                body = resp.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as exc:  # 400/422/503 carry the API's JSON error
            raise self._error(f"HTTP {exc.code}: {_api_error(exc)}") from None
        except TimeoutError:
            raise self._error(f"no answer within {timeout:g} s") from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise self._error(f"no answer within {timeout:g} s") from None
            reason = getattr(exc.reason, "strerror", None) or exc.reason
            raise self._error(_one_line(str(reason))) from None
        except (OSError, ValueError) as exc:  # a reset connection, a malformed URL
            raise self._error(_one_line(str(exc) or type(exc).__name__)) from None
        if len(body) > MAX_ANSWER_BYTES:
            raise self._error(f"answer larger than {MAX_ANSWER_BYTES >> 20} MiB")
        return self._data(body)

    def _data(self, body: bytes) -> dict[str, Any]:
        try:
            answer = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise self._error("the answer is not JSON (is this Prometheus' address?)") from None
        if not isinstance(answer, dict) or answer.get("status") != "success":
            what = answer.get("error") if isinstance(answer, dict) else None
            raise self._error(_one_line(what or "the answer is no Prometheus API answer"))
        data = answer.get("data")
        if not isinstance(data, dict):
            raise self._error("the answer holds no data")
        return data


def _api_error(exc: urllib.error.HTTPError) -> str:
    try:
        answer = json.loads(exc.read(64 * 1024))
        return _one_line(f"{answer['errorType']}: {answer['error']}")
    except (ValueError, KeyError, TypeError, OSError, UnicodeDecodeError):
        return _one_line(exc.reason or "error")


def _ts(seconds: float) -> str:
    if not math.isfinite(seconds):
        raise PrometheusError(f"prometheus: time {seconds!r} is not a finite number")
    return f"{seconds:.3f}"


def _labels(r: dict[str, Any]) -> Labels:
    metric = r.get("metric")
    return {str(k): str(v) for k, v in metric.items()} if isinstance(metric, dict) else {}


def _value(pair: Any) -> float:
    """The value of a ``[ts, "value"]`` pair ("NaN", "+Inf" included); NaN when malformed."""
    try:
        return float(pair[1])
    except (TypeError, ValueError, IndexError):
        return math.nan
