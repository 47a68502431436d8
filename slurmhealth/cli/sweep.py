"""``slurmhealth sweep``: find the bad node or link with pairwise tests run as Slurm jobs;
``slurmhealth sweep show [ID]``: a stored sweep again (terminal, JSON, HTML heat map).

Exit codes: 0 no suspect, 1 a suspect named (drained with --drain-suspects when the
breaker allows), 2 usage error, 3 inconclusive (most tests measured nothing: the program
or the job setup, not the nodes; nothing drained).
"""

from __future__ import annotations

import os
import sys
from importlib import resources
from typing import Any

import click

from slurmhealth.cli.options import Ctx, json_option, pass_ctx
from slurmhealth.errors import UsageError

EXAMPLE = """\b
Examples:
  slurmhealth sweep --nodes 'gpu[001-064]' --partition gpu
  slurmhealth sweep --nodes 'gpu[001-064]' --test both --hcas mlx5_0,mlx5_1 \\
      --command nccl=/opt/nccl-tests/build/all_reduce_perf --json
  slurmhealth sweep show 20261202-151502-3fa9 --html sweep.html
"""


def _commands(values: tuple[str, ...], tests: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        test, sep, path = v.partition("=")
        if not sep:
            if len(tests) != 1:
                raise UsageError("--command: with --test both name the test: nccl=PATH, ib=PATH")
            test, path = tests[0], v
        if test not in ("nccl", "ib") or not path:
            raise UsageError(f"--command {v!r}: expected PATH, nccl=PATH or ib=PATH")
        out[test] = os.path.abspath(path) if "/" in path else path  # a bare name: on PATH
    return out


def _job_env(values: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, value = v.partition("=")
        if not sep or not key.startswith("SWEEP_") or not key.replace("_", "").isalnum():
            raise UsageError(f"--job-env {v!r}: expected SWEEP_NAME=VALUE")
        out[key] = value
    return out


def _template(path: str | None) -> str:
    if path is None:
        path = str(resources.files("slurmhealth") / "data" / "sweep.sbatch")
    if not os.path.isfile(path):
        raise UsageError(f"--template {path}: no such file")
    return path


@click.group(invoke_without_command=True, epilog=EXAMPLE)
@click.option("--nodes", "hostlist", metavar="HOSTLIST", help="Nodes to test, e.g. gpu[001-064].")
@click.option(
    "--test",
    "test",
    type=click.Choice(["nccl", "ib", "both"]),
    default="nccl",
    show_default=True,
    help="nccl-tests all_reduce_perf, perftest ib_write_bw, or both.",
)
@click.option("--partition", default="", help="Partition of the test jobs.")
@click.option(
    "--command",
    "commands",
    multiple=True,
    metavar="[TEST=]PATH",
    help="The site's all_reduce_perf / ib_write_bw (nccl=PATH, ib=PATH).",
)
@click.option(
    "--gpus-per-node",
    type=click.IntRange(1, 64),
    default=8,
    show_default=True,
    help="GPUs per node: -g N alone, one rank per GPU in pairs.",
)
@click.option("--hcas", default="", metavar="LIST", help="HCAs for ib, e.g. mlx5_0,mlx5_1.")
@click.option(
    "--rounds",
    type=click.IntRange(1, 1000),
    default=None,
    help="Pair rounds (default: every pair up to 5 rounds).",
)
@click.option(
    "--time-limit",
    type=click.IntRange(1, 1440),
    default=10,
    show_default=True,
    help="Minutes each test job may run.",
)
@click.option(
    "--max-jobs",
    type=click.IntRange(1, 10000),
    default=64,
    show_default=True,
    help="Test jobs in Slurm at once.",
)
@click.option(
    "--max-pending",
    type=click.FloatRange(1, 86400),
    default=600.0,
    show_default=True,
    help="Seconds a job may wait in the queue before it is cancelled.",
)
@click.option(
    "--slow-fraction",
    type=click.FloatRange(0.1, 0.99),
    default=0.85,
    show_default=True,
    help="Slow below this share of the reference.",
)
@click.option(
    "--output-dir",
    default=None,
    metavar="DIR",
    help="Where the jobs write (shared with the nodes; default EVIDENCE_DIR/sweeps).",
)
@click.option(
    "--template",
    default=None,
    metavar="FILE",
    help="The job script (default: the packaged sweep.sbatch).",
)
@click.option(
    "--job-env",
    multiple=True,
    metavar="SWEEP_X=V",
    help="Setting for the job script, e.g. SWEEP_SRUN_MPI=--mpi=pmix.",
)
@click.option(
    "--drain-suspects",
    is_flag=True,
    help="Drain node and intra suspects (circuit breaker; reason 'slurmhealth: sweep:').",
)
@json_option
@pass_ctx
@click.pass_context
def sweep(click_ctx: click.Context, ctx: Ctx, hostlist: str | None, test: str, partition: str,
          commands: tuple[str, ...], gpus_per_node: int, hcas: str, rounds: int | None,
          time_limit: int, max_jobs: int, max_pending: float, slow_fraction: float,
          output_dir: str | None, template: str | None, job_env: tuple[str, ...],
          drain_suspects: bool, as_json: bool) -> None:  # fmt: skip
    """Find the bad node or link: each node alone (its NVLink busbw), then pairs in rounds
    (every node in one pair per round), as ordinary Slurm jobs; slow pairs are repeated
    before anyone is accused. A node slow with most partners is a node suspect, one slow
    pair of nodes fine elsewhere a link suspect, a node slow alone an intra (NVLink/GPU)
    suspect. Progress goes to stderr. See docs/sweep.md.

    Exits 0 with no suspect, 1 when one is named, 3 when inconclusive (most tests
    measured nothing: nothing is named or drained)."""
    if click_ctx.invoked_subcommand is not None:
        return
    if not hostlist:
        raise UsageError("--nodes HOSTLIST is required (or: sweep show [ID])")
    from slurmhealth.slurm import SlurmCli, expand_hostlist
    from slurmhealth.sweep.run import Settings, run_sweep
    from slurmhealth.sweep.submit import Waiter

    cfg = ctx.config()
    tests = ("nccl", "ib") if test == "both" else (test,)
    settings = Settings(
        nodes=tuple(dict.fromkeys(expand_hostlist(hostlist))), tests=tests,
        template=_template(template), partition=partition,
        output_dir=output_dir or os.path.join(cfg.paths.evidence_dir, "sweeps"),
        commands=_commands(commands, tests), gpus_per_node=gpus_per_node,
        hcas=tuple(h for h in hcas.replace(",", " ").split() if h), time_min=time_limit,
        max_jobs=max_jobs, rounds=rounds, slow_fraction=slow_fraction,
        drain=drain_suspects, env=_job_env(job_env))  # fmt: skip

    def progress(line: str) -> None:
        if not ctx.quiet:
            click.echo(f"sweep: {line}", err=True)

    slurm = SlurmCli(max(cfg.slurm.command_timeout_s, 30.0))
    record = run_sweep(cfg, settings, slurm, Waiter(max_pending_s=max_pending), progress)
    _print(record, as_json)
    sys.exit(_exit_code(record))


def _exit_code(record: dict[str, Any]) -> int:
    if record.get("inconclusive"):
        click.echo(f"slurmhealth: sweep {record.get('id')}: inconclusive: "
                   f"{record['inconclusive']}", err=True)  # fmt: skip
        return 3
    return 1 if record.get("suspects") else 0


def _print(record: dict[str, Any], as_json: bool, full: bool = False) -> None:
    from slurmhealth.cli import render
    from slurmhealth.sweep import render as sweep_render

    if as_json:
        render.print_json(record)
        return
    click.echo(sweep_render.headline(record))
    for line in sweep_render.verdict_lines(record):
        click.echo(line)
    rows = sweep_render.unit_rows(record, only_bad=not full)
    if rows:
        render.table("tests" if full else "tests not ok (all: sweep show ID)",
                     sweep_render.UNIT_COLUMNS, rows)  # fmt: skip


@sweep.command("show")
@click.argument("sweep_id", metavar="[ID]", required=False)
@click.option("--html", "html_file", metavar="FILE", help="Write the HTML page ('-': stdout).")
@json_option
@pass_ctx
def show(ctx: Ctx, sweep_id: str | None, html_file: str | None, as_json: bool) -> None:
    """A stored sweep: its verdict and every test (or, without ID, the sweeps stored)."""
    from slurmhealth.cli import render
    from slurmhealth.history.read import Reader
    from slurmhealth.history.sweeps import sweep_list, sweep_record

    cfg = ctx.config()
    path = cfg.db_path()
    if not os.path.exists(path):
        raise UsageError(f"no history at {path}: no sweep ran on this host")
    with Reader(path) as db:
        if sweep_id is None:
            found = sweep_list(db)
            if as_json:
                render.print_json({"schema": "slurmhealth.sweeps/1",
                                   "sweeps": [{"id": i, "ts": ts} for i, ts in found]})  # fmt: skip
            else:
                render.table(
                    "sweeps", ["id", "stored (UTC)"], [(i, render.utc(t)) for i, t in found]
                )
            return
        record = sweep_record(db, sweep_id)
    if record is None:
        raise UsageError(f"no sweep {sweep_id!r} in {path} (sweep show lists them)")
    if html_file is not None:
        from slurmhealth.cli.report import _check_writable, _write_html
        from slurmhealth.sweep.render import to_html

        if html_file != "-":
            _check_writable(html_file)
        _write_html(html_file, to_html(record))
        if html_file != "-":
            click.echo(f"sweep {sweep_id} written to {html_file}")
        return
    _print(record, as_json, full=True)
