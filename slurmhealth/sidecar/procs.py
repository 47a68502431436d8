"""Find a job's processes on this node (for stack dumps at hang time).

With ``proctrack/linuxproc`` there is no cgroup to read, so the job's processes are the
ones whose environment carries ``SLURM_JOB_ID=<id>`` (root can read every
``/proc/PID/environ``); slurmhealth's own processes (the sidecar inherits the prolog's
environment) and Slurm's step daemons are left out.
"""

from __future__ import annotations

import os


def job_pids(job_id: str, *, python_only: bool = True, proc: str = "/proc") -> list[int]:
    needle = f"SLURM_JOB_ID={job_id}".encode()
    pids = []
    for entry in os.listdir(proc):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"{proc}/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
            with open(f"{proc}/{entry}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue  # gone, or a kernel thread
        if needle not in env or not argv or not argv[0]:
            continue
        joined = b" ".join(argv)
        if b"slurmhealth" in joined or b"slurmstepd" in joined:
            continue
        if python_only and b"python" not in os.path.basename(argv[0]) and b"python" not in joined:
            continue
        pids.append(int(entry))
    return sorted(pids)
