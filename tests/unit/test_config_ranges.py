"""Config ranges and cross-field rules: a value that would silently turn a safeguard off or
make a hook outlive its wrapper is refused at load, naming the file and the key."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from slurmhealth.config import Config, load_config
from slurmhealth.config import ranges as config_ranges
from slurmhealth.config.ranges import RANGES, wrapper_timeout
from slurmhealth.errors import ConfigError
from tests.conftest import run_cli


def load(tmp_path: Path, text: str, **env: str) -> Config:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return load_config(str(path), env=env)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[policy]\ndrain_max_share = 5", "policy.drain_max_share"),  # the breaker off
        ("[policy]\ndrain_max_share = 0", "policy.drain_max_share"),
        ("[policy]\ndrain_max_share = nan", "policy.drain_max_share"),
        ("[metrics]\nport = -1", "metrics.port"),
        ("[metrics]\nport = 70000", "metrics.port"),
        ("[metrics]\ntextfile_interval_s = 0", "metrics.textfile_interval_s"),
        ("[metrics]\nmax_state_bytes = 10", "metrics.max_state_bytes"),
        ('[metrics]\nmode = "dcgm-exporter"', "metrics.mode"),
        ('[metrics]\njob_labels = "none"', "metrics.job_labels"),
        ("[sidecar]\ninterval_s = 0", "sidecar.interval_s"),
        ("[sidecar]\ninterval_s = 0.5", "sidecar.interval_s"),  # under the documented 1 s
        ("[sidecar]\nflush_every = 0", "sidecar.flush_every"),
        ("[sidecar]\nstraggler_ratio = 1.5", "sidecar.straggler_ratio"),
        ("[sidecar]\nhang_idle_pct = 101", "sidecar.hang_idle_pct"),
        ("[sidecar]\nstop_grace_s = -1", "sidecar.stop_grace_s"),
        ("[gpu]\nexpected_count = -3", "gpu.expected_count"),
        ("[gpu]\nsnapshot_timeout_s = 0", "gpu.snapshot_timeout_s"),
        ("[gpu]\nsnapshot_timeout_s = inf", "gpu.snapshot_timeout_s"),
        ("[gpu]\nsnapshot_timeout_s = 9", "gpu.snapshot_timeout_s"),  # the prolog wrapper: 8 s
        ("[kernel_log]\nbudget_s = 4\n[gpu]\nsnapshot_timeout_s = 4", "gpu.snapshot_timeout_s"),
        ("[slurm]\ncommand_timeout_s = 0", "slurm.command_timeout_s"),
        ("[slurm]\ncommand_timeout_s = 8", "slurm.command_timeout_s"),
        ("[evidence]\nsource_max_bytes = 0", "evidence.source_max_bytes"),
        ("[baseline]\nwarn_pct = 30\nfail_pct = 20", "baseline.warn_pct"),
        ("[baseline]\nprolog_bench_timeout_s = 10", "baseline.prolog_bench_timeout_s"),
        ('[gpu.nvlinks_per_model]\n"NVIDIA H100" = -1', "gpu.nvlinks_per_model.NVIDIA H100"),
        ('[gpu.nvlinks_per_model]\n"NVIDIA H100" = 1.5', "gpu.nvlinks_per_model.NVIDIA H100"),
        ('[baseline.pinned]\n"nccl.busbw" = "fast"', "baseline.pinned.nccl.busbw"),
        ('[baseline.pinned]\n"nccl.busbw" = 0', "baseline.pinned.nccl.busbw"),
        ("[checks.thermal]\nwarn_celsius = nan", "checks.thermal.warn_celsius"),
        ("[checks.thermal]\nwarn_celsius = " + "9" * 400, "checks.thermal.warn_celsius"),
        ("[gpu]\nsnapshot_timeout_s = " + "9" * 400, "gpu.snapshot_timeout_s"),
        ("[metrics]\nport = " + "9" * 400, "metrics.port"),
        ("[report]\nprometheus_timeout_s = 0", "report.prometheus_timeout_s"),
        ('[report]\nprometheus_url = "prometheus:9090"', "report.prometheus_url"),
        ('[report]\nprometheus_url = "ftp://prometheus:9090"', "report.prometheus_url"),
        ('[report]\nprometheus_url = "http://"', "report.prometheus_url"),
        ('[report]\nprometheus_url = "http://p:99999"', "report.prometheus_url"),
        ('[report]\nprometheus_url = "http://p:90/?x=1"', "report.prometheus_url"),
        ('[report]\nprometheus_url = "http://p:90/a b"', "report.prometheus_url"),
        ('[report]\nprometheus_url = "http://me:secret@p:90"', "report.prometheus_url"),
    ],
)
def test_each_bad_value_names_the_file_and_the_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, text)
    assert (err.value.source, err.value.key) == (str(tmp_path / "config.toml"), key)


def test_the_defaults_and_the_shipped_settings_pass(tmp_path: Path) -> None:
    cfg = load(tmp_path, "")
    assert cfg.sidecar.interval_s == 10.0
    sane = load(tmp_path, '[sidecar]\ninterval_s = 1\n[metrics]\nport = 0\nmode = "dcgm"\n')
    assert sane.metrics.port == 0 and sane.metrics.mode == "dcgm"


def test_prometheus_urls_that_name_a_server_pass(tmp_path: Path) -> None:
    assert load(tmp_path, "").report.prometheus_url == ""  # no Prometheus asked
    for url in ("http://prometheus:9090", "https://p.example.org/prom/", "http://[::1]:9090"):
        assert load(tmp_path, f'[report]\nprometheus_url = "{url}"').report.prometheus_url == url
    env_url = load(tmp_path, "", SLURMHEALTH_PROMETHEUS_URL="http://p:9090").report
    assert env_url.prometheus_url == "http://p:9090"


def test_a_bad_prometheus_url_is_one_line_without_its_password(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, '[report]\nprometheus_url = "http://me:secret@p:90\\nx"')
    assert "\n" not in str(err.value) and "secret" not in str(err.value)
    with pytest.raises(ConfigError, match=r"report\.prometheus_url: expected an http"):
        load(tmp_path, "", SLURMHEALTH_PROMETHEUS_URL="gopher://p")


def test_a_value_from_the_environment_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, "", SLURMHEALTH_SNAPSHOT_TIMEOUT="0")
    assert err.value.source == "environment SLURMHEALTH_SNAPSHOT_TIMEOUT"
    assert err.value.key == "gpu.snapshot_timeout_s"
    with pytest.raises(ConfigError, match=r"gpu\.expected_count"):
        load(tmp_path, "", SLURMHEALTH_EXPECTED_GPUS="-1")


def test_hook_steps_must_fit_the_wrapper_timeout_from_the_environment(tmp_path: Path) -> None:
    """The wrappers export what they read from their env file; slurmhealth sees the same."""
    wide = {"SLURMHEALTH_PROLOG_TIMEOUT": "15", "SLURMHEALTH_EPILOG_TIMEOUT": "30"}
    assert load(tmp_path, "[gpu]\nsnapshot_timeout_s = 9\n[slurm]\nprolog_budget_s = 12", **wide)
    with pytest.raises(ConfigError) as err:
        load(tmp_path, "", SLURMHEALTH_PROLOG_TIMEOUT="4")  # the default 3 s snapshot
    assert err.value.source == "environment SLURMHEALTH_PROLOG_TIMEOUT"
    assert "gpu.snapshot_timeout_s 3 s + kernel_log.budget_s 1 s" in str(err.value)
    with pytest.raises(ConfigError, match="epilog wrapper") as err:
        load(tmp_path, "", SLURMHEALTH_EPILOG_TIMEOUT="4")
    assert "gpu.snapshot_timeout_s 3 s + kernel_log.budget_s 1 s must be shorter" in str(err.value)
    # the sidecar's final flush and the evidence run detached: they need not fit the epilog
    long = "[sidecar]\nstop_grace_s = 30\n[evidence]\nbudget_s = 60"
    assert load(tmp_path, long, SLURMHEALTH_EPILOG_TIMEOUT="12")
    with pytest.raises(ConfigError, match="SLURMHEALTH_PROLOG_TIMEOUT"):
        load(tmp_path, "", SLURMHEALTH_PROLOG_TIMEOUT="soon")
    assert wrapper_timeout({"SLURMHEALTH_EPILOG_TIMEOUT": "1m"}, "epilog") == (
        60.0,
        "SLURMHEALTH_EPILOG_TIMEOUT",
    )
    assert wrapper_timeout({}, "prolog") == (8.0, "SLURMHEALTH_PROLOG_TIMEOUT default")


def test_the_prolog_budget_leaves_the_snapshot_its_whole_deadline(tmp_path: Path) -> None:
    """A snapshot deadline the budget must shorten turns a hung GPU into a fail-open."""
    with pytest.raises(ConfigError, match=r"shorter than slurm\.prolog_budget_s") as err:
        load(tmp_path, "[gpu]\nsnapshot_timeout_s = 5\n[slurm]\nprolog_budget_s = 4")
    assert err.value.key == "gpu.snapshot_timeout_s"
    with pytest.raises(ConfigError, match="prolog wrapper"):
        load(tmp_path, "[slurm]\nprolog_budget_s = 8")  # the wrapper's default 8 s


def test_the_documented_wrapper_defaults_are_the_scripts_defaults() -> None:
    root = Path(__file__).resolve().parents[2]
    for hook, (var, default) in config_ranges.WRAPPER_TIMEOUTS.items():
        script = (root / hook / f"slurmhealth-{hook}").read_text()
        assert f"T=${{{var}:-{default:g}}}" in script


def test_every_numeric_setting_has_a_range() -> None:
    """A new numeric field without a range would only get the loose fallback."""
    missing = []
    for section in dataclasses.fields(Config):
        obj = section.default_factory() if callable(section.default_factory) else None
        if section.name in ("checks", "sources") or not dataclasses.is_dataclass(obj):
            continue
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            if numeric and f"{section.name}.{f.name}" not in RANGES:
                missing.append(f"{section.name}.{f.name}")
    assert missing == []
    for key, bound in RANGES.items():
        section, name = key.split(".")
        default = getattr(getattr(Config(), section), name)
        values = default.values() if isinstance(default, dict) else [default]
        assert all(bound.allows(v) for v in values), key


def test_config_check_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURMHEALTH_", "SLURM"))}
    env |= {"SLURMHEALTH_CONFIG": str(path), "SLURMHEALTH_DB": str(tmp_path / "h.db")}
    for text, key in [
        ("[policy]\ndrain_max_share = 5\n", "policy.drain_max_share"),
        ("[metrics]\nport = 70000\n", "metrics.port"),
        ("[gpu]\nsnapshot_timeout_s = 30.0\n", "gpu.snapshot_timeout_s"),
    ]:
        path.write_text(text)
        proc = run_cli("config", "check", env=env)
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.strip().splitlines()
        assert str(path) in line and key in line and "Traceback" not in proc.stderr
    path.write_text("[policy]\ndrain_max_share = 1.0\n")
    proc = run_cli("config", "check", env=env)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    "text", ['[gpu]\n"a\\nb" = 1', '["x\\ny"]\na = 1', '[checks.thermal]\n"t\\rx" = 1']
)
def test_a_key_with_a_newline_still_gives_one_line(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, text)
    assert "\n" not in str(err.value) and "\r" not in str(err.value)


def test_the_field_types_read_fast_are_the_annotations() -> None:
    from typing import get_type_hints

    from slurmhealth.config import _SECTIONS, _section_fields

    for name, cls in _SECTIONS.items():
        assert _section_fields(name) == get_type_hints(cls), name


def test_the_sections_read_fast_are_the_annotations() -> None:
    from typing import get_type_hints

    from slurmhealth.config import _SECTIONS

    hints = get_type_hints(Config)
    assert {name: tp for name, tp in hints.items() if name != "sources"} == _SECTIONS
