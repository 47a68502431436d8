"""Every command, as a new admin meets it with its output in a pipe or a log file: no line
over 200 characters (on stdout or stderr), no traceback, no internal error; and every
``--help`` has an example. The command tree is walked, so a command added later is run too
(bare, or with the arguments :data:`ARGS` gives it).

Each command runs in its own process against the simulator and a temp history, with Slurm's
commands shadowed by stubs that fail: nothing here reaches this machine's cluster.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner

from slurmhealth.cli import cli
from tests.unit.test_cli_conventions import _commands, _write_history

REPO = Path(__file__).resolve().parents[2]
MAX_LINE = 200
BURN = str(REPO / "tests" / "fixtures" / "baseline" / "gpuburn_8gpu_slow3.txt")
# the arguments a command needs to do its work here; any other command runs bare
ARGS: dict[str, tuple[str, ...]] = {
    "report": ("42",),
    "xid": ("79",),
    "resume": ("node1", "--reason", "riser reseated"),
    "baseline ingest": ("gpuburn", BURN),
    "baseline compare": ("node1",),
    "evidence show": ("42",),
    "evidence capture": ("42", "--budget", "2"),
    "incident add": ("42", "--symptom", "NCCL hang", "--root-cause", "riser"),
    "incident search": ("riser",),
    "exporter": ("--once", "--port", "0"),
    "install": ("--dry-run",),
}
DAEMONS = {"sidecar"}  # runs until its job ends: --help only
# Slurm runs these; their stderr is the node's log (slurmd's, the journal), where one record
# keeps a failed drain's whole cause: their stdout is held to the limit, their stderr not
HOOKS = {"prolog", "epilog", "healthcheck", "ctld-epilog"}
SLURM_COMMANDS = ("scontrol", "sinfo", "squeue", "sacct", "sacctmgr", "srun", "sbatch", "scancel")


@pytest.fixture
def piped_env(sim_env: Callable[..., dict[str, str]], tmp_path: Path) -> dict[str, str]:
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in SLURM_COMMANDS:
        stub = stubs / name
        stub.write_text(f"#!/bin/sh\necho '{name}: slurm_load_partitions: Unable to contact "
                        "slurm controller (connect failure)' >&2\nexit 1\n")  # fmt: skip
        stub.chmod(0o755)
    _write_history(tmp_path / "history.db")
    env = sim_env("nvlink-down", SLURMHEALTH_EVIDENCE_DIR=str(tmp_path / "evidence"))
    env.pop("COLUMNS", None)
    env["PATH"] = f"{stubs}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    return env


def _run(
    args: list[str], env: dict[str, str]
) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    proc = subprocess.run([sys.executable, "-m", "slurmhealth", *args], env=env, text=True,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=120,
                          check=False)  # fmt: skip
    return args, proc


def test_every_command_piped_has_no_line_over_200_characters(piped_env: dict[str, str]) -> None:
    runs = [[*path.split(), *ARGS.get(path, ())] for path, _cmd in _commands(cli)
            if path not in DAEMONS]  # fmt: skip
    assert {"check", "report", "drains", "history", "xid"} <= {" ".join(r[:1]) for r in runs}
    with ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda a: _run(a, piped_env), runs))
    too_long = []
    for args, proc in done:
        where = " ".join(args)
        assert "Traceback" not in proc.stderr, (where, proc.stderr[-2000:])
        assert "internal error" not in proc.stderr, (where, proc.stderr)
        streams = [("stdout", proc.stdout)] + [("stderr", proc.stderr)] * (where not in HOOKS)
        for name, stream in streams:
            too_long += [f"{where} ({name}, {len(line)}): {line}" for line in stream.splitlines()
                         if len(line) > MAX_LINE]  # fmt: skip
    assert not too_long, "\n".join(too_long)
    padded = [f"{' '.join(a)}: {line!r}" for a, p in done for line in p.stdout.splitlines()
              if line != line.rstrip()]  # fmt: skip
    assert not padded, "\n".join(padded[:5])  # rich pads a title to its table's width
    printed = {" ".join(a): p.stdout for a, p in done}
    assert "FAIL on GPU 3 (NVLink 7 inactive); 7 other GPUs passed" in printed["check"]
    assert "job 42" in printed["report 42"]  # the commands did their work, not just fail


def test_every_help_has_an_example_and_fits() -> None:
    runner = CliRunner()
    for path, _cmd in _commands(cli):
        result = runner.invoke(cli, [*path.split(), "--help"], terminal_width=200)
        assert result.exit_code == 0, (path, result.output)
        assert "Example" in result.output, f"`slurmhealth {path} --help` has no example"
        assert max(map(len, result.output.splitlines())) <= MAX_LINE, path


def test_a_piped_report_panel_is_100_columns_or_columns(piped_env: dict[str, str]) -> None:
    """The report's header panel once drew at 1,000,000 columns in a pipe."""
    _args, plain = _run(["report", "42"], piped_env)
    _args, narrow = _run(["report", "42"], {**piped_env, "COLUMNS": "72"})
    for proc, width in ((plain, 100), (narrow, 72)):
        panel = [line for line in proc.stdout.splitlines() if line.startswith(("╭", "│", "╰"))]
        assert panel and {len(line) for line in panel} == {width}, proc.stdout[:800]


def test_a_history_in_a_shared_folder_is_refused_in_one_line_with_the_fix(
    piped_env: dict[str, str], tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # as /tmp
    _args, proc = _run(["--db", str(shared / "history.db"), "history", "prune"], piped_env)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"slurmhealth: error: {shared}/history.db: {shared}: folder writable")
    fix = "give the history a folder of its own (--db /var/lib/slurmhealth/history/history.db)"
    assert "[Errno" not in line and line.endswith(f"refused: {fix}")
    assert not (shared / "history.db").exists()


def test_an_option_whose_default_is_a_config_key_shows_its_value() -> None:
    from slurmhealth.config import Config

    runner = CliRunner()
    port = runner.invoke(cli, ["exporter", "--help"], terminal_width=200).output
    assert f"(overrides metrics.port; 0: none). Default: {Config().metrics.port}." in port
    budget = runner.invoke(cli, ["evidence", "capture", "--help"], terminal_width=200).output
    assert f"(evidence.budget_s). Default: {Config().evidence.budget_s:g}." in budget
    limit = runner.invoke(cli, ["history", "--help"], terminal_width=200).output
    assert "[default: 50" in limit  # click's own, for a default the option holds
