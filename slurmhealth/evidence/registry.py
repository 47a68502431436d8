"""The evidence sources, registered once each as the checks are (``checks/engine.py``).

A source is a planner registered with :func:`source`: for one capture's :class:`Request`
it adds the files it will write (:meth:`Plan.add`: a reader, its byte cap and timeout) or
says why it cannot run on this node (:meth:`Plan.skip`, listed in the manifest's
``skipped``). :func:`plan` asks every source in registration order, which is the order of
the manifest. The capture (``evidence/capture.py``) runs the tasks, each in its own thread
under its own deadline.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from slurmhealth.access.user_open import Rights
from slurmhealth.evidence.kernel import kernel_excerpt
from slurmhealth.evidence.sources import (
    Sink,
    find_py_spy,
    history_rows,
    into_task,
    py_spy_dumps,
    rdma_sources,
    run_command,
    tail_file,
)
from slurmhealth.evidence.user_files import UserFiles, copy_user_files
from slurmhealth.model_records import Job

if TYPE_CHECKING:
    from slurmhealth.config import Config

Reader = Callable[["Task", float], None]  # run(task, deadline): writes into task.out()


@dataclass
class Task:
    """One file (or a few: ``nccl/<name>``) a source writes, under its cap and timeout."""

    source: str
    name: str  # the file it writes (a task may add more: nccl/<name>)
    fn: Reader
    cap: int
    timeout_s: float
    outputs: dict[str, Sink] = field(default_factory=dict)
    skip: str | None = None
    started: float = 0.0
    elapsed: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def out(self, name: str | None = None) -> Sink:
        with self.lock:
            return self.outputs.setdefault(name or self.name, Sink(self.cap))

    def run(self, deadline: float) -> None:
        self.started = time.monotonic()
        try:
            self.fn(self, min(deadline, self.started + self.timeout_s))
        except Exception as exc:  # a source never breaks the capture
            self.out().fail(f"{type(exc).__name__}: {exc}")
        self.elapsed = time.monotonic() - self.started


@dataclass(frozen=True)
class Request:
    """One capture: the job, what the caller handed over, and what its sources share."""

    job: Job
    cfg: Config
    window: tuple[float, float]
    stdout_path: str | None = None
    stderr_path: str | None = None
    pids: Sequence[int] = ()
    driver: dict[str, str | None] = field(default_factory=dict)
    nvml_done: threading.Event = field(default_factory=threading.Event)

    @property
    def rights(self) -> Rights | None:
        """The job's user's rights, for every path under the user's folders."""
        return None if self.job.uid is None else Rights.of(self.job.uid, self.job.user)


@dataclass
class Plan:
    """What the sources planned for one request: the tasks, and the sources skipped."""

    req: Request
    tasks: list[Task] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def add(self, source: str, name: str, fn: Reader, timeout_s: float = 0.0) -> None:
        ev = self.req.cfg.evidence
        self.tasks.append(Task(source, name, fn, ev.source_max_bytes,
                               timeout_s or ev.source_timeout_s))  # fmt: skip

    def skip(self, source: str, why: str) -> None:
        self.skipped[source] = why


Planner = Callable[[Plan], None]
SOURCES: dict[str, Planner] = {}


def source(name: str) -> Callable[[Planner], Planner]:
    """Register ``name``'s planner (a name registered twice is a programming error)."""

    def register(fn: Planner) -> Planner:
        if name in SOURCES:
            raise ValueError(f"evidence source {name!r} registered twice")
        SOURCES[name] = fn
        return fn

    return register


def plan(req: Request) -> Plan:
    """Every registered source's tasks for ``req``, in registration order."""
    out = Plan(req)
    for planner in SOURCES.values():
        planner(out)
    return out


def command(argv: list[str]) -> Reader:
    """``argv``'s output (stdout and stderr together) as a reader."""
    return into_task(functools.partial(run_command, argv))


# -- the sources, in the manifest's order ----------------------------------------------------


@source("nvml")
def _nvml(p: Plan) -> None:
    p.add("nvml", "nvml.json", lambda t, d: _nvml_dump(p.req, t, d))


def _nvml_dump(req: Request, task: Task, deadline: float) -> None:
    from slurmhealth.gpu import open_backend

    try:
        cfg = req.cfg
        timeout = max(0.1, min(cfg.gpu.snapshot_timeout_s, deadline - time.monotonic()))
        cfg = dataclasses.replace(cfg, gpu=dataclasses.replace(cfg.gpu, snapshot_timeout_s=timeout))
        backend = open_backend(cfg)
        try:
            snap = backend.snapshot(list(req.job.gpus) or None)
        finally:
            backend.close()
        req.driver["driver_version"] = snap.driver_version
        req.driver["nvml_version"] = snap.nvml_version
        data = json.dumps(dataclasses.asdict(snap), indent=1, default=str) + "\n"
        if not task.out().write(data.encode()):
            task.out().fail(f"NVML dump over {task.cap} bytes; cut")
        if snap.error:
            task.out().fail(snap.error)
    finally:
        req.nvml_done.set()


