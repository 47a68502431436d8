"""Evidence bundles: what a job left behind, captured before it is gone (DESIGN.md 1, 5).

``capture`` writes ``<evidence_dir>/<job_id>/<node>/`` (one file per source plus
``manifest.json``), ``write_summary`` the node's ``summary.json`` for ``report``;
``list_bundles`` / ``prune`` manage what is on disk.
"""

from __future__ import annotations

from slurmhealth.evidence.bundle import bundle_path
from slurmhealth.evidence.capture import BundleResult, capture
from slurmhealth.evidence.store import list_bundles, prune, read_manifest
from slurmhealth.evidence.summary import write_summary

__all__ = [
    "BundleResult",
    "bundle_path",
    "capture",
    "list_bundles",
    "prune",
    "read_manifest",
    "write_summary",
]
