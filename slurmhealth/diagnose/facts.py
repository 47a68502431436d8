"""What is known about one job, per node: plain data for diagnosis and the report.

Built from a node's history (``slurmhealth.summary.collect``), written by the epilog as the
node's ``summary.json`` in the shared evidence dir, and read back by ``slurmhealth report``
on any node. Times are UTC seconds; rows keep the history's column names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from slurmhealth.model_records import Job

SCHEMA = "slurmhealth.facts/1"


# the job as facts (the JSON report's and a summary's "job"): these fields of it, in this
# order, ``nodes`` holding the node names
FACT_FIELDS = ("job_id", "user", "account", "partition", "qos", "priority", "nodes", "gpus",
               "start_ts", "end_ts", "state", "exit_code", "time_limit_s")  # fmt: skip


def job_to_dict(job: Job) -> dict[str, Any]:
    """:data:`FACT_FIELDS` of ``job``."""
    return {k: getattr(job, "node_names" if k == "nodes" else k) for k in FACT_FIELDS}


def job_from_dict(data: Mapping[str, Any]) -> Job:
    """The job from :func:`job_to_dict`'s shape; ``TypeError`` for a key of another."""
    unknown = set(data) - set(FACT_FIELDS)
    if unknown:
        raise TypeError(f"not a job's field: {sorted(unknown)}")
    return Job(**{("node_names" if k == "nodes" else k): v for k, v in data.items()})


@dataclass(frozen=True)
class GpuStats:
    """Aggregates of one GPU's samples over the job (``samples`` rows)."""

    gpu: int
    uuid: str | None = None
    samples: int = 0
    util_mean: float | None = None  # percent
    util_p5: float | None = None
    util_min: float | None = None
    util_max: float | None = None
    util_swings: int = 0  # times utilisation crossed 10% <-> 90% (oscillation)
    mem_peak_bytes: int | None = None
    mem_total_bytes: int | None = None  # the GPU's framebuffer, when a source knows it
    power_mean_w: float | None = None
    temp_max_c: float | None = None
    margin_min_c: float | None = None
    throttle_seconds: Mapping[str, float] = field(default_factory=dict)  # reason -> s
    pcie_gen_min: int | None = None
    pcie_width_min: int | None = None
    nvlink_active_min: int | None = None
    nvlink_errors_delta: int = 0
    pcie_replays_delta: int = 0
    series: tuple[tuple[float, float | None, float | None], ...] = ()  # (ts, util %, power W)


@dataclass(frozen=True)
class TaskFacts:
    """What the training loop reported (``slurmhealth.job``), aggregated over the job."""

    steps_total: int = 0
    step_seconds_median: float | None = None
    samples_per_second_first: float | None = None  # early in the job
    samples_per_second_last: float | None = None  # at the end
    mfu_ratio: float | None = None
    comm_ratio: float | None = None
    data_wait_ratio: float | None = None


@dataclass(frozen=True)
class NodeFacts:
    node: str
    findings: tuple[Mapping[str, Any], ...] = ()  # findings rows of this job's runs
    runs: tuple[Mapping[str, Any], ...] = ()  # check_runs rows (prolog/epilog)
    events: tuple[Mapping[str, Any], ...] = ()  # sidecar events rows
    drains: tuple[Mapping[str, Any], ...] = ()  # drains rows of this job
    # remediations rows of the fault this job met (reset, validate, reboot, resume, ...)
    remediations: tuple[Mapping[str, Any], ...] = ()
    gpus: tuple[GpuStats, ...] = ()
    task: TaskFacts | None = None
    evidence: tuple[Mapping[str, Any], ...] = ()  # manifest entries of the node's bundle
    logs: Mapping[str, str] = field(default_factory=dict)  # tails: stderr, nccl, kernel, stacks
    bundle_dir: str | None = None
    # the NCCL logs' verdicts (slurmhealth.diagnose.nccl_log.NcclFacts.to_dict()), read from the
    # bundle's whole NCCL files; empty: none were captured (rules read the tail instead)
    nccl: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodeFacts:
        gpus = tuple(
            GpuStats(
                **{
                    **g,
                    "series": tuple(tuple(p) for p in g.get("series", ())),
                    "throttle_seconds": dict(g.get("throttle_seconds", {})),
                }
            )
            for g in data.get("gpus", ())
        )
        task = data.get("task")
        return cls(
            node=str(data["node"]),
            findings=tuple(data.get("findings", ())),
            runs=tuple(data.get("runs", ())),
            events=tuple(data.get("events", ())),
            drains=tuple(data.get("drains", ())),
            remediations=tuple(data.get("remediations", ())),
            gpus=gpus,
            task=None if not task else TaskFacts(**task),
            evidence=tuple(data.get("evidence", ())),
            logs=dict(data.get("logs", {})),
            bundle_dir=data.get("bundle_dir"),
            nccl=dict(nccl) if isinstance(nccl := data.get("nccl"), Mapping) else {},
        )


@dataclass(frozen=True)
class Facts:
    job: Job
    nodes: tuple[NodeFacts, ...] = ()


@dataclass(frozen=True)
class Citation:
    """A piece of evidence a diagnosis rests on."""

    kind: str  # finding | event | sample | drain | file | log | job
    text: str
    node: str | None = None
    gpu: int | None = None
    ts: float | None = None
    ref: str | None = None  # file path or row id


@dataclass(frozen=True)
class Diagnosis:
    """A matched rule: the likely root cause, how to verify it, whose fault it is and what
    the job's owner and the admins do next."""

    rule: str
    title: str
    severity: str  # info | warn | fail | critical
    root_cause: str
    verify: str
    admin_action: str
    confidence: float = 0.5  # 0-1
    node: str | None = None
    gpu: int | None = None
    citations: tuple[Citation, ...] = ()
    fault_class: str = "unknown"  # hardware | system | application | unknown
    user_action: str = ""
    count: int = 0  # rows, samples and log lines that matched (citations keep the first few)
    first_ts: float | None = None  # the earliest and latest matched time, UTC s
    last_ts: float | None = None

    @property
    def action(self) -> str:
        """The admins' action (the name it had before user actions existed)."""
        return self.admin_action

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
