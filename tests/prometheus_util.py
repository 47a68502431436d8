"""Run Debian's Prometheus and promtool from tests: loopback only, stopped by pid."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.skips import unavailable

PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"


def require_tool(path: str) -> str:
    """Return ``path`` when it exists; skip the test, or fail it when ``CI`` is set."""
    if os.access(path, os.X_OK):
        return path
    unavailable(f"{path} is not installed (apt-get install prometheus)")


def promtool(
    *args: str, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``promtool ARGS`` (skipping or failing as :func:`require_tool` says)."""
    tool = require_tool(PROMTOOL)
    return subprocess.run(
        [tool, *args], input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _stopper(proc: subprocess.Popen[bytes]) -> Callable[[], None]:
    def stop() -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    return stop


def start_prometheus(
    tmp_path: Path, config_text: str, timeout: float = 30.0, extra_args: tuple[str, ...] = ()
) -> tuple[str, Callable[[], None]]:
    """Start Prometheus on 127.0.0.1 with ``config_text``; return ``(base_url, stop)``.

    Its data dir is ``tmp_path/tsdb`` (backfilled blocks placed there first are served).
    Waits until ``/-/ready`` answers. ``stop`` terminates the process by its pid (then kills
    it). Its log is ``tmp_path/prometheus.log``.
    """
    binary = require_tool(PROMETHEUS)
    config = tmp_path / "prometheus.yml"
    config.write_text(config_text)
    log_path = tmp_path / "prometheus.log"
    for _attempt in range(3):  # the free port may be taken between probe and bind
        port = _free_port()
        base_url = f"http://127.0.0.1:{port}"
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    "--log.level=warn",
                    *extra_args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=tmp_path,
            )
        stop = _stopper(proc)
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{base_url}/-/ready", timeout=1) as resp:
                    if resp.status == 200:
                        return base_url, stop
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        stop()
        if "address already in use" not in log_path.read_text(errors="replace"):
            break
    raise RuntimeError(
        f"prometheus did not become ready: {log_path.read_text(errors='replace')[-2000:]}"
    )


def query(base_url: str, promql: str, at: float | None = None) -> dict[str, Any]:
    """``GET /api/v1/query``; returns the JSON answer, also for errors (status "error")."""
    params = {"query": promql}
    if at is not None:
        params["time"] = repr(at)
    url = f"{base_url}/api/v1/query?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:  # 400/422 carry a JSON error body
        body = exc.read()
    answer: dict[str, Any] = json.loads(body)
    return answer


NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"


def free_port() -> int:
    return _free_port()


def answers(url: str) -> bool:
    """Whether ``url`` answers at all (a server that is up)."""
    try:
        urllib.request.urlopen(url, timeout=1).close()
    except OSError:
        return False
    return True


def get_text(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        text: str = resp.read().decode()
        return text


def start_node_exporter(
    tmp_path: Path, textfile_dir: Path, timeout: float = 30.0
) -> tuple[str, Callable[[], None]]:
    """Debian's node_exporter on 127.0.0.1 with only its textfile collector reading
    ``textfile_dir``; return ``(base_url, stop)``."""
    binary = require_tool(NODE_EXPORTER)
    log_path = tmp_path / "node_exporter.log"
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [binary, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
             "--collector.textfile", f"--collector.textfile.directory={textfile_dir}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    stop = _stopper(proc)
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            get_text(f"{base_url}/metrics", timeout=1)
            return base_url, stop
        except (urllib.error.URLError, OSError):
            time.sleep(0.05)
    stop()
    raise RuntimeError(f"node_exporter did not start: {log_path.read_text(errors='replace')}")
