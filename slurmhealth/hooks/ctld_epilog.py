"""``slurmhealth ctld-epilog``: slurm.conf's ``EpilogSlurmctld``. On the controller, once per
job at its end: the job's report, reduced to the compact summary of
:mod:`slurmhealth.summary.admin_comment`, goes into the job's AdminComment in slurmdbd, where
``sacct -o AdminComment`` and ``slurmhealth report`` on any login node find it after the
nodes' own histories and evidence are gone.

Ordering: Slurm starts ``EpilogSlurmctld`` when the job terminates, at the same time as it
tells the nodes to run their ``Epilog`` (both "at job termination", slurm.conf and the
Prolog and Epilog Guide); nothing orders the two. The node epilogs write the summaries this
reads, so it waits for every node's ``<evidence_dir>/<job>/<node>/summary.json``, polling,
at most ``wait_s`` (default 15 s, under the node epilog's 20 s timeout and the wrapper's
25 s), then reports from whatever is there (a node whose summary never came is a node the
report knows less about; the summary says so by its node count).

Fail open: the command always exits 0 (the wrapper too); every failure is logged loudly.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from slurmhealth.config import Config
from slurmhealth.slurm import SlurmBackend, SlurmCli, expand_hostlist

log = logging.getLogger("slurmhealth.hooks")
WAIT_S = 15.0
POLL_S = 0.5
_JOB_ID = re.compile(r"[0-9]{1,12}(?:[_+][0-9]{1,12})?")


@dataclass(frozen=True)
class CtldResult:
    stored: bool
    chars: int = 0
    nodes_waited: tuple[str, ...] = ()  # nodes whose summary had not come at the deadline
    why: str = ""


def _missing(cfg: Config, job_id: str, nodes: tuple[str, ...]) -> tuple[str, ...]:
    from slurmhealth.report.sources import evidence_root

    return tuple(n for n in nodes
                 if not os.path.exists(os.path.join(evidence_root(cfg, n), job_id, n,
                                                    "summary.json")))  # fmt: skip


def wait_for_summaries(
    cfg: Config,
    job_id: str,
    nodes: tuple[str, ...],
    wait_s: float = WAIT_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[str, ...]:
    """Wait until every node's summary.json exists or ``wait_s`` passed; the nodes still
    missing."""
    deadline = clock() + wait_s
    missing = _missing(cfg, job_id, nodes)
    while missing and clock() < deadline:
        sleep(min(POLL_S, max(0.0, deadline - clock())))
        missing = _missing(cfg, job_id, missing)
    return missing


def run_ctld_epilog(
    cfg: Config,
    env: Mapping[str, str],
    slurm: SlurmBackend | None = None,
    wait_s: float = WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
) -> CtldResult:
    """Build the job's summary and store it; raises nothing it can name (the caller logs
    what it cannot)."""
    from slurmhealth.report.gather import build_report
    from slurmhealth.summary import admin_comment

    job_id = env.get("SLURM_JOB_ID", "").strip()
    if not _JOB_ID.fullmatch(job_id):
        return CtldResult(False, why=f"SLURM_JOB_ID {job_id!r} is not a job id")
    nodes = expand_hostlist(env.get("SLURM_JOB_NODELIST", "") or "")
    missing = wait_for_summaries(cfg, job_id, nodes, wait_s, sleep=sleep)
    if missing:
        log.warning("no summary from %s after %.0f s: the stored summary knows less of them",
                    ",".join(missing), wait_s)  # fmt: skip
    # from the nodes' own records only: a summary made from accounting alone would store
    # a verdict that never saw the GPUs (and the fallback would read this very comment)
    report = build_report(replace(cfg, report=replace(cfg.report, accounting=False)), job_id)
    text = admin_comment.fit(report)
    backend = slurm if slurm is not None else SlurmCli(timeout_s=10.0)
    if not isinstance(backend, SlurmCli):
        return CtldResult(False, len(text), missing, "the Slurm backend cannot set AdminComment")
    backend.set_admin_comment(job_id, text)
    return CtldResult(True, len(text), missing)
