"""Capture a job's evidence bundle before the proof is gone (``slurmhealth evidence capture``).

Every source (NVML dump, ``nvidia-smi -q``, kernel log, NCCL debug files, the job's output,
its history rows, Python stacks, ``scontrol show``, the RDMA ports and tools) runs in its own
thread under its own timeout and byte cap (``[evidence]`` config); the capture stops waiting
at ``budget_s`` whatever the sources do, writes what it has, marks what was cut, and lists
every file with its sha256 in ``manifest.json`` and in the history's ``evidence`` table.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slurmhealth.access.user_open import Rights
from slurmhealth.evidence import bundle
from slurmhealth.evidence.kernel import kernel_excerpt
from slurmhealth.evidence.sources import (
    Sink,
    find_py_spy,
    history_rows,
    py_spy_dumps,
    rdma_sources,
    run_command,
    tail_file,
)
from slurmhealth.evidence.summary import write_summary
from slurmhealth.evidence.user_files import UserFiles, copy_user_files
from slurmhealth.model_records import Job

if TYPE_CHECKING:
    from slurmhealth.config import Config

__all__ = ["SCHEMA", "BundleResult", "capture", "write_summary"]

SCHEMA = bundle.SCHEMA


@dataclass(frozen=True)
class BundleResult:
    """What :func:`capture` wrote. ``files`` are the manifest entries."""

    dir: str
    files: tuple[Mapping[str, Any], ...]
    truncated: bool  # some source was cut at its size cap or its time limit
    elapsed_s: float
    skipped: Mapping[str, str] = field(default_factory=dict)  # source -> why it did not run
    recorded: bool = False  # the evidence rows reached the history (else spooled)
    notes: tuple[str, ...] = ()


@dataclass
class _Task:
    source: str
    name: str  # the file it writes (a task may add more: nccl/<name>)
    fn: Callable[[_Task, float], None]
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
class _Request:
    """One capture: the job, and what its sources share."""

    job: Job
    cfg: Config
    window: tuple[float, float]
    driver: dict[str, str | None] = field(default_factory=dict)
    nvml_done: threading.Event = field(default_factory=threading.Event)

    @property
    def rights(self) -> Rights | None:
        """The job's user's rights, for every path under the user's folders."""
        return None if self.job.uid is None else Rights.of(self.job.uid, self.job.user)


def _nvml(req: _Request, task: _Task, deadline: float) -> None:
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


def _kernel(req: _Request, task: _Task, deadline: float) -> None:
    cfg = req.cfg
    source = cfg.kernel_log.source
    if source == "auto":
        source = "kmsg"
        if cfg.gpu.backend == "sim":
            from slurmhealth.gpu import open_backend

            backend = open_backend(cfg)
            source = backend.kernel_log_hint or source
            backend.close()
    if source == "none":
        task.skip = "kernel_log.source is none"
        return
    start, end = req.window
    kernel_excerpt(source, task.out(), deadline, start, end, cfg.evidence.kernel_pattern)


def _nccl(req: _Request, task: _Task, deadline: float) -> None:
    ev = req.cfg.evidence
    spec = UserFiles("NCCL debug", "evidence.nccl_globs", ev.nccl_globs, "nccl",
                     ev.nccl_max_files, ev.nccl_tail_kib * 1024)  # fmt: skip
    copy_user_files(req.job, req.rights, task, deadline, spec)


def _dropped(req: _Request, task: _Task, deadline: float) -> None:
    """The job's drop folder (``evidence.drop_globs``): what the job's user chose to add,
    copied into ``user/`` and marked ``user-supplied`` in the manifest."""
    ev = req.cfg.evidence
    spec = UserFiles("user-supplied", "evidence.drop_globs", ev.drop_globs, "user",
                     ev.drop_max_files, ev.drop_kib * 1024)  # fmt: skip
    copy_user_files(req.job, req.rights, task, deadline, spec)


def _host(req: _Request, task: _Task, deadline: float) -> None:
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


def _tail(path: str, nbytes: int, req: _Request) -> Callable[[_Task, float], None]:
    def run(task: _Task, deadline: float) -> None:
        tail_file(path, task.out(), nbytes, req.job.uid, req.rights)

    return run


def _rows(db: str, table: str, req: _Request) -> Callable[[_Task, float], None]:
    def run(task: _Task, deadline: float) -> None:
        history_rows(db, table, req.job.job_id, req.job.node, task.out(), deadline)

    return run


