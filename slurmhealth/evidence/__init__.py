"""Evidence bundles: what a job left behind, captured before it is gone (DESIGN.md 1, 5).

The files (adapters): ``bundle_path`` names ``<evidence_dir>/<job_id>/<node>/``,
``list_bundles`` / ``read_manifest`` / ``prune`` manage what is on disk. The capture that runs
every source under one deadline (:mod:`slurmhealth.evidence.capture`) and the node's
``summary.json`` for ``report`` (:mod:`slurmhealth.evidence.summary`) are orchestration:
import them from their modules.
"""

from __future__ import annotations

from slurmhealth.evidence.bundle import bundle_path
from slurmhealth.evidence.store import list_bundles, prune, read_manifest

__all__ = ["bundle_path", "list_bundles", "prune", "read_manifest"]
