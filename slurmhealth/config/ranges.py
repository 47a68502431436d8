"""Ranges and cross-field rules of the config, checked after the types (``config/__init__.py``).

Every numeric setting has a range here; a value outside it (NaN and infinity included)
is a :class:`ConfigError` naming the file (or environment variable, or flag) and the key,
so ``slurmhealth config check`` exits 2 with one line, and so does every command loading it.

The hooks run inside the wrappers' timeouts (``prolog/slurmhealth-prolog``,
``epilog/slurmhealth-epilog``): ``SLURMHEALTH_PROLOG_TIMEOUT`` (default 8 s) and
``SLURMHEALTH_EPILOG_TIMEOUT`` (default 20 s), set in the environment or in the env file the
wrappers read and export. The steps each hook takes one after the other must fit inside.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from slurmhealth.config.timeparse import duration_s
from slurmhealth.errors import ConfigError

if TYPE_CHECKING:
    from slurmhealth.config.sections import ReportConfig


class _Checks(Protocol):
    @property
    def settings(self) -> Mapping[str, Mapping[str, Any]]: ...


class Config(Protocol):
    """What the range check reads of a loaded config (``slurmhealth.config.Config``, which
    imports this module: named here by its shape, so the two import nothing of each other):
    its sections as dataclass fields, and which file, variable or flag set each value."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    @property
    def checks(self) -> _Checks: ...
    @property
    def report(self) -> ReportConfig: ...
    @property
    def sources(self) -> Mapping[str, str]: ...


WRAPPER_TIMEOUTS: Mapping[str, tuple[str, float]] = {
    "prolog": ("SLURMHEALTH_PROLOG_TIMEOUT", 8.0),
    "epilog": ("SLURMHEALTH_EPILOG_TIMEOUT", 20.0),
}
DAY = 86400.0


@dataclass(frozen=True)
class Bound:
    """``low <= value <= high``; with ``low_open`` the value must be above ``low``."""

    low: float
    high: float
    low_open: bool = False

    def allows(self, value: float) -> bool:  # NaN is never allowed: it compares False
        above = value > self.low if self.low_open else value >= self.low
        return above and value <= self.high

    def __str__(self) -> str:
        low, high = _number_text(self.low), _number_text(self.high)
        return f"{'(' if self.low_open else '['}{low}, {high}]"


