"""Configuration: one frozen dataclass tree read from TOML.

Precedence, resolved at call time: defaults < file < environment < command-line flags.
The file is ``--config``, else ``$SLURMHEALTH_CONFIG``, else ``/etc/slurmhealth/config.toml``
(silently skipped when that default file does not exist).
Every value remembers where it came from, for ``slurmhealth config show``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from slurmhealth.config.ranges import validate as validate_ranges
from slurmhealth.config.sections import (
    BaselineConfig,
    EvidenceConfig,
    HistoryConfig,
    MetricsConfig,
    RdmaConfig,
    RemediateConfig,
    ReportConfig,
)
from slurmhealth.errors import ConfigError

DEFAULT_CONFIG_PATH = "/etc/slurmhealth/config.toml"


@dataclass(frozen=True, eq=False, repr=False)
class NodeConfig:
    name: str = ""  # Slurm node name; default $SLURMD_NODENAME, else the short hostname


@dataclass(frozen=True, eq=False, repr=False)
class GpuConfig:
    backend: str = "nvml"  # nvml | sim
    sim_scenario: str = ""  # scenario file for backend=sim
    sim_epoch: float = 0.0  # scenario clock start (UTC s); 0 = the scenario file's mtime
    sim_kernel_log: str = ""  # where the simulator writes its Xid kernel-log lines
    # a GPU that does not answer within this is unresponsive; fits in the prolog's budget
    snapshot_timeout_s: float = 3.0
    expected_count: int = 0  # GPUs this node must show; 0 = don't check beyond the job's GPUs
    expected_driver: str = ""  # e.g. "550.90.07"; empty = don't check
    # NVLinks each model must have active; models not listed: every link NVML reports
    nvlinks_per_model: dict[str, int] = field(
        default_factory=lambda: {
            "NVIDIA H100 80GB HBM3": 18,
            "NVIDIA H200": 18,
            "NVIDIA A100-SXM4-80GB": 12,
            "NVIDIA A100-SXM4-40GB": 12,
        }
    )
    # a node set's GPU design where it departs from checks/sku_table.toml:
    # [gpu.topology."gpu-nvl[01-16]"] sku = "h100-nvl" / nvlinks = 12 / pcie_width = 8 ...
    topology: dict[str, dict[str, Any]] = field(default_factory=dict)
    mig_gres: bool = False  # the node's GPU GRES are MIG devices (SLURM_JOB_GPUS indexes them)
    # partitions whose jobs use multi-node NVLink (GB200 NVL72): IMEX daemon and channel
    # checked in their prologs; "*" = every partition
    imex_partitions: list[str] = field(default_factory=list)
    imex_channel_dir: str = "/dev/nvidia-caps-imex-channels"


@dataclass(frozen=True, eq=False, repr=False)
class PathsConfig:
    db: str = "/var/lib/slurmhealth/history/history.db"  # its folder: root:admin 0750
    spool: str = ""  # empty = "<db>.spool.jsonl"
    spool_max_bytes: int = 64 * 1024 * 1024  # beyond this, new batches are dropped (counted)
    evidence_dir: str = "/var/lib/slurmhealth/evidence"  # 0711: owners reach their bundles
    run_dir: str = "/run/slurmhealth"


@dataclass(frozen=True, eq=False, repr=False)
class KernelLogConfig:
    source: str = "auto"  # auto | kmsg | journalctl | dmesg | none | /path/to/file
    lookback_s: float = 3600.0  # on first read, Xids older than this are ignored
    budget_s: float = 1.0  # time allowed to read the log


@dataclass(frozen=True, eq=False, repr=False)
class PolicyConfig:
    mode: str = "drain"  # drain | warn (warn: never drain, only record)
    # circuit breaker: no new drain once this share of the cluster (at least 1 node) is
    # drained by slurmhealth
    drain_max_share: float = 0.10
    optout_token: str = "slurmhealth=off"  # in a job's --comment or --extra: skip checks


@dataclass(frozen=True, eq=False, repr=False)
class SlurmConfig:
    backend: str = "cli"  # cli (scontrol/squeue/sinfo) | pyslurm | auto
    command_timeout_s: float = 5.0  # each scontrol/squeue/sinfo call
    prolog_budget_s: float = 5.0  # prolog decides+drains+records in this; < wrapper's 8 s


@dataclass(frozen=True, eq=False, repr=False)
class SidecarConfig:
    enabled: bool = True  # the prolog starts one per job, the epilog stops it
    interval_s: float = 10.0  # GPU sampling interval (minimum 1 s)
    dcgm_job_mapping_dir: str = ""  # dcgm-exporter HPC job mapping (one file per GPU index)
    flush_every: int = 6  # samples are written to the history every N intervals
    # look this often for the job's processes / cgroup on this node (never asks slurmctld):
    # the sidecar exits once a job it saw running has none left
    job_check_interval_s: float = 60.0
    # ...or once the job showed none at all this long after the sidecar started (it ended
    # before the first look; docs/metrics.md)
    unseen_grace_s: float = 120.0
    hang_after_s: float = 900.0  # all the job's GPUs idle this long while it runs: hang
    hang_idle_pct: float = 5.0
    straggler_ratio: float = 0.75  # a GPU below this share of its peers' median...
    straggler_window_s: float = 300.0  # ...averaged over this window
    throttle_sustain_s: float = 30.0  # HW slowdown/thermal/power brake this long: an event
    throughput_drop: float = 0.30  # step throughput this far below the job's rolling median
    stall_factor: float = 5.0  # no step for this many median step times: stalled...
    # ...and for at least this long: a job that finished its steps and is shutting down, or
    # saves a checkpoint, pauses its steps for a while without hanging
    stall_min_s: float = 300.0
    stop_grace_s: float = 2.0  # epilog: SIGTERM, final flush, then SIGKILL
    # the job's step folder on /run (RAM): a tmpfs of this size (else the reader's sweep)
    job_dir_max_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True, eq=False, repr=False)
class ChecksConfig:
    disabled: list[str] = field(default_factory=list)
    # [checks.<name>] tables: threshold overrides, validated against the check catalog
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, eq=False, repr=False)
class Config:
    node: NodeConfig = field(default_factory=NodeConfig)
    gpu: GpuConfig = field(default_factory=GpuConfig)
    paths: PathsConfig = field(default_factory=PathsConfig)
    history: HistoryConfig = field(default_factory=HistoryConfig)
    kernel_log: KernelLogConfig = field(default_factory=KernelLogConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    sidecar: SidecarConfig = field(default_factory=SidecarConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    checks: ChecksConfig = field(default_factory=ChecksConfig)
    rdma: RdmaConfig = field(default_factory=RdmaConfig)
    evidence: EvidenceConfig = field(default_factory=EvidenceConfig)
    baseline: BaselineConfig = field(default_factory=BaselineConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    remediate: RemediateConfig = field(default_factory=RemediateConfig)
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    @property
    def node_name(self) -> str:
        return self.node.name or os.uname().nodename.split(".")[0]

    def expand(self, template: str, node: str | None = None) -> str:
        """Paths may hold ``{node}`` (several slurmd on one host, or a shared filesystem)."""
        return template.replace("{node}", node or self.node_name)

    def db_path(self, node: str | None = None) -> str:
        return self.expand(self.paths.db, node)

    def spool_path(self, node: str | None = None) -> str:
        return self.expand(self.paths.spool, node) if self.paths.spool else ""

    def rdma_root(self, node: str | None = None) -> str:
        """``[rdma] sysfs_root`` for ``node`` (it may hold ``{node}``: a generated tree each)."""
        return self.expand(self.rdma.sysfs_root, node)

    def has_rdma(self, node: str | None = None) -> bool:
        """Whether ``[rdma]`` is enabled and ``node`` shows RDMA devices (one ``isdir``), or
        must show some (``expected_hcas``: a node whose driver lost them all is a fault, not
        a node without a network): the network layer (its checks, series, mlx5 kernel-log
        lines, evidence) runs only then."""
        if not self.rdma.enabled:
            return False
        root = os.path.join(self.rdma_root(node), "class", "infiniband")
        return self.rdma.expected_hcas > 0 or os.path.isdir(root)


ENV_KEYS: dict[str, str] = {
    "SLURMD_NODENAME": "node.name",
    "SLURMHEALTH_NODE_NAME": "node.name",
    "SLURMHEALTH_GPU_BACKEND": "gpu.backend",
    "SLURMHEALTH_SIM_SCENARIO": "gpu.sim_scenario",
    "SLURMHEALTH_SIM_EPOCH": "gpu.sim_epoch",
    "SLURMHEALTH_SIM_KERNEL_LOG": "gpu.sim_kernel_log",
    "SLURMHEALTH_SNAPSHOT_TIMEOUT": "gpu.snapshot_timeout_s",
    "SLURMHEALTH_EXPECTED_GPUS": "gpu.expected_count",
    "SLURMHEALTH_DB": "paths.db",
    "SLURMHEALTH_SPOOL": "paths.spool",
    "SLURMHEALTH_EVIDENCE_DIR": "paths.evidence_dir",
    "SLURMHEALTH_RUN_DIR": "paths.run_dir",
    "SLURMHEALTH_KERNEL_LOG": "kernel_log.source",
    "SLURMHEALTH_POLICY": "policy.mode",
    "SLURMHEALTH_RDMA_SYSFS": "rdma.sysfs_root",
    "SLURMHEALTH_FAIL_OPEN_LOG": "metrics.fail_open_log",  # the hook wrappers' setting
    "SLURMHEALTH_PROMETHEUS_URL": "report.prometheus_url",
}

CHOICES: dict[str, tuple[str, ...]] = {
    "gpu.backend": ("nvml", "sim"),
    "policy.mode": ("drain", "warn"),
    "slurm.backend": ("cli", "pyslurm", "auto"),
    "rdma.link_layer": ("", "InfiniBand", "Ethernet"),
    "metrics.mode": ("slurmhealth", "dcgm"),
    "metrics.job_labels": ("series", "info"),
    "metrics.rdma_series": ("multi_node", "all", "none"),
}

# each field of Config names its section's class (read from this module's names, not with
# get_type_hints, which would compile every annotation at each hook's start)
_SECTIONS: dict[str, type[Any]] = {
    f.name: globals()[str(f.type)] for f in dataclasses.fields(Config) if f.name != "sources"
}


def _type_name(tp: Any) -> str:
    return {str: "a string", int: "an integer", float: "a number", bool: "true or false"}.get(
        tp, "a list of strings" if getattr(tp, "__origin__", None) is list else "a table"
    )


def _coerce(value: Any, tp: Any, source: str, key: str, from_text: bool) -> Any:
    """Check ``value`` against the field type ``tp``; text from the environment is parsed."""
    origin = getattr(tp, "__origin__", None)
    if from_text and isinstance(value, str):
        try:
            if tp is bool:
                low = value.strip().lower()
                if low not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise ValueError(value)
                return low in ("1", "true", "yes", "on")
            if tp is int:
                return int(value)
            if tp is float:
                return float(value)
            if origin is list:
                return [v.strip() for v in value.split(",") if v.strip()]
        except ValueError:
            raise ConfigError(source, key, f"expected {_type_name(tp)}, got {value!r}") from None
    ok = (
        (tp is bool and isinstance(value, bool))
        or (tp is int and isinstance(value, int) and not isinstance(value, bool))
        or (tp is float and isinstance(value, int | float) and not isinstance(value, bool))
        or (tp is str and isinstance(value, str))
        or (origin is list and isinstance(value, list) and all(isinstance(v, str) for v in value))
        or (origin is dict and isinstance(value, dict))
    )
    if not ok:
        raise ConfigError(source, key, f"expected {_type_name(tp)}, got {value!r}")
    if tp is float:
        try:
            value = float(value)
        except OverflowError:  # a 400-digit TOML integer
            raise ConfigError(source, key, f"out of range ({len(str(value))} digits)") from None
    choices = CHOICES.get(key)
    if choices and value not in choices:
        raise ConfigError(source, key, f"must be one of {', '.join(choices)}, got {value!r}")
    return value


# the field annotations the sections use, read without get_type_hints (which compiles and
# evaluates each annotation string: ~0.5 ms a field, paid by every hook that sets a key)
_FIELD_TYPES: Mapping[str, Any] = {
    "str": str,
    "int": int,
    "float": float,
    "bool": bool,
    "list[str]": list[str],
    "dict[str, int]": dict[str, int],
    "dict[str, Any]": dict[str, Any],
    "dict[str, dict[str, Any]]": dict[str, dict[str, Any]],
}


@functools.cache
def _section_fields(section: str) -> dict[str, Any]:
    cls = _SECTIONS[section]
    fields = dataclasses.fields(cls)
    if all(isinstance(f.type, str) and f.type in _FIELD_TYPES for f in fields):
        return {f.name: _FIELD_TYPES[f.type] for f in fields}  # type: ignore[index]
    return get_type_hints(cls)  # a field of another type: the slow, general way


def _shown(name: str) -> str:
    """A key from a file as an error names it: on one line, whatever the file holds."""
    return name if name.isprintable() else repr(name)


def _apply(
    values: dict[str, dict[str, Any]],
    sources: dict[str, str],
    data: Mapping[str, Any],
    source: str,
) -> None:
    for section, table in data.items():
        if section not in _SECTIONS:
            known = ", ".join(_SECTIONS)
            raise ConfigError(source, _shown(section), f"unknown section (known: {known})")
        if not isinstance(table, dict):
            raise ConfigError(source, section, "expected a table")
        fields = _section_fields(section)
        for key, value in table.items():
            dotted = f"{section}.{_shown(key)}"
            if not key.isprintable():  # the error (and `config show`) stay one line each
                raise ConfigError(source, dotted, "not a valid key name")
            if section == "checks" and key != "disabled":
                # [checks.<name>] threshold tables: the check catalog validates names and keys
                if not isinstance(value, dict):
                    raise ConfigError(source, dotted, "expected a table of thresholds")
                for tkey, tval in value.items():
                    if isinstance(tval, bool) or not isinstance(tval, int | float | str):
                        raise ConfigError(
                            source, f"{dotted}.{_shown(tkey)}", f"expected a number, got {tval!r}"
                        )
                    if not tkey.isprintable():
                        raise ConfigError(source, f"{dotted}.{tkey!r}", "not a valid key name")
                settings = dict(values["checks"].get("settings", {}))
                settings[key] = {**settings.get(key, {}), **value}
                values["checks"]["settings"] = settings
                sources[dotted] = source
                continue
            if key not in fields:
                raise ConfigError(source, dotted, f"unknown key (known: {', '.join(fields)})")
            values[section][key] = _coerce(value, fields[key], source, dotted, False)
            sources[dotted] = source


def _set_dotted(
    values: dict[str, dict[str, Any]],
    sources: dict[str, str],
    dotted: str,
    raw: Any,
    source: str,
    from_text: bool,
) -> None:
    section, key = dotted.split(".", 1)
    tp = _section_fields(section)[key]
    values[section][key] = _coerce(raw, tp, source, dotted, from_text)
    sources[dotted] = source


def read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(path, None, "file not found") from None
    except PermissionError:
        raise ConfigError(path, None, "permission denied") from None
    except IsADirectoryError:
        raise ConfigError(path, None, "is a directory, not a file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, None, f"invalid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(path, None, "not UTF-8 text") from None


def load_config(
    path: str | None = None,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Config:
    """Build the effective config. ``flags`` maps dotted keys (``paths.db``) to values."""
    env = os.environ if env is None else env
    values: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
    sources: dict[str, str] = {}
    explicit = path or env.get("SLURMHEALTH_CONFIG")
    file_path = explicit or DEFAULT_CONFIG_PATH
    if explicit or os.path.exists(file_path):
        _apply(values, sources, read_toml(file_path), file_path)
    for var, dotted in ENV_KEYS.items():
        if env.get(var, "") != "":
            _set_dotted(values, sources, dotted, env[var], f"environment {var}", True)
    for dotted, raw in (flags or {}).items():
        if raw is not None:
            _set_dotted(values, sources, dotted, raw, f"flag {dotted}", False)
    sections = {name: _SECTIONS[name](**kw) for name, kw in values.items()}
    cfg = Config(**sections, sources=sources)
    validate_ranges(cfg, env)  # ranges and cross-field rules, after the types
    return cfg


def effective_items(cfg: Config) -> list[tuple[str, Any, str]]:
    """Every setting as ``(dotted key, value, where it came from)`` for ``config show``."""
    rows: list[tuple[str, Any, str]] = []
    for section in _SECTIONS:
        obj = getattr(cfg, section)
        for f in dataclasses.fields(obj):
            if section == "checks" and f.name == "settings":
                for name, table in sorted(obj.settings.items()):
                    key = f"checks.{name}"
                    rows.append((key, table, cfg.sources.get(key, "default")))
                continue
            key = f"{section}.{f.name}"
            rows.append((key, getattr(obj, f.name), cfg.sources.get(key, "default")))
    return rows
