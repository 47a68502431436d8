"""The conventions every command keeps, through click's CliRunner and the real entry point
(``main``: exit codes and one-line errors): ``--json`` with a ``schema`` everywhere, global
flags anywhere, ``--quiet``, plain piped output whose table rows stay one line up to 200
columns, ``NO_COLOR``,
Ctrl-C, and bad input refused in one line before anything is recorded."""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from slurmhealth.cli import cli, main
from slurmhealth.history import Batch, History
from slurmhealth.history.schema import latest_version

REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[")
LONG_REASON = "slurmhealth: nvlink_inactive gpu3 " + "NVLink 7 inactive since the riser move " * 4
WIDE_REASON = "slurmhealth: nvlink_inactive gpu2 NVLink 5 inactive since the riser move (+1 more)"


@dataclass(frozen=True)
class Ran:
    exit_code: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


@pytest.fixture
def sh(sim_env: Callable[..., dict[str, str]]) -> Callable[..., Ran]:
    """``sh(*args, scenario=..., color=False, **env)``: ``slurmhealth ARGS`` through
    ``main`` in CliRunner's isolation (stdout is not a terminal unless ``color``)."""

    def run(*args: str, scenario: str = "healthy", color: bool = False, **env: str) -> Ran:
        root = logging.getLogger()
        level, handlers = root.level, list(root.handlers)
        try:
            return _main(args, scenario, color, env)
        finally:  # --quiet and --debug set the process's root logger: not for later tests
            root.setLevel(level)
            root.handlers[:] = handlers

    def _main(args: tuple[str, ...], scenario: str, color: bool, env: dict[str, str]) -> Ran:
        runner = CliRunner()
        with runner.isolation(env=sim_env(scenario, **env), color=color) as (out, err, _):
            try:
                main(list(args))
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except Exception:  # --debug: main lets it through; Python prints it and exits 1
                if "--debug" not in args:
                    raise  # without --debug, main turns every error into its exit code
                sys.stderr.write(traceback.format_exc())
                code = 1
            sys.stdout.flush()  # what print_json wrote without click.echo's flush
            sys.stderr.flush()
            return Ran(code, out.getvalue().decode(), err.getvalue().decode())

    return run


def _commands(
    group: click.Group, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[str, click.Command]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*prefix, name))
        if not isinstance(cmd, click.Group) or cmd.invoke_without_command:
            yield " ".join((*prefix, name)), cmd


def test_every_command_that_prints_has_json() -> None:
    """Only the hooks Slurm runs for their exit code and the daemons print no result (the
    exporter, where there is one, prints Prometheus' own format)."""
    without = {path for path, cmd in _commands(cli)
               if not any("--json" in getattr(p, "opts", ()) for p in cmd.params)}  # fmt: skip
    hooks = {"prolog", "epilog", "ctld-epilog", "sidecar", "epilog-finish"}
    assert hooks <= without <= {*hooks, "exporter"}


def _write_history(db: Path) -> None:
    run = {"run_id": "r1", "ts": 1.0e9, "node": "node1", "job_id": "42", "phase": "prolog",
           "status": "fail", "exit_code": 1, "duration_s": 0.1}  # fmt: skip
    drain = {
        "ts": 1.0e9,
        "node": "node1",
        "job_id": "42",
        "run_id": "r1",
        "state": "drained",
        "reason": LONG_REASON,
        "actor": "slurmhealth prolog",
        "detail": {"note": ""},
    }
    job = {"job_id": "42", "node": "node1", "user": "root", "uid": 0, "start_ts": 1.0e9}
    wide = {**drain, "node": "node2", "reason": WIDE_REASON}
    with History(db) as history:
        assert history.write(Batch(inserts=[("check_runs", run), ("drains", drain),
                                            ("drains", wide)],
                                   upserts=[("jobs", job, "job_id")]))  # fmt: skip


