"""The `slurmhealth` command as an operator runs it: real processes, exit codes, output."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import click
import pytest

from tests.conftest import run_cli


def test_healthy_node_exits_0(sim_env) -> None:
    proc = run_cli("check", "--json", env=sim_env("healthy"))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["status"] == "ok" and data["findings"] == []
    assert [g["index"] for g in data["gpus"]] == list(range(8))


def test_nvlink_down_names_gpu_uuid_and_link(sim_env) -> None:
    proc = run_cli("check", "--json", env=sim_env("nvlink-down"))
    assert proc.returncode == 1, proc.stderr
    data = json.loads(proc.stdout)
    (f,) = data["findings"]
    gpu3 = next(g for g in data["gpus"] if g["index"] == 3)
    assert f["check"] == "nvlink_inactive" and f["severity"] == "fail"
    assert f["gpu"] == 3 and f["uuid"] == gpu3["uuid"] and f["uuid"].startswith("GPU-")
    assert f["evidence"]["link"] == 7
    assert f["action"] == "drain"


def test_table_output_and_gpu_selection(sim_env) -> None:
    env = sim_env("nvlink-down")
    proc = run_cli("check", "--gpus", "0,1", env=env)
    assert proc.returncode == 0, proc.stderr  # GPU 3 not asked for
    proc = run_cli("check", "--gpus", "2-3", env={**env, "COLUMNS": "200"})
    assert proc.returncode == 1
    assert "nvlink_inactive" in proc.stdout and "NVLink 7 inactive" in proc.stdout
    assert "hint:" in proc.stdout


def test_check_is_recorded_in_history(sim_env) -> None:
    env = sim_env("ecc-uncorrectable")
    assert run_cli("check", env=env).returncode == 1
    proc = run_cli("history", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    (run,) = json.loads(proc.stdout)["runs"]
    assert run["status"] == "fail" and run["node"] == "node1" and run["phase"] == "check"
    (finding,) = run["findings"]
    assert finding["check_name"] == "ecc_uncorrectable" and finding["gpu"] == 1
    table = run_cli("history", "--node", "node1", "--since", "1h", env={**env, "COLUMNS": "200"})
    assert "ecc_uncorrectable" in table.stdout
    assert json.loads(run_cli("history", "--node", "other", "--json", env=env).stdout)["runs"] == []


def test_xid_fires_once(sim_env) -> None:
    env = sim_env("xid-gsp-timeout")
    first = json.loads(run_cli("check", "--json", env=env).stdout)
    assert [f["evidence"]["xid"] for f in first["findings"]] == [119]
    second = run_cli("check", "--json", env=env)
    assert second.returncode == 0  # the cursor in the history: an old Xid never fires twice
    assert json.loads(second.stdout)["findings"] == []


def test_unwritable_history_keeps_exit_code_and_spools(sim_env, tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the database directory should be")
    db = blocker / "history.db"
    spool = tmp_path / "spool.jsonl"
    env = sim_env("nvlink-down", SLURMHEALTH_DB=str(db), SLURMHEALTH_SPOOL=str(spool))
    proc = run_cli("check", "--json", env=env)
    assert proc.returncode == 1  # same decision as with a working history
    assert json.loads(proc.stdout)["recorded"] is False
    assert spool.exists() and "nvlink_inactive" in spool.read_text()
    assert "Traceback" not in proc.stderr
    blocker.unlink()
    blocker.mkdir()
    assert run_cli("check", env=env).returncode == 1
    assert not spool.exists()
    runs = json.loads(run_cli("history", "--json", env=env).stdout)["runs"]
    assert len(runs) == 2 and all(r["findings"] for r in runs)
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


@pytest.mark.parametrize(
    ("content", "key"),
    [
        ("[gpu\nbackend = 'sim'", "invalid TOML"),
        ("[gpu]\nbackend = 'sim'\nfrobnicate = 1\n", "gpu.frobnicate"),
        ("[gpu]\nsnapshot_timeout_s = 'fast'\n", "gpu.snapshot_timeout_s"),
        ("[gpu]\nbackend = 'cuda'\n", "gpu.backend"),
        ("[nonsense]\nx = 1\n", "nonsense"),
        ("[checks.thermal_margin]\nwarn_celsius = 3\n", "checks.thermal_margin.warn_celsius"),
        ("[checks.no_such_check]\nx = 1\n", "checks.no_such_check"),
    ],
)
def test_bad_config_is_one_line_exit_2(sim_env, tmp_path: Path, content: str, key: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(content)
    env = sim_env("healthy", SLURMHEALTH_CONFIG=str(cfg))
    for args in (("check",), ("config", "check")):
        proc = run_cli(*args, env=env)
        assert proc.returncode == 2, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert str(cfg) in lines[0] and key in lines[0]
        assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("content", "key"),
    [
        ("[gpu.3]\nnvlink.7.state = 'broken'\n", "gpu.3.nvlink.7.state"),
        ("[gpu.9]\ntemperature = 40\n", "gpu.9"),
        ("[gpu.1]\ntemperature = 'hot'\n", "gpu.1.temperature"),
        ("gpus = 8\nwhatever = 1\n", "whatever"),
        ("[[faults]]\nat = 0\n", "faults[0]"),
        ("[gpu.1\n", "invalid TOML"),
    ],
)
def test_malformed_scenario_is_one_line_exit_2(
    sim_env, tmp_path: Path, content: str, key: str
) -> None:
    scenario = tmp_path / "broken.toml"
    scenario.write_text(content)
    proc = run_cli("check", env=sim_env(scenario))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(scenario) in lines[0] and key in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_usage_errors_exit_2(sim_env) -> None:
    env = sim_env("healthy")
    proc = run_cli("check", "--gpus", "zero", env=env)
    assert proc.returncode == 2 and "--gpus" in proc.stderr
    assert run_cli("check", "--frob", env=env).returncode == 2
    proc = run_cli("history", "--since", "yesterday-ish", env=env)
    assert proc.returncode == 2 and "--since" in proc.stderr


def test_missing_nvml_is_a_clear_error(sim_env) -> None:
    env = sim_env("healthy", SLURMHEALTH_GPU_BACKEND="nvml")
    proc = run_cli("check", env=env)
    assert proc.returncode == 3
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "NVML did not start" in lines[0] and "driver" in lines[0]
    assert "Traceback" not in proc.stderr
    assert "Traceback" in run_cli("--debug", "check", env=env).stderr


def test_config_show_says_where_values_come_from(sim_env, tmp_path: Path) -> None:
    cfg = tmp_path / "site.toml"
    cfg.write_text("[gpu]\nsnapshot_timeout_s = 3\n[checks.thermal_margin]\nwarn_c = 8\n")
    env = sim_env("healthy", SLURMHEALTH_CONFIG=str(cfg))
    proc = run_cli("--db", str(tmp_path / "flag.db"), "config", "show", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["schema"] == "slurmhealth.config/1"
    shown = out["values"]
    assert shown["gpu.snapshot_timeout_s"] == {"value": 3.0, "source": str(cfg)}
    assert shown["gpu.backend"]["source"] == "environment SLURMHEALTH_GPU_BACKEND"
    assert shown["paths.db"] == {"value": str(tmp_path / "flag.db"), "source": "flag paths.db"}
    assert shown["kernel_log.lookback_s"]["source"] == "default"
    assert shown["checks.thermal_margin"]["value"] == {"warn_c": 8}
    ok = run_cli("config", "check", env=env)
    assert ok.returncode == 0 and str(cfg) in ok.stdout


def test_threshold_from_config_changes_the_verdict(sim_env, tmp_path: Path) -> None:
    scenario = tmp_path / "warm.toml"
    scenario.write_text("[gpu.2]\nmargin_temperature = 7\n")
    env = sim_env(scenario)
    assert json.loads(run_cli("check", "--json", env=env).stdout)["findings"] == []
    cfg = tmp_path / "strict.toml"
    cfg.write_text("[checks.thermal_margin]\nwarn_c = 10\nfail_c = 8\n")
    proc = run_cli("check", "--json", env={**env, "SLURMHEALTH_CONFIG": str(cfg)})
    assert proc.returncode == 1
    (f,) = json.loads(proc.stdout)["findings"]
    assert f["check"] == "thermal_margin" and f["gpu"] == 2


def test_checks_lists_the_catalog(sim_env) -> None:
    proc = run_cli("checks", "--json", env=sim_env())
    listed = json.loads(proc.stdout)
    assert listed["schema"] == "slurmhealth.checks/1"
    checks = {c["name"]: c for c in listed["checks"]}
    expected = {
        "gpu_count", "gpu_lost", "gpu_unresponsive", "ecc_uncorrectable", "row_remap",
        "nvlink_inactive", "nvlink_errors", "pcie_link", "clock_events", "thermal_margin",
        "persistence_mode", "stale_job", "fabric_state", "driver_version", "xid",
    }  # fmt: skip
    assert expected <= set(checks)
    assert checks["nvlink_errors"]["thresholds"]["replay_per_min"] == 1
    assert all(c["description"] and c["hint"] and c["action"] for c in checks.values())
    table = run_cli("checks", env={**sim_env(), "COLUMNS": "250"})
    assert "thermal_margin" in table.stdout and "warn_c=5" in table.stdout


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> dict[str, click.Command]:
    ctx = click.Context(group)
    out: dict[str, click.Command] = {}
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None, f"slurmhealth {' '.join((*prefix, name))} does not load"
        out[" ".join((*prefix, name))] = cmd
        if isinstance(cmd, click.Group):
            out.update(_commands(cmd, (*prefix, name)))
    return out


def test_every_command_has_help() -> None:
    from slurmhealth.cli import cli

    commands = _commands(cli)
    assert {"check", "prolog", "epilog", "sidecar", "report", "evidence capture"} <= set(commands)
    for path, cmd in commands.items():
        assert cmd.help, f"slurmhealth {path} has no help text"
        for param in cmd.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert param.help, f"slurmhealth {path} {param.opts[0]} has no help text"


def test_listing_commands_share_one_json_flag() -> None:
    from slurmhealth.cli import cli

    commands = _commands(cli)
    json_opts = {
        path: opt
        for path, cmd in commands.items()
        for opt in cmd.params
        if isinstance(opt, click.Option) and "--json" in opt.opts and not opt.hidden
    }  # (a group's hidden --json stands for its command's: `slurmhealth config --json show`)
    listing = {"check", "checks", "history", "drains", "nodes", "report", "config show",
               "evidence list", "evidence show", "baseline show", "incident search"}  # fmt: skip
    assert listing <= set(json_opts)
    assert {(o.name, o.is_flag, o.help) for o in json_opts.values()} == {
        ("as_json", True, "Print JSON instead of text.")
    }


def test_prolog_loads_only_its_own_command_module() -> None:
    """`slurmhealth prolog` runs before every job: it must not import every command."""
    code = (
        "import sys, click; from slurmhealth.cli import cli; "
        "cli.get_command(click.Context(cli), 'prolog'); "
        "print(' '.join(m for m in sys.modules if m.startswith('slurmhealth.cli.')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(proc.stdout.split())
    assert "slurmhealth.cli.hooks" in loaded
    assert not loaded & {"slurmhealth.cli.report", "slurmhealth.cli.baseline",
                         "slurmhealth.cli.evidence", "slurmhealth.cli.check"}  # fmt: skip


def test_lost_gpu_is_named_by_its_last_known_identity(sim_env, tmp_path: Path) -> None:
    healthy = json.loads(run_cli("check", "--json", env=sim_env("healthy")).stdout)
    gpu5 = next(g for g in healthy["gpus"] if g["index"] == 5)
    proc = run_cli("check", "--json", env=sim_env("gpu-lost"))
    assert proc.returncode == 1
    findings = json.loads(proc.stdout)["findings"]
    lost = next(f for f in findings if f["check"] == "gpu_lost")
    xid = next(f for f in findings if f["check"] == "xid")
    # NVML cannot read GPU 5 now; the history remembers which card it is
    assert lost["gpu"] == 5 and lost["uuid"] == gpu5["uuid"]
    assert xid["gpu"] == 5 and xid["evidence"]["xid"] == 79
