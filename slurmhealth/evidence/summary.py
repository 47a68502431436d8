"""A node's ``summary.json``: what its history knows about a job, for ``slurmhealth report``.

Cheap (the job's rows and its GPUs' rollups from the history, O(GPUs x buckets) however
long the job ran: 0.2 s for 30 days of 8 GPUs; a few small file reads): the epilog writes
it for every job, the full capture only when the job failed or showed findings or events.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from slurmhealth.evidence import bundle

if TYPE_CHECKING:
    from slurmhealth.config import Config
    from slurmhealth.diagnose.facts import NodeFacts

# summary log key -> files of the bundle it is read from (``nccl/`` = every NCCL file)
LOG_FILES: dict[str, tuple[str, ...]] = {
    "stderr": ("stderr.tail",),
    "nccl": ("nccl/",),
    "kernel": ("kernel.log",),
    "stacks": ("stacks.txt",),
}


def _text(data: bytes, cap: int) -> str:
    return data[-cap:].decode("utf-8", "replace")


def bundle_logs(dir_fd: int, cap: int) -> dict[str, str]:
    """Tails (at most ``cap`` bytes each) of the bundle's logs, for :class:`NodeFacts`."""
    logs: dict[str, str] = {}
    for key, names in LOG_FILES.items():
        for name in names:
            if not name.endswith("/"):
                data = bundle.read_tail(dir_fd, name, cap)
                if data:
                    logs[key] = _text(data, cap)
                continue
            with bundle.open_existing(name.rstrip("/"), dir_fd) as sub:
                if sub is None:
                    continue
                parts = []
                for entry in sorted(os.listdir(sub)):
                    data = bundle.read_tail(sub, entry, cap)
                    if data:
                        parts.append(f"==> {entry} <==\n".encode() + data)
                if parts:
                    logs[key] = _text(b"\n".join(parts), cap)
    return logs


def bundle_nccl(dir_fd: int, cap: int) -> dict[str, Any]:
    """The NCCL reader's facts (:func:`slurmhealth.diagnose.nccl_log.read_facts`) of the bundle's
    NCCL files, each read up to ``cap`` bytes (their channel lines are at the start, which
    the summary's tail leaves out); {} without NCCL files."""
    from slurmhealth.diagnose.nccl_log import read_facts

    texts = []
    with bundle.open_existing("nccl", dir_fd) as sub:
        if sub is None:
            return {}
        for entry in sorted(os.listdir(sub)):
            if data := bundle.read_tail(sub, entry, cap):
                texts.append(data.decode("utf-8", "replace"))
    lines = (line for text in texts for line in text.splitlines())
    return read_facts(lines).to_dict() if texts else {}


class Written(NamedTuple):
    path: str  # the summary.json written
    summary: dict[str, Any]  # what it holds (NodeFacts.to_dict())


def node_summary(
    cfg: Config, job_id: str, node: str, logs: Mapping[str, str] | None
) -> tuple[NodeFacts, int | None]:
    """The node's facts about the job (empty when its history cannot be read) and the
    job's uid from the history's ``jobs`` row."""
    from slurmhealth.diagnose.facts import NodeFacts
    from slurmhealth.history.read import Reader, StoreError, owner_uid
    from slurmhealth.summary import collect

    path = cfg.db_path(node)
    if not os.path.exists(path):
        return NodeFacts(node=node, logs=dict(logs or {})), None
    try:
        with Reader(path) as db:
            return collect.node_facts(db, job_id, node, logs), owner_uid(db, job_id)
    except StoreError:
        return NodeFacts(node=node, logs=dict(logs or {})), None


def write_summary(
    cfg: Config,
    job_id: str,
    node: str,
    *,
    logs: Mapping[str, str] | None = None,
    bundle_dir: str | None = None,
    uid: int | None = None,
) -> Written:
    """Write ``<evidence_dir>/<job_id>/<node>/summary.json`` (``NodeFacts.to_dict()``) with
    the bundle's permissions and its sha256 in the bundle's manifest (a new one listing
    only the summary when no bundle was captured); return its path and what it holds.
    ``logs`` default: tails of the bundle's stderr, NCCL, kernel and stack files,
    ``evidence.summary_log_kib`` each.
    ``uid`` default: the ``jobs`` row's."""
    path = bundle_dir or bundle.bundle_path(cfg, job_id, node)
    cap = cfg.evidence.summary_log_kib * 1024
    have_manifest = False
    nccl: dict[str, Any] = {}
    with bundle.open_existing(path) as fd:
        if fd is not None:
            have_manifest = bundle.captured(bundle.trusted_manifest(fd))
            if logs is None:
                logs = bundle_logs(fd, cap)
            nccl = bundle_nccl(fd, cfg.evidence.nccl_tail_kib * 1024)
    facts, row_uid = node_summary(cfg, job_id, node, logs)
    facts = dataclasses.replace(facts, bundle_dir=path if have_manifest else None, nccl=nccl)
    gid, _ = bundle.admin_gid(cfg.evidence.admin_group)
    owner = bundle.Owner(uid if uid is not None else row_uid, gid)
    summary = facts.to_dict()
    data = (json.dumps(summary, indent=1, default=str) + "\n").encode()
    if bundle_dir is None:
        ctx = bundle.open_bundle(cfg, job_id, node, owner)
    else:
        parent, name = os.path.split(os.path.normpath(bundle_dir))
        ctx = bundle.open_dir(parent, [name], owner)
    with ctx as dir_fd:
        bundle.write_file(dir_fd, bundle.SUMMARY, data, owner)
        bundle.vouch(dir_fd, bundle.file_entry(bundle.SUMMARY, data, "summary"), owner,
                     job_id, node)  # fmt: skip
    return Written(os.path.join(path, bundle.SUMMARY), summary)