@source("nvidia-smi")
def _nvidia_smi(p: Plan) -> None:
    ev = p.req.cfg.evidence
    smi = shutil.which(ev.nvidia_smi)
    if not smi:
        p.skip("nvidia-smi", f"{ev.nvidia_smi} not found")
        return
    p.add("nvidia-smi", "nvidia-smi-q.txt", command([smi, "-q"]))
    p.add("nvidia-smi-nvlink", "nvidia-smi-nvlink.txt", command([smi, "nvlink", "-s", "-e"]))


@source("kernel")
def _kernel(p: Plan) -> None:
    p.add("kernel", "kernel.log", lambda t, d: _kernel_excerpt(p.req, t, d))


def _kernel_excerpt(req: Request, task: Task, deadline: float) -> None:
    cfg = req.cfg
    where = cfg.kernel_log.source
    if where == "auto":
        where = "kmsg"
        if cfg.gpu.backend == "sim":
            from slurmhealth.gpu import open_backend

            backend = open_backend(cfg)
            where = backend.kernel_log_hint or where
            backend.close()
    if where == "none":
        task.skip = "kernel_log.source is none"
        return
    start, end = req.window
    kernel_excerpt(where, task.out(), deadline, start, end, cfg.evidence.kernel_pattern)


@source("nccl")
def _nccl(p: Plan) -> None:
    ev = p.req.cfg.evidence
    spec = UserFiles("NCCL debug", "evidence.nccl_globs", ev.nccl_globs, "nccl",
                     ev.nccl_max_files, ev.nccl_tail_kib * 1024)  # fmt: skip
    p.add("nccl", "nccl.txt", lambda t, d: copy_user_files(p.req.job, p.req.rights, t, d, spec))


@source("user-supplied")
def _dropped(p: Plan) -> None:
    """The job's drop folder (``evidence.drop_globs``): what the job's user chose to add,
    copied into ``user/`` and marked ``user-supplied`` in the manifest."""
    ev = p.req.cfg.evidence
    if not ev.drop_globs:
        return
    spec = UserFiles("user-supplied", "evidence.drop_globs", ev.drop_globs, "user",
                     ev.drop_max_files, ev.drop_kib * 1024)  # fmt: skip
    p.add("user-supplied", "user.txt",
          lambda t, d: copy_user_files(p.req.job, p.req.rights, t, d, spec))  # fmt: skip


@source("output")
def _outputs(p: Plan) -> None:
    """The tails of the job's stdout and stderr, read with the job's user's rights."""
    req = p.req
    nbytes = req.cfg.evidence.output_tail_kib * 1024
    for stream, path in (("stdout", req.stdout_path), ("stderr", req.stderr_path)):
        if not path:
            p.skip(stream, "no path given")
            continue

        def run(task: Task, deadline: float, path: str = path) -> None:
            tail_file(path, task.out(), nbytes, req.job.uid, req.rights)

        p.add(stream, f"{stream}.tail", run)


@source("history")
def _history(p: Plan) -> None:
    """The job's samples and events rows from the node's history."""
    req = p.req
    db = req.cfg.db_path(req.job.node)
    for table in ("samples", "events"):

        def run(task: Task, deadline: float, table: str = table) -> None:
            history_rows(db, table, req.job.job_id, req.job.node, task.out(), deadline)

        p.add(table, f"{table}.jsonl", run)


@source("stacks")
def _stacks(p: Plan) -> None:
    """py-spy dumps of the job's processes the caller named, one timeout each."""
    ev, pids = p.req.cfg.evidence, p.req.pids
    py_spy = find_py_spy(ev.py_spy)
    if not pids:
        p.skip("stacks", "no pids given")
    elif not py_spy:
        p.skip("stacks", f"{ev.py_spy} not installed")
    else:
        p.add("stacks", "stacks.txt",
              lambda t, d: py_spy_dumps(py_spy, pids, t.out(), ev.source_timeout_s, d),
              ev.source_timeout_s * len(pids))  # fmt: skip


@source("slurm")
def _slurm(p: Plan) -> None:
    ev, job = p.req.cfg.evidence, p.req.job
    scontrol = shutil.which(ev.scontrol)
    if not scontrol:
        p.skip("slurm", f"{ev.scontrol} not found")
        return
    p.add("slurm-job", "slurm-job.txt", command([scontrol, "show", "job", "-o", job.job_id]))
    p.add("slurm-node", "slurm-node.txt", command([scontrol, "show", "node", "-o", job.node]))


@source("host")
def _host(p: Plan) -> None:
    p.add("host", "host.txt", lambda t, d: _host_facts(p.req, t, d))


def _host_facts(req: Request, task: Task, deadline: float) -> None:
    req.nvml_done.wait(max(0.0, deadline - time.monotonic()))
    lines = [f"driver_version: {req.driver.get('driver_version') or 'unknown'}",
             f"nvml_version: {req.driver.get('nvml_version') or 'unknown'}",
             "uname -a: " + " ".join(os.uname())]  # fmt: skip
    for label, path in (("uptime", "/proc/uptime"), ("loadavg", "/proc/loadavg"),
                        ("nvidia driver", "/proc/driver/nvidia/version")):  # fmt: skip
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                lines.append(f"{label}: {fh.read(4096).strip()}")
        except OSError:
            continue
    task.out().write(("\n".join(lines) + "\n").encode())


@source("rdma")
def _rdma(p: Plan) -> None:
    for name, file, fn in rdma_sources(p.req.cfg, p.req.job.node, p.skipped):
        p.add(name, file, fn)
