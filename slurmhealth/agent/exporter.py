"""``slurmhealth exporter``: the node's one scrape target, on one fixed port.

A small long-running process (deploy/systemd/slurmhealth-exporter.service). On each scrape
it reads the node's state (history, fail-open log, sidecars) and every running job's series
from the sidecars' state files (:mod:`slurmhealth.metrics.export_state`), so Prometheus needs only
the node list. With ``metrics.textfile_dir`` it also (or only, with ``metrics.port = 0``)
rewrites ``slurmhealth.prom`` there every ``metrics.textfile_interval_s`` for
node_exporter's textfile collector.

The config is re-read at most every few seconds: a config that stops loading (a typo that
makes every hook fail open) shows as ``slurmhealth_config_valid 0`` while the exporter
carries on with the last config that loaded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from slurmhealth.config import Config
from slurmhealth.errors import ConfigError
from slurmhealth.metrics.export_state import Limits, merged, read_states, stale_after, write_atomic
from slurmhealth.metrics.exposition import render
from slurmhealth.metrics.http_server import listen
from slurmhealth.metrics.node import NodeFacts, node_families, read_fail_opens, read_history
from slurmhealth.sidecar.stopflag import StopFlag

log = logging.getLogger("slurmhealth.exporter")
TEXTFILE = "slurmhealth.prom"
RELOAD_S = 5.0


class ConfigWatch:
    """The config as ``load()`` builds it, at most ``every_s`` old; when it stops loading,
    the last good one (or ``fallback()``'s, or the defaults) and ``valid`` False."""

    def __init__(
        self,
        load: Callable[[], Config],
        every_s: float = RELOAD_S,
        fallback: Callable[[], Config] = Config,
    ) -> None:
        self._load, self._every, self._fallback = load, every_s, fallback
        self._cfg: Config | None = None
        self._valid = True
        self._at = -1e18
        self._lock = threading.Lock()

    def load(self) -> Config:
        """The config as it loads now (raises ConfigError), for the agent's hooks."""
        return self._load()

    def current(self) -> tuple[Config, bool]:
        with self._lock:
            if time.monotonic() - self._at >= self._every:
                self._at = time.monotonic()
                try:
                    self._cfg, self._valid = self._load(), True
                except ConfigError as exc:
                    if self._valid:
                        log.error("config does not load (hooks fail open): %s", exc)
                    self._valid = False
                    if self._cfg is None:
                        self._cfg = self._safe_fallback()
            return (self._cfg or Config()), self._valid

    def _safe_fallback(self) -> Config:
        try:
            return self._fallback()
        except ConfigError as exc:
            log.error("the environment's settings do not load either: %s", exc)
            return Config()


class NodeCollector(Collector):
    """Everything the node's endpoint serves, rebuilt on each scrape."""

    def __init__(self, configs: Callable[[], tuple[Config, bool]]) -> None:
        self._configs = configs

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        cfg, valid = self._configs()
        node = cfg.node_name
        run_dir = cfg.expand(cfg.paths.run_dir, node)
        mc = cfg.metrics
        limits = Limits(mc.max_jobs, mc.max_state_bytes, stale_after(cfg.sidecar.interval_s),
                        mc.final_linger_s)  # fmt: skip
        states = read_states(run_dir, limits=limits)
        for path in states.expired:  # a finished job's stats, served long enough
            with contextlib.suppress(OSError):
                os.unlink(path)
        if states.skipped:
            log.warning("%d state files skipped (unreadable, not root's, over limits)",
                        states.skipped)  # fmt: skip
        facts = NodeFacts(node, config_valid=valid)
        facts.sidecars = {
            "running": len(states.live),
            "dead": len(states.dead),
            "stale": len(states.stale),
        }
        read_history(facts, cfg.db_path(node))
        facts.fail_opens = read_fail_opens(cfg.expand(mc.fail_open_log, node))
        yield from node_families(facts)
        yield from merged([*states.live.values(), *states.finished.values()])


def registry_for(configs: Callable[[], tuple[Config, bool]]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(configs))
    return registry


def write_textfile(directory: str, body: bytes) -> None:
    """``directory/slurmhealth.prom`` replaced at once (node_exporter reads only ``*.prom``
    files, so it never sees the half-written one)."""
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_mode & 0o002:
        raise OSError(f"{directory}: not a directory, or writable by everyone")
    write_atomic(directory, TEXTFILE, body, mode=0o644)


def run(
    watch: ConfigWatch, *, once: bool = False, stop: StopFlag | None = None, agent: bool = False
) -> int:
    """Serve until SIGTERM (or ``stop``); ``once``: write the textfile (or print the
    exposition) once and return. ``agent``: also be the node agent (slurmhealth.agent)."""
    registry = registry_for(watch.current)
    cfg, _ = watch.current()
    mc = cfg.metrics
    textfile = cfg.expand(mc.textfile_dir) if mc.textfile_dir else ""
    if once:
        body = render(registry)
        if textfile:
            write_textfile(textfile, body)
        else:
            os.write(1, body)
        return 0
    stop = stop or StopFlag()
    stop.on_signals(signal.SIGTERM, signal.SIGINT)
    # bounded: slurmhealth/metrics/http_server.py
    server = listen(registry, mc) if mc.port else None
    node_agent = _start_agent(watch) if agent else None
    log.info("exporter for node %s: port %s, textfile dir %r", cfg.node_name,
             mc.port or "none", textfile)  # fmt: skip
    try:
        while not stop.is_set():
            if textfile:
                try:
                    write_textfile(textfile, render(registry))
                except OSError as exc:
                    log.warning("%s/%s not written: %s", textfile, TEXTFILE, exc)
            stop.wait(mc.textfile_interval_s if textfile else 3600.0)
    finally:
        if node_agent is not None:
            node_agent.stop()
        if server is not None:
            server.shutdown()
            server.server_close()
        if textfile:  # stale series must not outlive the exporter
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(textfile, TEXTFILE))
    return 0


def _start_agent(watch: ConfigWatch) -> Any:
    """The node agent beside the endpoint; None when it cannot serve (logged)."""
    from slurmhealth.agent.server import Agent

    node_agent = Agent(watch.current, load=watch.load)
    try:
        return node_agent if node_agent.start() else None
    except OSError as exc:
        log.error("node agent not started: %s (the hooks check in-process)", exc)
        return None