def _plan(req: _Request, stdout_path: str | None, stderr_path: str | None,
          pids: Sequence[int]) -> tuple[list[_Task], dict[str, str]]:  # fmt: skip
    import shutil

    cfg, ev = req.cfg, req.cfg.evidence
    tasks: list[_Task] = []
    skipped: dict[str, str] = {}

    def add(source: str, name: str, fn: Callable[[_Task, float], None], t: float = 0.0) -> None:
        tasks.append(_Task(source, name, fn, ev.source_max_bytes, t or ev.source_timeout_s))

    def cmd(argv: list[str]) -> Callable[[_Task, float], None]:
        def run(task: _Task, deadline: float) -> None:
            run_command(argv, task.out(), deadline)

        return run

    add("nvml", "nvml.json", lambda t, d: _nvml(req, t, d))
    smi = shutil.which(ev.nvidia_smi)
    if smi:
        add("nvidia-smi", "nvidia-smi-q.txt", cmd([smi, "-q"]))
        add("nvidia-smi-nvlink", "nvidia-smi-nvlink.txt", cmd([smi, "nvlink", "-s", "-e"]))
    else:
        skipped["nvidia-smi"] = f"{ev.nvidia_smi} not found"
    add("kernel", "kernel.log", lambda t, d: _kernel(req, t, d))
    add("nccl", "nccl.txt", lambda t, d: _nccl(req, t, d))
    if ev.drop_globs:
        add("user-supplied", "user.txt", lambda t, d: _dropped(req, t, d))
    for source, path in (("stdout", stdout_path), ("stderr", stderr_path)):
        if not path:
            skipped[source] = "no path given"
            continue
        add(source, f"{source}.tail", _tail(path, ev.output_tail_kib * 1024, req))
    db = cfg.db_path(req.job.node)
    for table in ("samples", "events"):
        add(table, f"{table}.jsonl", _rows(db, table, req))
    py_spy = find_py_spy(ev.py_spy)
    if not pids:
        skipped["stacks"] = "no pids given"
    elif not py_spy:
        skipped["stacks"] = f"{ev.py_spy} not installed"
    else:
        add("stacks", "stacks.txt",
            lambda t, d: py_spy_dumps(py_spy, pids, t.out(), ev.source_timeout_s, d),
            ev.source_timeout_s * len(pids))  # fmt: skip
    scontrol = shutil.which(ev.scontrol)
    if scontrol:
        add("slurm-job", "slurm-job.txt", cmd([scontrol, "show", "job", "-o", req.job.job_id]))
        add("slurm-node", "slurm-node.txt", cmd([scontrol, "show", "node", "-o", req.job.node]))
    else:
        skipped["slurm"] = f"{ev.scontrol} not found"
    add("host", "host.txt", lambda t, d: _host(req, t, d))
    for source, name, fn in rdma_sources(cfg, req.job.node, skipped):
        add(source, name, fn)
    return tasks, skipped


def _entries(tasks: list[_Task], now: float) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    entries: list[dict[str, Any]] = []
    blobs: dict[str, bytes] = {}
    for task in tasks:
        running = task.elapsed is None
        if running:
            task.out()  # a source that never got to write still gets its (empty) file
        elif not task.outputs and task.skip:
            continue
        elapsed = (now - task.started) if running and task.started else (task.elapsed or 0.0)
        for name, sink in sorted(task.outputs.items()):
            if running:
                sink.time_out("did not finish within the capture budget")
            data = sink.close()
            blobs[name] = data
            entries.append({
                "name": name,
                "source": task.source,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "truncated": sink.truncated,
                "timed_out": sink.timed_out,
                "error": sink.error,
                "elapsed_s": round(elapsed, 3),
            })  # fmt: skip
    return entries, blobs