def _number_text(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


POSITIVE_S = Bound(0, 30 * DAY, low_open=True)  # a timeout or a window: above 0

RANGES: Mapping[str, Bound] = {
    "gpu.sim_epoch": Bound(0, 1e11),  # 0 = the scenario file's mtime
    "gpu.snapshot_timeout_s": POSITIVE_S,
    "gpu.expected_count": Bound(0, 1024),
    "gpu.nvlinks_per_model": Bound(0, 64),  # each model's value
    "paths.spool_max_bytes": Bound(4096, 2**40),  # never unbounded
    "history.raw_samples_days": Bound(0, 36_500),  # 0 = forever
    "history.rollups_days": Bound(0, 36_500),
    "history.records_days": Bound(0, 36_500),
    "history.prune_max_rows": Bound(1000, 1e9),
    "kernel_log.lookback_s": Bound(0, 365 * DAY),
    "kernel_log.budget_s": POSITIVE_S,
    "policy.drain_max_share": Bound(0, 1, low_open=True),
    "slurm.command_timeout_s": POSITIVE_S,
    "slurm.prolog_budget_s": POSITIVE_S,
    "sidecar.interval_s": Bound(1, DAY),  # the documented minimum is 1 s
    "sidecar.flush_every": Bound(1, 10_000),
    "sidecar.job_dir_max_bytes": Bound(1 << 20, 1 << 40),
    "sidecar.job_check_interval_s": Bound(1, 30 * DAY),
    "sidecar.unseen_grace_s": Bound(1, 30 * DAY),
    "sidecar.hang_after_s": POSITIVE_S,
    "sidecar.hang_idle_pct": Bound(0, 100),
    "sidecar.straggler_ratio": Bound(0, 1, low_open=True),
    "sidecar.straggler_window_s": POSITIVE_S,
    "sidecar.throttle_sustain_s": POSITIVE_S,
    "sidecar.throughput_drop": Bound(0, 1, low_open=True),
    "sidecar.stall_factor": Bound(1, 1e6),
    "sidecar.stall_min_s": Bound(0, 30 * 86400),
    "sidecar.stop_grace_s": POSITIVE_S,
    "metrics.port": Bound(0, 65535),
    "metrics.textfile_interval_s": Bound(1, DAY),
    "metrics.max_jobs": Bound(1, 100_000),
    "metrics.max_state_bytes": Bound(4096, 1024**3),
    "metrics.final_linger_s": Bound(0, DAY),
    "metrics.header_timeout_s": Bound(0.1, 600),
    "metrics.max_connections": Bound(1, 1_000_000),
    "metrics.max_requests": Bound(1, 100_000),
    "metrics.http_workers": Bound(1, 256),
    "evidence.source_timeout_s": POSITIVE_S,
    "evidence.source_max_bytes": Bound(1, 1 << 40),
    "evidence.budget_s": POSITIVE_S,
    "evidence.nccl_tail_kib": Bound(0, 1 << 20),
    "evidence.nccl_max_files": Bound(0, 10_000),
    "evidence.drop_max_files": Bound(0, 1000),
    "evidence.drop_kib": Bound(0, 1 << 20),
    "evidence.output_tail_kib": Bound(0, 1 << 20),
    "evidence.kernel_margin_s": Bound(0, 30 * DAY),
    "evidence.summary_log_kib": Bound(0, 1 << 10),
    "evidence.max_age_days": Bound(0, 36_500),  # 0 = no age limit
    "evidence.max_total_gb": Bound(0, 1e9),  # 0 = no size limit
    "baseline.warn_pct": Bound(0, 1e6, low_open=True),
    "baseline.fail_pct": Bound(0, 1e6, low_open=True),
    "baseline.outlier_fraction": Bound(0, 1, low_open=True),
    "baseline.pinned": Bound(0, 1e30, low_open=True),  # each pinned reference value
    "baseline.validate_timeout_s": POSITIVE_S,
    "baseline.prolog_bench_max_age_s": Bound(0, 365 * DAY),  # 0 = never
    "baseline.prolog_bench_timeout_s": POSITIVE_S,
    "rdma.expected_hcas": Bound(0, 64),
    "rdma.expected_rate_gbps": Bound(0, 3200),  # XDR 8X = 1600 Gb/s; room for the next
    "report.prometheus_timeout_s": Bound(0, 3600, low_open=True),
    "remediate.max_attempts": Bound(1, 100),
    "remediate.window_s": POSITIVE_S,
    "remediate.max_concurrent": Bound(1, 100_000),
    "remediate.max_fraction": Bound(0, 1, low_open=True),
    "remediate.bug_report_timeout_s": POSITIVE_S,
}
"""The range of every numeric setting; for a table (``*.nvlinks_per_model``, ``pinned``)
the range of each of its values."""

FALLBACK = Bound(0, 1e18)  # a numeric setting missing from RANGES (a test flags it)
INTEGER_TABLES = frozenset({"gpu.nvlinks_per_model"})


def validate(cfg: Config, env: Mapping[str, str]) -> None:
    """Raise :class:`ConfigError` for the first value out of range or rule broken."""
    for section in dataclasses.fields(cfg):
        values = getattr(cfg, section.name)
        if section.name != "checks" and dataclasses.is_dataclass(values):
            for key, value in vars(values).items():
                _check_value(cfg, f"{section.name}.{key}", value)
    for check, table in cfg.checks.settings.items():
        for key, value in table.items():
            if isinstance(value, int | float) and not _finite(value):
                where = f"checks.{check}"
                _fail(cfg, f"{where}.{key}", f"must be finite, got {value}", where)
    _cross_rules(cfg, env)


def _finite(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float
        return False


def _check_value(cfg: Config, dotted: str, value: Any) -> None:
    if isinstance(value, dict) and dotted in RANGES:  # a table of numbers
        kind = int if dotted in INTEGER_TABLES else int | float
        for name, item in value.items():
            entry = f"{dotted}.{name if str(name).isprintable() else repr(name)}"
            if isinstance(item, bool) or not isinstance(item, kind):
                what = "an integer" if kind is int else "a number"
                _fail(cfg, entry, f"expected {what}, got {item!r}", dotted)
            _check_number(cfg, entry, item, RANGES[dotted], dotted)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _check_number(cfg, dotted, value, RANGES.get(dotted, FALLBACK), dotted)


def _check_number(cfg: Config, dotted: str, value: float, bound: Bound, origin: str) -> None:
    if not bound.allows(value):
        _fail(cfg, dotted, f"must be in {bound}, got {value!r}", origin)


def _cross_rules(cfg: Config, env: Mapping[str, str]) -> None:
    for low, high in (("baseline.warn_pct", "baseline.fail_pct"),):
        low_v, high_v = _value(cfg, low), _value(cfg, high)
        if low_v > high_v:
            _blame(cfg, [low, high], f"{low_v:g} is above {high} {high_v:g}")
    snapshot, klog = ("gpu.snapshot_timeout_s", "kernel_log.budget_s")
    # the prolog decides from one snapshot and one kernel-log read, then calls Slurm
    _fits(cfg, env, "prolog", [snapshot, klog])
    _fits(cfg, env, "prolog", ["slurm.command_timeout_s"])
    # the prolog's own budget ends before the wrapper kills it, and leaves the snapshot
    # its whole deadline (a shortened one turns a hung GPU into a fail-open, not a drain)
    _fits(cfg, env, "prolog", ["slurm.prolog_budget_s"])
    if _value(cfg, snapshot) >= _value(cfg, "slurm.prolog_budget_s"):
        _blame(cfg, [snapshot, "slurm.prolog_budget_s"],
               f"{snapshot} must be shorter than slurm.prolog_budget_s")  # fmt: skip
    _fits(cfg, env, "prolog", ["baseline.prolog_bench_timeout_s"])
    # the epilog signals the sidecar, checks the GPUs and returns; the sidecar's final flush
    # (sidecar.stop_grace_s) and the evidence (evidence.budget_s) follow detached from it
    _fits(cfg, env, "epilog", [snapshot, klog])
    if (problem := url_problem(cfg.report.prometheus_url)) is not None:
        _fail(cfg, "report.prometheus_url", problem)


def url_problem(url: str) -> str | None:
    """Why ``url`` is no base URL of an HTTP service ("" is: none configured), or None. A
    URL with credentials is never shown (the message may land in a log)."""
    if url == "":
        return None
    import urllib.parse  # only where a URL is set: a prolog's config has none

    try:
        parts = urllib.parse.urlsplit(url)
        if parts.username is not None or parts.password is not None:
            return "expected a URL without user:password@ (credentials are not supported)"
        parts.port  # noqa: B018 (raises on a port that is no number)
    except ValueError:
        parts = None
    shown = repr(url) if url.isprintable() else ascii(url)
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        return f"expected an http:// or https:// URL with a host, got {shown}"
    if any(c.isspace() or not c.isprintable() for c in url) or parts.query or parts.fragment:
        return f"expected a base URL (no spaces, query or fragment), got {shown}"
    return None


def _value(cfg: Config, dotted: str) -> float:
    section, key = dotted.split(".")
    return float(getattr(getattr(cfg, section), key))


def _fits(cfg: Config, env: Mapping[str, str], hook: str, keys: list[str]) -> None:
    """The steps, one after the other, must end before the hook's wrapper kills it."""
    limit, where = wrapper_timeout(env, hook)
    if math.fsum(_value(cfg, k) for k in keys) < limit:
        return
    parts = " + ".join(f"{k} {_value(cfg, k):g} s" for k in keys)
    problem = f"{parts} must be shorter than the {hook} wrapper's timeout ({limit:g} s, {where})"
    _blame(cfg, keys, problem, fallback=f"environment {WRAPPER_TIMEOUTS[hook][0]}")


def wrapper_timeout(env: Mapping[str, str], hook: str) -> tuple[float, str]:
    """The ``hook`` wrapper's timeout in seconds and where it comes from."""
    var, default = WRAPPER_TIMEOUTS[hook]
    text = env.get(var, "")
    if not text:
        return default, f"{var} default"
    seconds = duration_s(text)  # the wrappers hand it to timeout(1): the same grammar
    if seconds is None or seconds <= 0:
        raise ConfigError(f"environment {var}", None, f"expected seconds (e.g. 8), got {text!r}")
    return seconds, var


def _fail(cfg: Config, dotted: str, problem: str, table: str = "") -> None:
    """Raise for ``dotted``, naming the file (or variable, or flag) that set it or its table."""
    source = cfg.sources.get(dotted) or cfg.sources.get(table) or "defaults"
    raise ConfigError(source, dotted, problem)


def _blame(cfg: Config, keys: list[str], problem: str, fallback: str = "defaults") -> None:
    """Raise for the first of ``keys`` that a file, variable or flag set (where to fix it),
    else for the first key, naming ``fallback``."""
    key = next((k for k in keys if k in cfg.sources), keys[0])
    raise ConfigError(cfg.sources.get(key, fallback), key, problem)
