"""The bundles on disk: list them, read a manifest, prune old ones (``evidence list/prune``).

A bundle is a ``<job_id>/<node>/`` directory under the evidence root; its age is its newest
file's mtime (UTC seconds). Symlinks inside the root are never followed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import time
from typing import TYPE_CHECKING, Any

from slurmhealth.evidence import bundle

if TYPE_CHECKING:
    from slurmhealth.config import Config


def _dirs(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return sorted(
                (e for e in it if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")),
                key=lambda e: e.name,
            )
    except OSError:
        return []


def _usage(path: str) -> tuple[int, int, float]:
    """(bytes, files, newest mtime) of a directory tree, without following symlinks."""
    size = files = 0
    newest = 0.0
    for top, _dirnames, names in os.walk(path):
        with contextlib.suppress(OSError):
            newest = max(newest, os.lstat(top).st_mtime)
        for name in names:
            try:
                st = os.lstat(os.path.join(top, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                size += st.st_size
                files += 1
            newest = max(newest, st.st_mtime)
    return size, files, newest


def read_manifest(cfg: Config, job_id: str, node: str) -> dict[str, Any] | None:
    """The bundle's ``manifest.json``, or None when there is no (readable) one."""
    with bundle.open_existing(bundle.bundle_path(cfg, job_id, node)) as fd:
        data = None if fd is None else bundle.read_tail(fd, bundle.MANIFEST, 64 * 1024 * 1024)
    if not data:
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def list_bundles(cfg: Config) -> list[dict[str, Any]]:
    """Every bundle under this node's evidence root, newest first: job, node, path, size
    (bytes), files, mtime (UTC s), captured (has a manifest), reason, truncated."""
    root = bundle.evidence_root(cfg)
    out: list[dict[str, Any]] = []
    for job in _dirs(root):
        for node in _dirs(job.path):
            size, files, mtime = _usage(node.path)
            manifest: dict[str, Any] | None = None
            if os.path.isfile(os.path.join(node.path, bundle.MANIFEST)):
                try:
                    manifest = read_manifest(cfg, job.name, node.name)
                except Exception:  # a name that is not a job id: list it, unread
                    manifest = None
            out.append({
                "job": job.name, "node": node.name, "path": node.path, "size": size,
                "files": files, "mtime": mtime, "captured": bundle.captured(manifest),
                "reason": (manifest or {}).get("reason"),
                "truncated": (manifest or {}).get("truncated"),
            })  # fmt: skip
    out.sort(key=lambda b: (-b["mtime"], b["job"], b["node"]))
    return out


def prune(
    cfg: Config,
    max_age_days: float | None,
    max_total_bytes: int | None,
    now: float | None = None,
    *,
    dry_run: bool = False,
) -> list[str]:
    """Remove bundles older than ``max_age_days``, then the oldest until the rest fit in
    ``max_total_bytes``; None or 0 = no such limit. Return the removed bundle paths, oldest
    first (with ``dry_run``, what would be removed)."""
    now = time.time() if now is None else now
    bundles = sorted(list_bundles(cfg), key=lambda b: (b["mtime"], b["job"], b["node"]))
    doomed: list[dict[str, Any]] = []
    keep: list[dict[str, Any]] = []
    cutoff = now - max_age_days * 86400 if max_age_days else None
    for b in bundles:
        (doomed if cutoff is not None and b["mtime"] < cutoff else keep).append(b)
    if max_total_bytes:
        total = sum(b["size"] for b in keep)
        while keep and total > max_total_bytes:
            b = keep.pop(0)
            doomed.append(b)
            total -= b["size"]
    removed = []
    for b in doomed:
        if not dry_run:
            try:
                shutil.rmtree(b["path"])
            except FileNotFoundError:
                pass
            except OSError:
                continue
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(b["path"]))  # the job dir, once its last node is gone
        removed.append(b["path"])
    return removed
