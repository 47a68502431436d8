"""Capture a job's evidence bundle before the proof is gone (``slurmhealth evidence capture``).

Every source registered in ``evidence/registry.py`` (NVML dump, ``nvidia-smi -q``, kernel
log, NCCL debug files, the job's output, its history rows, Python stacks, ``scontrol show``,
the RDMA ports and tools) runs in its own thread under its own timeout and byte cap
(``[evidence]`` config); the capture stops waiting at ``budget_s`` whatever the sources do,
writes what it has, marks what was cut, and lists every file with its sha256 in
``manifest.json`` and in the history's ``evidence`` table.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slurmhealth.evidence import bundle
from slurmhealth.evidence.registry import Request, Task, plan
from slurmhealth.evidence.summary import write_summary
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


def _entries(tasks: list[Task], now: float) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
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
    planned = plan(Request(job, node_cfg, window, stdout_path, stderr_path, tuple(pids)))
    tasks, skipped = planned.tasks, planned.skipped
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


def _run(tasks: list[Task], t0: float, budget_s: float) -> None:
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