@pytest.mark.parametrize(
    ("args", "schema"),
    [
        (("check",), "slurmhealth.check/1"),
        (("checks",), "slurmhealth.checks/1"),
        (("config", "show"), "slurmhealth.config/1"),
        (("config", "check"), "slurmhealth.config-check/1"),
        (("history",), "slurmhealth.history/1"),
        (("drains",), "slurmhealth.drains/1"),
        (("xid", "79"), "slurmhealth.xid/1"),
        (("incident", "search", "riser"), "slurmhealth.incidents/1"),
        (("baseline", "show"), "slurmhealth.baselines/1"),
        (("baseline", "outliers"), "slurmhealth.outliers/1"),
        (("evidence", "list"), "slurmhealth.evidence-list/1"),
        (("report", "42"), "slurmhealth.report/1"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, tuple) else None,
)
def test_json_is_one_object_with_a_schema_before_or_after_the_command(
    sh: Callable[..., Ran], tmp_path: Path, args: tuple[str, ...], schema: str
) -> None:
    _write_history(tmp_path / "history.db")
    after = sh(*args, "--json", SLURMHEALTH_EVIDENCE_DIR=str(tmp_path / "evidence"))
    assert after.exit_code == 0, after.stderr
    assert json.loads(after.stdout)["schema"] == schema
    before = sh("--json", *args, SLURMHEALTH_EVIDENCE_DIR=str(tmp_path / "evidence"))
    assert before.exit_code == 0 and json.loads(before.stdout)["schema"] == schema


def test_resume_and_baseline_ingest_speak_json(
    sh: Callable[..., Ran], monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurmhealth.hooks import resume

    monkeypatch.setattr(
        resume, "resume_node", lambda *_a, **_k: resume.ResumeOutcome(0, "n1 resumed")
    )
    done = sh("resume", "n1", "--reason", "riser replaced", "--json")
    assert done.exit_code == 0
    assert json.loads(done.stdout) == {
        "schema": "slurmhealth.resume/1",
        "node": "n1",
        "resumed": True,
        "message": "n1 resumed",
        "exit_code": 0,
    }
    burn = str(REPO / "tests" / "fixtures" / "baseline" / "gpuburn_8gpu_slow3.txt")
    ingested = sh("baseline", "ingest", "gpuburn", burn, "--json")
    data = json.loads(ingested.stdout)
    assert data["schema"] == "slurmhealth.baseline-ingest/1" and data["stored"] == len(
        data["measurements"]) > 0  # fmt: skip


def test_quiet_prints_nothing_but_the_exit_code_tells(sh: Callable[..., Ran]) -> None:
    for args in (("-q", "check"), ("check", "--quiet"), ("config", "check", "-q")):
        ran = sh(*args, scenario="nvlink-down")
        assert ran.stdout == "", args
        assert ran.exit_code == (1 if "config" not in args else 0)
    asked = sh("check", "-q", "--json", scenario="nvlink-down")
    assert json.loads(asked.stdout)["status"] == "fail"  # JSON asked for is still printed


def test_debug_is_accepted_after_the_command(sh: Callable[..., Ran]) -> None:
    ran = sh("check", "--debug", SLURMHEALTH_GPU_BACKEND="nvml")  # NVML cannot start here
    assert ran.exit_code != 0 and "Traceback" in ran.stderr
    assert "Traceback" not in sh("check", SLURMHEALTH_GPU_BACKEND="nvml").stderr


def test_piped_table_rows_stay_one_line_up_to_200_columns(
    sh: Callable[..., Ran], tmp_path: Path
) -> None:
    """``drains | grep node2`` finds node2's whole reason though the row is wider than
    COLUMNS; a row wider than 200 folds (a Slurm reason may be 200 characters alone)."""
    _write_history(tmp_path / "history.db")
    ran = sh("drains", COLUMNS="80")
    assert not ANSI.search(ran.stdout)
    (row,) = [line for line in ran.stdout.splitlines() if "node2" in line]
    assert WIDE_REASON in row and len(row) > 80
    assert max(map(len, ran.stdout.splitlines())) <= 200
    words = " ".join(line.strip("│ ") for line in ran.stdout.splitlines()).split()
    assert all(w in words for w in LONG_REASON.split())  # folded, nothing lost
    failing = sh("check", scenario="nvlink-down", COLUMNS="60")
    assert not ANSI.search(failing.stdout)
    assert [line for line in failing.stdout.splitlines()
            if "GPU-" in line and "NVLink 7 inactive" in line]  # fmt: skip


def test_no_color_is_honoured_on_a_terminal(sh: Callable[..., Ran]) -> None:
    coloured = sh("check", scenario="nvlink-down", color=True)
    assert ANSI.search(coloured.stdout)  # the terminal case does colour: the test can fail
    plain = sh("check", scenario="nvlink-down", color=True, NO_COLOR="1")
    assert not ANSI.search(plain.stdout) and "FAIL" in plain.stdout


def test_ctrl_c_exits_130_in_one_line(
    sh: Callable[..., Ran], monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurmhealth.hooks import check

    def interrupted(*_a: object, **_k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(check, "run_check", interrupted)
    ran = sh("check")
    assert ran.exit_code == 130 and ran.error_lines == ["slurmhealth: interrupted"]


def _one_line_usage_error(ran: Ran, *words: str) -> None:
    assert ran.exit_code == 2, ran.stderr
    (line,) = ran.error_lines
    assert all(w in line for w in words), line
    assert "Traceback" not in ran.stderr


def test_a_gpu_the_node_does_not_have_is_a_usage_error_and_not_recorded(
    sh: Callable[..., Ran], tmp_path: Path
) -> None:
    _one_line_usage_error(sh("check", "--gpus", "9"), "--gpus", "no GPU 9", "8 GPUs")
    assert not (tmp_path / "history.db").exists() or sqlite3.connect(
        tmp_path / "history.db"
    ).execute("select count(*) from check_runs").fetchone() == (0,)
    # a GPU the config expects but NVML lost is a finding, not a typo (as in the prolog)
    site = tmp_path / "site.toml"
    site.write_text("[gpu]\nexpected_count = 8\n")
    lost = sh(
        "check", "--gpus", "7", "--json", scenario="gpu-missing", SLURMHEALTH_CONFIG=str(site)
    )
    assert lost.exit_code == 1 and json.loads(lost.stdout)["status"] == "fail"


def test_bad_numbers_unknown_jobs_and_bad_paths_are_one_line(
    sh: Callable[..., Ran], tmp_path: Path
) -> None:
    for args in (("history", "--limit", "-5"), ("drains", "--limit", "0"),
                 ("incident", "search", "x", "--limit", "-1")):  # fmt: skip
        _one_line_usage_error(sh(*args), "--limit")
    _write_history(tmp_path / "history.db")
    unknown = sh("incident", "add", "999", "--symptom", "s", "--root-cause", "c",
                 SLURMHEALTH_EVIDENCE_DIR=str(tmp_path / "evidence"))  # fmt: skip
    _one_line_usage_error(unknown, "job 999")
    assert not (tmp_path / "evidence").exists() or not list((tmp_path / "evidence").rglob("*999*"))
    bad = tmp_path / "no" / "such" / "r.html"
    _one_line_usage_error(sh("report", "42", "--html", str(bad)), "--html", str(bad))
    _one_line_usage_error(sh("report", "42", "--html", str(tmp_path)), "is a directory")


def test_html_dash_goes_to_stdout(sh: Callable[..., Ran], tmp_path: Path) -> None:
    _write_history(tmp_path / "history.db")
    ran = sh("report", "42", "--html", "-", SLURMHEALTH_EVIDENCE_DIR=str(tmp_path / "evidence"))
    assert ran.exit_code == 0, ran.stderr
    assert ran.stdout.lstrip().lower().startswith("<!doctype html") and "42" in ran.stdout
    assert not (tmp_path / "-").exists()


def test_help_documents_the_exit_codes(sh: Callable[..., Ran]) -> None:
    text = sh("--help").stdout
    for code, word in (("0", "healthy"), ("1", "unhealthy"), ("2", "usage"), ("3", "internal"),
                       ("130", "interrupted")):  # fmt: skip
        assert re.search(rf"^\s*{code}\s+{word}", text, re.M), code
    readme = (REPO / "README.md").read_text()
    assert "| 130 | interrupted (Ctrl-C) |" in readme and "| 2 | usage or input error" in readme


def test_a_history_of_a_newer_release_is_refused_in_one_line(
    sh: Callable[..., Ran], tmp_path: Path
) -> None:
    """A rolled-back binary: every command that reads or writes the history says so."""
    _write_history(tmp_path / "history.db")
    conn = sqlite3.connect(tmp_path / "history.db")
    conn.execute("PRAGMA user_version = 999")
    conn.close()
    burn = str(REPO / "tests" / "fixtures" / "baseline" / "gpuburn_8gpu_slow3.txt")
    for args in (("check",), ("history",), ("drains",), ("resume", "node1", "--reason", "x"),
                 ("baseline", "ingest", "gpuburn", burn)):  # fmt: skip
        _one_line_usage_error(sh(*args), "schema version 999", f"({latest_version()})")
    assert sqlite3.connect(tmp_path / "history.db").execute(
        "select count(*) from check_runs").fetchone() == (1,)  # fmt: skip


def test_global_flags_between_a_group_and_its_command(sh: Callable[..., Ran]) -> None:
    ran = sh("config", "--json", "--quiet", "show")
    assert ran.exit_code == 0 and json.loads(ran.stdout)["schema"] == "slurmhealth.config/1"
    assert sh("config", "-q", "check").stdout == ""
    bare = sh("config")  # a group alone: its help, as click does
    assert bare.exit_code == 2 and "Usage: slurmhealth config" in bare.stderr