def capture(
    cfg: Config,
    job_id: str,
    node: str,
    *,
    reason: str,
    gpus: Sequence[int] = (),
    user: str = "",
    uid: int | None = None,
    start_ts: float | None = None,
    end_ts: float | None = None,
    stdout_path: str | None = None,
    stderr_path: str | None = None,
    pids: Sequence[int] = (),
    budget_s: float = 10.0,
) -> BundleResult:
    """Write ``<evidence_dir>/<job_id>/<node>/`` with one file per source and its manifest.

    Ends within ``budget_s`` (plus writing the files) whatever the sources do. Times are
    UTC seconds; ``start_ts``/``end_ts`` bound the kernel-log excerpt (plus
    ``evidence.kernel_margin_s``). Raises only for an unusable job id / node name or an
    evidence directory that cannot be written.
    """
    t0 = time.monotonic()
    created = time.time()
    path = bundle.bundle_path(cfg, job_id, node)
    window = _window(cfg, created, start_ts, end_ts)
    node_cfg = dataclasses.replace(cfg, node=dataclasses.replace(cfg.node, name=node))
    job = Job(job_id=job_id, node=node, gpus=tuple(gpus), user=user, uid=uid)
    tasks, skipped = _plan(_Request(job, node_cfg, window), stdout_path, stderr_path, pids)
    _run(tasks, t0, budget_s)
    entries, blobs = _entries(tasks, time.monotonic())
    skipped.update({t.source: t.skip for t in tasks if t.skip and not t.outputs})
    gid, note = bundle.admin_gid(cfg.evidence.admin_group)
    owner = bundle.Owner(uid, gid)
    with bundle.open_bundle(cfg, job_id, node, owner) as dir_fd:
        kept = _summary_entry(dir_fd)
        _write_blobs(dir_fd, blobs, owner)
        elapsed = time.monotonic() - t0
        truncated = any(e["truncated"] for e in entries)
        notes = tuple([note] if note else []) + tuple(owner.notes)
        manifest = {
            "schema": SCHEMA, "job_id": job_id, "node": node, "reason": reason,
            "created": created, "user": user, "uid": uid, "gpus": list(gpus),
            "window": list(window), "budget_s": budget_s, "elapsed_s": round(elapsed, 3),
            "truncated": truncated, "files": entries + kept, "skipped": skipped,
            "notes": list(notes),
        }  # fmt: skip
        data = (json.dumps(manifest, indent=1, default=str) + "\n").encode()
        bundle.write_file(dir_fd, bundle.MANIFEST, data, owner)
    manifest_entry = {"name": bundle.MANIFEST, "source": "manifest", "size": len(data),
                      "sha256": hashlib.sha256(data).hexdigest()}  # fmt: skip
    recorded = _record(cfg, job_id, node, path, [*entries, manifest_entry], t0 + budget_s)
    return BundleResult(path, tuple(entries), truncated, time.monotonic() - t0, skipped,
                        recorded, notes)  # fmt: skip


def _window(
    cfg: Config, created: float, start_ts: float | None, end_ts: float | None
) -> tuple[float, float]:
    """The kernel-log excerpt's bounds: the job's start (else ``kernel_log.lookback_s`` back)
    to its end (else now), widened by ``evidence.kernel_margin_s``."""
    margin = cfg.evidence.kernel_margin_s
    start = start_ts if start_ts is not None else created - cfg.kernel_log.lookback_s
    return start - margin, (end_ts if end_ts is not None else created) + margin


def _run(tasks: list[_Task], t0: float, budget_s: float) -> None:
    """Every source in its own thread; waits until ``budget_s`` less the writing reserve."""
    reserve = min(1.0, 0.1 * budget_s)  # time kept to write the files
    deadline = t0 + max(0.0, budget_s - reserve)
    threads = []
    for task in tasks:
        th = threading.Thread(target=task.run, args=(deadline,), daemon=True,
                              name=f"evidence-{task.source}")  # fmt: skip
        th.start()
        threads.append(th)
    for th in threads:  # sources stop themselves at the deadline: give them a moment to
        th.join(max(0.0, deadline + reserve / 3 - time.monotonic()))  # kill and reap


def _summary_entry(dir_fd: int) -> list[dict[str, Any]]:
    """The summary's entry of the manifest a new capture replaces (the summary stays)."""
    old = bundle.trusted_manifest(dir_fd)
    files: list[Any] = old["files"] if old else []
    return [e for e in files if isinstance(e, dict) and e.get("name") == bundle.SUMMARY]


def _write_blobs(dir_fd: int, blobs: dict[str, bytes], owner: bundle.Owner) -> None:
    """Each captured file into the bundle; ``nccl/rank0.log`` into its subfolder."""
    for name, data in blobs.items():
        sub, _, base = name.rpartition("/")
        if sub:
            sub_fd = bundle.subdir(dir_fd, sub, owner)
            try:
                bundle.write_file(sub_fd, base, data, owner)
            finally:
                os.close(sub_fd)
        else:
            bundle.write_file(dir_fd, name, data, owner)


def _record(
    cfg: Config, job_id: str, node: str, path: str, entries: list[dict[str, Any]], end: float
) -> bool:
    """One ``evidence`` row per file, in one batch (spooled when the history is busy)."""
    from slurmhealth.history import History, records, rows

    batch = records.batch(
        records.evidence(r) for r in rows.evidence_rows(time.time(), job_id, node, path, entries)
    )
    wait_ms = int(max(0.2, end - time.monotonic()) * 1000)
    with History.for_node(cfg, node, wait_ms) as h:
        return h.write(batch)
