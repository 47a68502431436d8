"""The config sections of the later layers (history retention, the RDMA network, the
node's metrics endpoint, evidence bundles, baselines, the report's fleet sources): part of
:class:`slurmhealth.config.Config`, kept here so that each module stays small. Read through
``slurmhealth.config``.

Every section (here and in ``config.py``) is ``frozen`` with ``eq=False, repr=False``:
nothing compares or prints a config object (``slurmhealth config show`` renders it), and each
prolog would otherwise generate and compile an ``__eq__``, a ``__hash__`` and a ``__repr__``
per section (three of a frozen dataclass's six methods) before it checks a GPU."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, eq=False, repr=False)
class HistoryConfig:
    """Retention, done by the node itself after each epilog and health check (at most
    ``prune_max_rows`` rows a run); 0 days keeps that kind forever."""

    raw_samples_days: int = 14  # raw GPU samples (one per GPU per sidecar interval)
    rollups_days: int = 400  # per-GPU 5-minute rollups: the report's stats and plots
    records_days: int = 1825  # check runs, findings, events, drains, evidence rows, jobs
    prune_max_rows: int = 100_000  # rows one prune deletes at most (in 5,000-row steps)


@dataclass(frozen=True, eq=False, repr=False)
class RdmaConfig:
    """The RDMA network (docs/network.md): what the checks expect of the node's HCAs."""

    enabled: bool = True  # read /sys/class/infiniband (a node without HCAs reads nothing)
    sysfs_root: str = "/sys"  # tests and the demo point this at a generated tree
    expected_hcas: int = 0  # HCAs the node must show (counted over `devices`); 0 = any
    expected_rate_gbps: float = 0.0  # each judged port at least this fast; 0 = not checked
    gpudirect: bool = False  # nvidia_peermem must be loaded (GPUDirect RDMA)
    link_layer: str = ""  # judge only ports of this link layer (InfiniBand | Ethernet); "" = any
    # the fabric's HCAs ("mlx5_0") or ports ("mlx5_0/1"); empty = every port (of link_layer)
    devices: list[str] = field(default_factory=list)


@dataclass(frozen=True, eq=False, repr=False)
class MetricsConfig:
    """The node's one scrape target (``slurmhealth exporter``, docs/metrics.md)."""

    mode: str = "slurmhealth"  # slurmhealth | dcgm (dcgm-exporter exports the GPU counters)
    # series: every per-GPU series carries job_id/user/priority (new series per job);
    # info: only node/gpu, attributed by slurmhealth_job_gpu_info (docs/metrics.md)
    job_labels: str = "series"
    # the listen address: all interfaces, the Prometheus convention; "127.0.0.1" keeps it
    # to the node (a Prometheus or agent on the node itself)
    bind: str = "0.0.0.0"
    port: int = 9450  # the exporter's /metrics; 0 = no HTTP endpoint (textfile only)
    textfile_dir: str = ""  # node_exporter's --collector.textfile.directory; "" = none
    textfile_interval_s: float = 10.0  # how often slurmhealth.prom is rewritten there
    per_link_nvlink: bool = False  # one series per NVLink and counter (18x per H100 GPU)
    per_counter_rdma: bool = False  # one RDMA error series per counter (8 a port), not their sum
    # whose jobs export the RDMA ports behind their GPUs: multi_node (jobs on more than one
    # node: their traffic crosses the fabric) | all | none; the checks and events run for all
    rdma_series: str = "multi_node"
    max_jobs: int = 256  # state files read per scrape, at most
    # how long a finished job's per-GPU stats stay served (final_series; 0 = never published):
    # several scrapes, so that a report from Prometheus reads them instead of every sample
    final_linger_s: float = 300.0
    max_state_bytes: int = 8 * 1024 * 1024  # a job's state file, at most
    # where the hook wrappers record a fail-open (SLURMHEALTH_FAIL_OPEN_LOG in their env)
    fail_open_log: str = "/var/lib/slurmhealth/fail-open.log"
    # the HTTP listener's bounds (slurmhealth/metrics/http_server.py, docs/threat-model.md)
    header_timeout_s: float = 5.0  # a connection's request head within this of its accept
    max_connections: int = 512  # open at once; at the cap the oldest unfinished one goes
    max_requests: int = 40  # requests answered at once (node_exporter's --web.max-requests)
    http_workers: int = 4  # threads answering them
    # TLS and basic auth for /metrics: a web-config file in Prometheus' format ("" = none)
    web_config_file: str = ""


