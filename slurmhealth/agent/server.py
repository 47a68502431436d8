"""The node agent: a root-only Unix socket in the node's run dir, answering the prolog's and
the epilog's thin client (slurmhealth.agent.client) with the same decision the in-process
hook makes (:func:`slurmhealth.hooks.prolog.run_hook`), over adapters that stay open:

- the GPU library, opened once (re-opened when the config's GPU settings change), and one
  snapshot of all the node's GPUs shared by every prolog within ``MAX_AGE_S`` (a burst of
  job starts reads NVML once; the agent's log names the snapshot each job was judged on);
- the node's jobs as one ``squeue -w NODE`` lists them (:class:`NodeJobs`), refreshed once
  for every prolog that arrived before it: on Slurm 22.05, whose prolog gets no account or
  QOS, a burst costs one Slurm call, not one per job;
- the epilog's after-work (hooks/finish.py) in one worker thread; at start it finishes what
  a killed agent or epilog worker left in the journal.

Peers are checked by SO_PEERCRED: only root (and the agent's own uid) may talk to it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from slurmhealth.agent import protocol
from slurmhealth.agent.views import MAX_AGE_S, NodeJobs, SharedGpu
from slurmhealth.config import Config

log = logging.getLogger("slurmhealth.agent")
MAX_CLIENTS = 64  # hooks connected at once; more are refused (their clients fall back)
WORKERS = 4  # hooks decided at once; the others wait, acknowledged, for a turn
REQUEST_S = 2.0  # to read a request once connected


class _Capture(logging.Handler):
    """The log lines of one request's thread, formatted as the hooks format theirs, for the
    client to print (they end up in slurmd's log as today's)."""

    def __init__(self, fmt: str) -> None:
        super().__init__(logging.INFO)
        self.thread = threading.get_ident()
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter(fmt))

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread == self.thread and record.name.startswith("slurmhealth.")

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.lines.append(self.format(record))


@contextlib.contextmanager
def _captured(op: str, job: str, node: str) -> Iterator[_Capture]:
    handler = _Capture(f"slurmhealth {op}[job={job} node={node}]: %(levelname)s: %(message)s")
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


class Agent:
    """Start with :meth:`start` (False: another agent owns the socket), stop with
    :meth:`stop`. ``configs`` gives the current config (the exporter's ConfigWatch)."""

    def __init__(
        self,
        configs: Callable[[], tuple[Config, bool]],
        snapshot_max_age_s: float = MAX_AGE_S,
        load: Callable[[], Config] | None = None,
    ) -> None:
        self._configs = configs
        # a hook's config, read for it as the in-process hook would (a typo saved a second
        # ago fails the hook open, and counts, as before): ConfigError when it does not load
        self._load = load
        self._sock: socket.socket | None = None
        self._path = ""
        self._stopping = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)
        # the ack goes out before a hook waits for a turn: a burst's clients all hear from
        # the agent within the ack bound, however long the queue of decisions
        self._work = threading.BoundedSemaphore(WORKERS)
        self._finish: queue.Queue[str | None] = queue.Queue()
        self._gpu = SharedGpu(max_age_s=snapshot_max_age_s)
        self._jobs = NodeJobs()
        self._threads: list[threading.Thread] = []
        # history path -> (its inode, history.hold_open's connection to it)
        self._held: dict[str, tuple[int, Any]] = {}
        self._held_lock = threading.Lock()

    @property
    def path(self) -> str:
        return self._path

    @property
    def snapshots_taken(self) -> int:
        """NVML reads made for the hooks so far."""
        return self._gpu.taken

    def start(self) -> bool:
        from slurmhealth.history import History

        cfg, _ = self._configs()
        _migrate_history(cfg)  # a daemon's start, outside any prolog: hooks never spool for it
        History.defer_migrations = True  # as in every hook: never migrate inside a prolog
        ours = logging.getLogger("slurmhealth")  # the hooks' INFO lines reach their client
        ours.setLevel(min(ours.getEffectiveLevel(), logging.INFO))
        run_dir = cfg.expand(cfg.paths.run_dir, cfg.node_name)
        os.makedirs(run_dir, mode=0o755, exist_ok=True)
        self._path = protocol.socket_path(run_dir)
        if _live(self._path):
            log.error("another agent answers on %s: this one does not serve", self._path)
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path)  # a dead agent's
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket is 0600 from its first moment
        try:
            sock.bind(self._path)
        finally:
            os.umask(old)
        sock.listen(MAX_CLIENTS)
        self._sock = sock
        for target, name in ((self._serve, "agent-accept"), (self._finisher, "agent-finish")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        self._finish.put("")  # "": every pending journal entry (a killed agent's, a worker's)
        log.info("node agent for %s on %s", cfg.node_name, self._path)
        return True

    def stop(self) -> None:
        self._stopping.set()
        self._finish.put(None)
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path)
        for thread in self._threads:
            thread.join(timeout=5.0)
        self._gpu.close()
        with self._held_lock:
            for _ino, held in self._held.values():
                held.close()  # the last one: SQLite checkpoints the WAL, off any job's path
            self._held.clear()

    def _hold(self, path: str) -> None:
        """Keep the node history ``path`` open for the agent's life (history.hold_open):
        a hook's close is then not the last one, which checkpoints the WAL with an fsync
        (5-15 ms of each job start on an idle node)."""
        from slurmhealth.history import hold_open

        try:
            ino = os.stat(path).st_ino
        except OSError:
            return
        with self._held_lock:
            if path in self._held and self._held[path][0] == ino:
                return
            if path in self._held:  # replaced (a corrupt one moved aside): hold the new one
                self._held.pop(path)[1].close()
            if (held := hold_open(path)) is not None:
                self._held[path] = (ino, held)

    # -- connections ---------------------------------------------------------------------
    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                time.sleep(0.05)
                continue
            if not self._slots.acquire(blocking=False):
                with contextlib.suppress(OSError):
                    protocol.send(conn, {"error": "busy"})
                conn.close()
                continue
            threading.Thread(target=self._connection, args=(conn,), daemon=True,
                             name="agent-hook").start()  # fmt: skip

    def _connection(self, conn: socket.socket) -> None:
        try:
            with conn:
                if protocol.peer_uid(conn) not in (0, os.geteuid()):
                    log.warning("a process of uid %d was refused", protocol.peer_uid(conn))
                    protocol.send(conn, {"error": "not allowed"})
                    return
                request = protocol.LineReader(conn).read(time.monotonic() + REQUEST_S)
                self._answer(conn, request)
        except (OSError, protocol.ProtocolError) as exc:
            log.warning("a hook's connection ended: %s", exc)
        except Exception as exc:  # one bad request never stops the agent
            log.error("request failed: %s: %s", type(exc).__name__, exc, exc_info=True)
        finally:
            self._slots.release()

    def _answer(self, conn: socket.socket, request: dict[str, Any]) -> None:
        op, env = request.get("op"), request.get("env")
        version = request.get("v")
        if not isinstance(version, int) or version > protocol.VERSION:
            protocol.send(conn, {"error": "version", "accepts": protocol.VERSION})
            return
        if op == "ping":
            protocol.send(conn, {"ack": True, "answer_within_s": 1.0})
            protocol.send(conn, {"exit_code": 0, "pid": os.getpid(), "snapshots": self._gpu.taken})
            return
        if op not in ("prolog", "epilog") or not isinstance(env, dict):
            protocol.send(conn, {"error": "unknown request"})
            return
        start_by = request.get("start_by")
        if isinstance(start_by, (int, float)) and time.time() > start_by:
            protocol.send(conn, {"error": "too late: the hook has fallen back"})
            return
        cfg, valid = self._configs()
        if self._load is not None:
            from slurmhealth.errors import ConfigError

            try:
                cfg = self._load()
            except ConfigError:
                valid = False
        if not valid:  # the in-process hook says why, and fails open
            protocol.send(conn, {"error": "the config does not load"})
            return
        env = {str(k): str(v) for k, v in env.items()}
        budget_s = cfg.slurm.prolog_budget_s + 1.0 if op == "prolog" else 60.0
        protocol.send(conn, {"ack": True, "answer_within_s": budget_s})
        with self._work:
            protocol.send(conn, self._hook(cfg, op, env))

    # -- the hooks -----------------------------------------------------------------------
    def _hook(self, cfg: Config, op: str, env: Mapping[str, str]) -> dict[str, Any]:
        from slurmhealth.hooks.job import job_from_env

        job = job_from_env(env, cfg.node_name)
        launch: dict[str, Any] = {}
        with _captured(op, job.job_id, job.node) as captured:
            try:
                result = self._run(cfg, op, env, job, launch)
            except Exception as exc:  # fail open, loudly, as the in-process hook does
                logging.getLogger("slurmhealth.hooks").error(
                    "%s: %s; failing open", type(exc).__name__, exc)  # fmt: skip
                return {"exit_code": 0, "status": "error", "log": captured.lines}
            drain = result.drain
            summary = f"{result.status}" + (f"; {drain.state}: {drain.reason}" if drain else "")
            logging.getLogger("slurmhealth.hooks").info("%s (node agent)", summary)
            answer = {"exit_code": result.exit_code, "status": result.status,
                      "log": captured.lines}  # fmt: skip
            return {**answer, "sidecar": launch} if launch else answer

    def _run(
        self, cfg: Config, op: str, env: Mapping[str, str], job: Any, launch: dict[str, Any]
    ) -> Any:
        from slurmhealth.history import History
        from slurmhealth.hooks.budget import prolog_budget
        from slurmhealth.hooks.inflight import InFlight
        from slurmhealth.hooks.prolog import Adapters, run_hook
        from slurmhealth.slurm import open_slurm

        slurm = open_slurm(cfg.slurm.backend, cfg.slurm.command_timeout_s)
        arrived = time.monotonic()
        marker = budget = None
        if op == "prolog":
            marker = InFlight(cfg.expand(cfg.paths.run_dir, job.node), job.job_id, job.node)
            budget = prolog_budget(cfg.slurm.prolog_budget_s, env, marker.stage)
            slurm = self._jobs.view(slurm, job.node, arrived)
        gpu = self._gpu.view(cfg, job.job_id, fresh=op == "epilog")
        history = History.for_node(cfg, job.node)

        def start_sidecar(cfg: Config, job: Any) -> int | None:
            from slurmhealth.sidecar.lifecycle import sidecar_launch

            try:  # the client starts it: in slurmd's session, not in this service's
                launch.update(sidecar_launch(cfg, job))
            except OSError as exc:
                log.warning("job %s: sidecar not started: %s", job.job_id, exc)
            return None

        finish = self._finish.put if op == "epilog" else None
        adapters = Adapters(slurm, gpu, history, finish, start_sidecar)
        try:
            return run_hook(cfg, job, env, op, adapters, budget)
        finally:
            self._hold(history.path)  # before the close: not the last connection then
            history.close()
            if marker is not None:
                marker.done()

    def _finisher(self) -> None:
        from slurmhealth.hooks.finish import finish, finish_pending

        while True:
            path = self._finish.get()
            if path is None:
                return
            cfg, _ = self._configs()
            try:
                if path:
                    log.info("after-work %s: %s", os.path.basename(path), finish(cfg, path))
                else:
                    for done, what in finish_pending(cfg, cfg.node_name).items():
                        log.info("pending %s finished: %s", os.path.basename(done), what)
            except Exception as exc:  # the entry stays for the next start
                log.error("after-work failed: %s: %s", type(exc).__name__, exc)


def _live(path: str) -> bool:
    """Whether an agent answers on ``path`` now."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(0.5)
    try:
        sock.connect(path)
    except OSError:
        return False
    finally:
        sock.close()
    return True


def serve_forever(configs: Callable[[], tuple[Config, bool]], stop: Any) -> int:
    """``slurmhealth agent``: the agent alone (no HTTP), until ``stop`` is set."""
    agent = Agent(configs)
    if not agent.start():
        return 1
    try:
        while not stop.is_set():
            stop.wait(3600.0)
    finally:
        agent.stop()
    return 0


def _migrate_history(cfg: Config) -> None:
    """Bring the node's history to this release's schema (backed up first, as every
    migration): the package's upgrade restarts the agent, so the hooks, which leave
    migrations alone, find it current; a failure is one warning and the hooks spool."""
    from slurmhealth.history import History

    if not os.path.exists(cfg.db_path(cfg.node_name)):
        return  # a new node: the first hook creates it at this release's schema
    try:
        with History.for_node(cfg, cfg.node_name) as history:
            history.connection()
    except Exception as exc:  # the agent serves all the same
        log.warning("history of %s not migrated at the agent's start: %s", cfg.node_name, exc)
