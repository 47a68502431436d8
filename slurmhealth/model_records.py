"""Records the prolog's check never builds, kept out of :mod:`slurmhealth.model` so that a
check run does not pay for creating their classes (a frozen dataclass costs six generated
methods, each source text parsed and compiled at import): a job (as the hooks, the sidecar
and the Slurm adapters know it), what a training loop reported, what the exporter shows of
a job, and kernel-log faults other than Xid lines."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from slurmhealth.model import NodeSnapshot


@dataclass(frozen=True)
class KernelEvent:
    """A GPU fault in the kernel log that is not an ``NVRM: Xid`` line.

    ``kind`` is one of :data:`slurmhealth.model.KERNEL_EVENT_KINDS`. The GPU is
    ``pci_bus_id`` (normalised) when the line names one, else ``gpu_number`` (the driver's
    ``GPU<n>``), else neither (a node-level fault). For ``sxid`` the bus id is the
    NVSwitch's and ``code`` the SXid; ``level`` is what the line says of itself:
    ``fatal``, ``non-fatal`` or ``corrected``.
    """

    kind: str
    message: str
    raw: str
    ts: float | None = None
    seq: int | None = None
    pci_bus_id: str | None = None
    gpu_number: int | None = None
    code: int | None = None
    level: str | None = None
    device: str | None = None  # the kernel driver or device that logged it ("nvidia", ...)


@dataclass(frozen=True)
class Job:
    """What the project knows of one job, whoever asked: a prolog, epilog or sidecar
    (Slurm's environment, completed by one ``squeue`` call where it lacks fields; ``node``
    is the node the hook runs on), ``squeue`` (``slurm.SlurmCli.job``, no ``node``) or
    slurmdbd (``sacct``: ``slurm.acct.parse_sacct``, with ``node_names``, the times,
    ``gpu_count`` and ``admin_comment``), and the facts diagnosis and the report judge
    (``diagnose.facts.Facts.job``: from a history's ``jobs`` row, the nodes' summaries or
    accounting). Times are UTC seconds; a field nobody filled in is empty or None."""

    job_id: str
    node: str = ""
    user: str = ""
    uid: int | None = None
    account: str = ""
    partition: str = ""
    qos: str = ""
    priority: int | None = None
    nodes: str = ""  # the job's hostlist as Slurm prints it
    gpus: tuple[int, ...] = ()  # the GPUs this node gave the job (indices)
    comment: str = ""
    extra: str = ""
    exit_code: str | None = None  # "exit:signal", e.g. "3:0" (epilog: SLURM_JOB_EXIT_CODE2)
    mig: tuple[str, ...] = ()  # the job's MIG device UUIDs (MIG-...), where known
    state: str = ""  # lower case: running, pending, completed, failed, cancelled, ...
    node_names: tuple[str, ...] = ()  # ``nodes`` expanded (sacct)
    start_ts: float | None = None
    end_ts: float | None = None
    time_limit_s: float | None = None
    gpu_count: int | None = None  # GPUs allocated over the job (sacct's AllocTRES gres/gpu)
    admin_comment: str = ""

    def opted_out(self, token: str) -> bool:
        """``token`` stands as a whole word of the comment or extra (words split at blanks,
        commas and semicolons): ``foo slurmhealth=off,bar`` opts out, ``slurmhealth=office``
        does not."""
        want = token.replace(",", " ").replace(";", " ").split()
        for text in (self.comment, self.extra):
            words = text.replace(",", " ").replace(";", " ").split()
            if want and any(words[i : i + len(want)] == want for i in range(len(words))):
                return True
        return False

    @property
    def failed(self) -> bool:
        """Non-zero exit or a signal (``"0:0"`` is success)."""
        return self.exit_code not in (None, "", "0:0", "0")


@dataclass(frozen=True)
class TaskStats:
    """What a job's training loop reported through :mod:`slurmhealth.job` (latest window)."""

    steps_total: int
    step_seconds: float | None = None  # median over the recent window
    samples_per_second: float | None = None
    tokens_per_second: float | None = None
    mfu_ratio: float | None = None  # model FLOPs utilisation, 0-1
    comm_ratio: float | None = None  # share of step time in communication, 0-1
    data_wait_ratio: float | None = None  # share of step time waiting for data, 0-1
    last_step_ts: float | None = None


@dataclass(frozen=True)
class ExportState:
    """What one Prometheus scrape of a job's sidecar shows; the sidecar swaps in a new one
    each interval, so a scrape always sees a consistent view."""

    labels: Job  # the job whose labels every series carries (metrics.JOB_LABELS)
    snapshot: NodeSnapshot | None = None
    xid_counts: Mapping[tuple[int, int], int] = field(default_factory=dict)  # (gpu, xid) -> n
    event_counts: Mapping[tuple[str, int | None], int] = field(default_factory=dict)
    task: TaskStats | None = None
    drains_suppressed_total: int = 0
    samples_total: int = 0
    started_ts: float = 0.0
    rdma: Any = None  # the node's judged RDMA ports (rdma.model.RdmaSnapshot); None = not read


# the labels of a job's series (docs/metrics.md): per job, and per GPU
JOB_LABELS = ("job_id", "user", "priority", "node")
GPU_LABELS = (*JOB_LABELS, "gpu", "uuid")


def job_label_values(job: Job, node: str) -> tuple[str, ...]:
    """The values of :data:`JOB_LABELS`; ``node`` stands in when the labels carry none."""
    priority = "" if job.priority is None else str(job.priority)
    return (job.job_id, job.user, priority, job.node or node)