@dataclass(frozen=True, eq=False, repr=False)
class EvidenceConfig:
    """The evidence bundle (``slurmhealth evidence``): per-source limits and permissions."""

    source_timeout_s: float = 2.0  # each source (command, file, NVML read) at most this long
    source_max_bytes: int = 4 * 1024 * 1024  # each file of the bundle at most this big
    budget_s: float = 10.0  # the whole capture, all sources together (epilog default)
    # group that may read every job (bundles, history, reports); "" = root only (plus the
    # owner). Read for access from the root-owned system config only, never a user's own
    admin_group: str = ""
    nvidia_smi: str = "nvidia-smi"  # binary for nvidia-smi-q.txt / nvidia-smi-nvlink.txt
    py_spy: str = "py-spy"  # binary for stacks.txt (the venv's own is found too)
    scontrol: str = "scontrol"  # binary for slurm-job.txt / slurm-node.txt
    # NCCL debug files (NCCL_DEBUG_FILE); placeholders {job_id}, {user}, {home}
    nccl_globs: list[str] = field(default_factory=lambda: ["{home}/nccl-logs/{job_id}/*.log"])
    nccl_tail_kib: int = 256  # last KiB kept of each NCCL file
    nccl_max_files: int = 32
    # the job's user's drop folder (docs/threat-model.md): files a user wants in their bundle,
    # copied in (their rights, regular files of theirs, bounded) as ``user/`` and marked
    # "user-supplied" in the manifest; placeholders {job_id}, {user}, {home}; [] = none
    drop_globs: list[str] = field(
        default_factory=lambda: ["{home}/.slurmhealth/evidence/{job_id}/*"]
    )
    drop_max_files: int = 8
    drop_kib: int = 256  # last KiB kept of each dropped file
    output_tail_kib: int = 64  # last KiB kept of the job's stdout / stderr
    kernel_margin_s: float = 300.0  # kernel-log lines from job start - margin to end + margin
    kernel_pattern: str = (
        "Xid|NVRM|mlx5|Out of memory|oom-kill|Killed process|hung_task|blocked for more than"
    )
    summary_log_kib: int = 8  # each log tail kept in summary.json
    max_age_days: float = 30.0  # `evidence prune` default; 0 = no age limit
    max_total_gb: float = 0.0  # `evidence prune` default; 0 = no size limit


@dataclass(frozen=True, eq=False, repr=False)
class BaselineConfig:
    """Benchmark baselines (``slurmhealth baseline``, ``slurmhealth validate``)."""

    warn_pct: float = 10.0  # a metric this many percent worse than its reference: warn
    fail_pct: float = 20.0  # ...this many percent worse: fail
    outlier_fraction: float = 0.8  # below this share of the fleet median: an outlier
    # pinned references, "kind.metric" = value (or just "metric" = value); else fleet median
    pinned: dict[str, Any] = field(default_factory=dict)
    # `slurmhealth validate` benchmarks: name (a parser kind) = command line (no shell)
    validate_commands: dict[str, Any] = field(
        default_factory=lambda: {
            "nccl": "all_reduce_perf -b 8 -e 1G -f 2 -g 8",
            "gpuburn": "gpu_burn 30",
        }
    )
    validate_timeout_s: float = 600.0  # each validation benchmark at most this long
    # optional prolog step: when the node's last validation (or last prolog run of it) is
    # older than prolog_bench_max_age_s (0 = never), the prolog re-runs this short test
    # within prolog_bench_timeout_s, stores it (label "prolog") and compares it to the fleet
    prolog_bench_max_age_s: float = 0.0
    prolog_bench_kind: str = "nvbandwidth"
    prolog_bench_command: str = "nvbandwidth -t host_to_device_memcpy_ce"
    prolog_bench_timeout_s: float = 3.0


@dataclass(frozen=True, eq=False, repr=False)
class ReportConfig:
    """Where ``slurmhealth report`` finds a job no node history holds (a login node)."""

    # the Prometheus that scrapes the nodes' exporters (http or https, its base URL, e.g.
    # "http://prometheus:9090"): per-GPU stats and plots by job_id; "" = not asked
    prometheus_url: str = ""
    prometheus_timeout_s: float = 10.0  # all of one report's Prometheus queries together
    # ask Slurm accounting (sacct, the AdminComment summary, sacctmgr's node events) for a
    # job no node history or evidence summary reaches
    accounting: bool = True
    # the job's first node stores the job's summary in its AdminComment (`sacctmgr modify
    # job`, slurmdbd) after its epilog, detached: no EpilogSlurmctld needed. false: only
    # `slurmhealth ctld-epilog` (EpilogSlurmctld) stores it, or nothing without accounting
    admin_comment: bool = True


@dataclass(frozen=True, eq=False, repr=False)
class RemediateConfig:
    """Automatic repair of nodes slurmhealth drained (docs/remediation.md): reset the GPU,
    re-validate, resume; else reboot; after ``max_attempts`` in ``window_s``: "service
    required". Off by default; bounded by a circuit breaker of its own."""

    enabled: bool = False
    max_attempts: int = 2  # resets and reboots per node within window_s, then service required
    window_s: float = 86400.0
    max_concurrent: int = 1  # nodes in remediation at once (a GPU reset or a reboot)
    max_fraction: float = 0.10  # ...and at most this share of the nodes in scope (at least 1)
    partitions: list[str] = field(default_factory=list)  # only these partitions' nodes; [] = all
    nodes: str = ""  # only these nodes (a Slurm hostlist, e.g. "gpu[01-16]"); "" = all
    validate_benchmarks: list[str] = field(default_factory=list)  # [baseline] validate_commands
    bug_report_timeout_s: float = 300.0  # nvidia-bug-report.sh at "service required"
