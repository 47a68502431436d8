"""Whether a job still runs on this node, from this node alone (never slurmctld).

The epilog stops a job's sidecar; this is the fallback when no epilog comes (slurmd
restarted, the epilog timed out before reaching us). Signs of the job here, any one is
enough: its cgroup (``job_<id>`` under the cgroup v2 ``slurmstepd.scope`` or a v1
controller's ``slurm/uid_*/``), a ``slurmstepd: [<id>.<step>]`` process, or a process with
``SLURM_JOB_ID=<id>`` in its environment (:func:`slurmhealth.sidecar.procs.job_pids`).

A job seen running and then gone for two checks in a row has ended. A job never seen has
ended once ``sidecar.unseen_grace_s`` has passed since the sidecar started: a job that ended
before the sidecar's first look (``sbatch --wrap true``) leaves no sign to miss, and its
sidecar must not wait for one forever. The grace is what an allocation may spend here
before its first step (the other nodes of a multi-node job wait for the batch script's
first ``srun``; with ``PrologFlags=Contain`` the extern step is there from the start).
"""

from __future__ import annotations

import glob
import logging
import os
import time
from collections.abc import Callable

from slurmhealth.sidecar.procs import job_pids

log = logging.getLogger("slurmhealth.sidecar")

_CGROUP_PATTERNS = (
    "{root}/system.slice/slurmstepd.scope/job_{id}",  # cgroup v2 (Slurm >= 22.05)
    "{root}/*/slurm*/uid_*/job_{id}",  # cgroup v1: freezer, cpuset, memory, ...
    "{root}/slurm*/uid_*/job_{id}",
)


def _stepd(job_id: str, proc: str) -> bool:
    prefix = f"slurmstepd: [{job_id}.".encode()
    try:
        entries = os.listdir(proc)
    except OSError:
        return False
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"{proc}/{entry}/cmdline", "rb") as fh:
                if fh.read(256).startswith(prefix):
                    return True
        except OSError:
            continue
    return False


def job_present(job_id: str, proc: str = "/proc", cgroup_root: str = "/sys/fs/cgroup") -> bool:
    """Whether any sign of ``job_id`` is on this node now."""
    for pattern in _CGROUP_PATTERNS:
        if glob.glob(pattern.format(root=cgroup_root, id=glob.escape(job_id))):
            return True
    return _stepd(job_id, proc) or bool(job_pids(job_id, python_only=False, proc=proc))


class JobPresence:
    """:meth:`ended` is True once the job was seen and then missed ``misses`` checks in a
    row, or was never seen in the ``unseen_grace_s`` since this object was made."""

    def __init__(
        self,
        job_id: str,
        *,
        unseen_grace_s: float,
        misses: int = 2,
        proc: str = "/proc",
        cgroup_root: str = "/sys/fs/cgroup",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job_id, self.misses, self.unseen_grace_s = job_id, misses, unseen_grace_s
        self.proc, self.cgroup_root = proc, cgroup_root
        self._clock = clock
        self._since = clock()
        self.seen = False
        self._missed = 0

    def ended(self) -> bool:
        if job_present(self.job_id, self.proc, self.cgroup_root):
            self.seen, self._missed = True, 0
            return False
        if self.seen:
            self._missed += 1
            return self._missed >= self.misses
        waited = self._clock() - self._since
        if waited < self.unseen_grace_s:
            return False
        log.info("job %s: no process, step or cgroup here in %.0f s: taken as ended",
                 self.job_id, waited)  # fmt: skip
        return True
