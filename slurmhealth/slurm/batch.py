"""The batch-job commands' formats (``sbatch``, ``squeue -t all``, ``scontrol show
topology``), used by ``slurm.SlurmCli`` for the pairwise sweep: what a job is, how it is
submitted, how the answers read. Everyone else calls ``SlurmCli`` methods.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from slurmhealth.slurm.base import HostlistError, SlurmError, expand_hostlist


@dataclass(frozen=True)
class BatchJob:
    """One batch job as ``sbatch`` takes it: ``script`` on ``nodes`` exactly, at most
    ``time_min`` minutes, stdout and stderr to ``output``."""

    script: str
    nodes: tuple[str, ...]
    name: str
    time_min: int
    output: str
    partition: str = ""
    gpus_per_node: int = 0
    tasks_per_node: int = 1
    exclusive: bool = True
    env: Mapping[str, str] = field(default_factory=dict)


def sbatch_argv(job: BatchJob) -> list[str]:
    """The ``sbatch`` command for ``job``: ``--nodes``/``--nodelist`` pin it to its nodes."""
    argv = ["sbatch", "--parsable", f"--job-name={job.name}", f"--nodes={len(job.nodes)}",
            f"--nodelist={','.join(job.nodes)}", f"--time={max(1, job.time_min)}",
            f"--output={job.output}", f"--error={job.output}",
            f"--ntasks-per-node={max(1, job.tasks_per_node)}"]  # fmt: skip
    if job.partition:
        argv.append(f"--partition={job.partition}")
    if job.gpus_per_node:
        argv.append(f"--gres=gpu:{job.gpus_per_node}")
    if job.exclusive:
        argv.append("--exclusive")
    return [*argv, job.script]


def parse_sbatch(out: str) -> str:
    """``sbatch --parsable`` prints ``ID`` or ``ID;CLUSTER``."""
    first = out.strip().splitlines()[0] if out.strip() else ""
    job_id = first.split(";")[0].strip()
    if not re.fullmatch(r"\d{1,20}", job_id):
        raise SlurmError(f"sbatch printed no job id: {first[:80]!r}")
    return job_id


def parse_job_states(out: str) -> dict[str, str]:
    """``squeue -h -o %i|%T`` lines as ``{job id: STATE}``; other lines are skipped."""
    found: dict[str, str] = {}
    for line in out.splitlines():
        job_id, sep, state = line.strip().partition("|")
        if sep and re.fullmatch(r"\d{1,20}", job_id) and re.fullmatch(r"[A-Z_]{1,40}", state):
            found[job_id] = state
    return found


def parse_topology(out: str) -> dict[str, str]:
    """``scontrol show topology`` (``SwitchName=s1 Level=0 LinkSpeed=1 Nodes=n[1-2]``) as
    ``{node: the lowest-level switch that lists it}``."""
    best: dict[str, tuple[int, str]] = {}
    for line in out.splitlines():
        fields = dict(t.partition("=")[::2] for t in line.split() if "=" in t)
        name, nodes = fields.get("SwitchName", ""), fields.get("Nodes", "")
        level = int(fields["Level"]) if fields.get("Level", "").isdigit() else 0
        if not name or not nodes:
            continue
        try:
            names = expand_hostlist(nodes)
        except HostlistError:
            continue
        for node in names:
            if node not in best or level < best[node][0]:
                best[node] = (level, name)
    return {node: name for node, (_, name) in best.items()}
