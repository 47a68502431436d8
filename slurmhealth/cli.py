"""Command line entry point. Argument parsing, exit codes and rendering only; no logic.

Exit codes: 0 healthy (or warnings only), 1 a failing finding, 2 usage or config error,
3 internal error, 4 not allowed (another user's report). Errors are one line on stderr;
``--debug`` adds the traceback.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

import click

from slurmhealth.errors import SlurmhealthError, UsageError

F = TypeVar("F", bound=Callable[..., Any])


class Ctx:
    def __init__(self, config_path: str | None, db: str | None, debug: bool) -> None:
        self.config_path = config_path
        self.db = db
        self.debug = debug

    def config(self, flags: dict[str, Any] | None = None) -> Any:
        from slurmhealth.config import load_config

        return load_config(self.config_path, flags={"paths.db": self.db, **(flags or {})})


pass_ctx = click.make_pass_decorator(Ctx)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(
        fn
    )


def parse_gpus(text: str | None) -> list[int] | None:
    if text is None or text.strip() in ("", "all"):
        return None
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise UsageError(f"--gpus: {part!r} is not a GPU index or range (e.g. 0,3 or 0-7)")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise UsageError(f"--gpus: range {part!r} goes backwards")
        out.extend(range(lo, hi + 1))
    return sorted(set(out))


def parse_since(text: str | None, now: float) -> float | None:
    """``30m``, ``2h``, ``1d`` ago, or an ISO date/time in UTC."""
    if not text:
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd])", text.strip())
    if m:
        return now - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    from datetime import UTC, datetime

    try:
        dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"--since: {text!r} is neither a duration (30m, 2h, 1d) nor a date"
        ) from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_path",
    envvar="SLURMHEALTH_CONFIG",
    metavar="FILE",
    help="Config file (default /etc/slurmhealth/config.toml).",
)
@click.option("--db", metavar="PATH", help="History database (overrides paths.db).")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.version_option(package_name="slurmhealth")
@click.pass_context
def cli(click_ctx: click.Context, config_path: str | None, db: str | None, debug: bool) -> None:
    """slurmhealth: GPU health checks, history and diagnosis for Slurm clusters."""
    click_ctx.obj = Ctx(config_path, db, debug)
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="slurmhealth: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )


@cli.command()
@click.option("--gpus", metavar="LIST", help="GPU indices, e.g. 0,3 or 0-7 (default: all).")
@click.option(
    "--pre-job",
    is_flag=True,
    help="The node is idle: also check for a previous job's leftovers (stale processes, "
    "used GPU memory), as the prolog does; recorded as phase 'healthcheck'.",
)
@json_option
@pass_ctx
def check(ctx: Ctx, gpus: str | None, pre_job: bool, as_json: bool) -> None:
    """Run every health check on the node's GPUs and record the run.

    A job may be running: checks for leftovers of a previous job run only with --pre-job.
    Exits 0 when healthy or with warnings only, 1 when a check fails.
    """
    from slurmhealth import render
    from slurmhealth.hooks.check import run_check

    phase = "healthcheck" if pre_job else "check"
    result = run_check(ctx.config(), gpus=parse_gpus(gpus), phase=phase)
    data = result.to_dict()
    if as_json:
        render.print_json(data)
    else:
        render.check_result(data)
    sys.exit(result.exit_code)


@cli.command("checks")
@json_option
def list_checks(as_json: bool) -> None:
    """List every check with its description, thresholds and action."""
    from slurmhealth import render
    from slurmhealth.checks import catalog

    specs = list(catalog().values())
    if as_json:
        render.print_json(
            [
                {
                    "name": s.name,
                    "description": s.description,
                    "action": s.action.value,
                    "thresholds": dict(s.thresholds),
                    "phases": list(s.phases),
                    "hint": s.hint,
                }
                for s in specs
            ]
        )
        return
    render.table(
        "slurmhealth checks",
        ["check", "action", "thresholds", "description"],
        [
            (
                s.name,
                s.action.value,
                ", ".join(f"{k}={v:g}" for k, v in s.thresholds.items()) or "-",
                s.description,
            )
            for s in specs
        ],
    )


@cli.command()
@click.option("--node", help="Only runs of this node.")
@click.option("--job", help="Only runs of this Slurm job id.")
@click.option("--since", help="Only runs since a duration ago (30m, 2h, 1d) or a UTC date.")
@click.option("--limit", default=50, show_default=True, help="At most this many runs.")
@json_option
@pass_ctx
def history(
    ctx: Ctx, node: str | None, job: str | None, since: str | None, limit: int, as_json: bool
) -> None:
    """Show recorded check runs and their findings, newest first."""
    from slurmhealth import render
    from slurmhealth.history import History
    from slurmhealth.history.read import runs as history_runs

    cfg = ctx.config()
    start = parse_since(since, time.time())
    runs = []
    for path in _history_paths(cfg, node):
        with History(path) as db:
            runs += history_runs(db, node=node, job=job, since=start, limit=limit)
    runs = sorted(runs, key=lambda r: r["ts"], reverse=True)[:limit]
    if as_json:
        render.print_json({"schema": "slurmhealth.history/1", "runs": runs})
        return
    rows = []
    for r in runs:
        worst = r["findings"][0] if r["findings"] else None
        summary = "-" if worst is None else f"{worst['check_name']}: {worst['message']}"
        more = len(r["findings"]) - 1
        rows.append(
            (
                render.utc(r["ts"]),
                r["node"],
                r["phase"],
                r["job_id"],
                r["status"],
                summary + (f" (+{more} more)" if more > 0 else ""),
            )
        )
    render.table(
        "history",
        ["time (UTC)", "node", "phase", "job", "status", "findings"],
        rows,
    )


def _hook_logging(name: str) -> None:
    """Every log line of a hook names the job and node (they end up in slurmd's log)."""
    job = os.environ.get("SLURM_JOB_ID", "?")
    node = os.environ.get("SLURMD_NODENAME", "?")
    fmt = f"slurmhealth {name}[job={job} node={node}]: %(levelname)s: %(message)s"
    for handler in logging.getLogger().handlers:
        handler.setFormatter(logging.Formatter(fmt))
    logging.getLogger().setLevel(min(logging.getLogger().level, logging.INFO))


def _hook(ctx: Ctx, name: str) -> None:
    from slurmhealth.hooks.prolog import run_epilog, run_prolog

    _hook_logging(name)
    runner = run_prolog if name == "prolog" else run_epilog
    result = runner(ctx.config(), os.environ)
    drain = result.drain
    summary = f"{result.status}" + (f"; {drain.state}: {drain.reason}" if drain else "")
    if drain and drain.detail:
        summary += f" ({drain.detail})"
    logging.getLogger("slurmhealth.hooks").info("%s", summary)
    sys.exit(result.exit_code)


@cli.command(hidden=False)
@pass_ctx
def prolog(ctx: Ctx) -> None:
    """Slurm Prolog: check the job's GPUs (SLURM_JOB_GPUS); on a failing check drain the
    node with a precise reason and exit 1 so Slurm requeues the job elsewhere.

    Run it through prolog/slurmhealth-prolog, which adds the time limit and fails open.
    """
    _hook(ctx, "prolog")


@cli.command()
@pass_ctx
def epilog(ctx: Ctx) -> None:
    """Slurm Epilog: record the job's end, re-check its GPUs and drain with a precise
    reason when a fault appeared during the job. Always exits 0 on a decision."""
    _hook(ctx, "epilog")


@cli.command()
@click.option("--job", "job_id", envvar="SLURM_JOB_ID", required=True, help="Slurm job id.")
@click.option("--gpus", metavar="LIST", envvar="SLURM_JOB_GPUS", help="GPU indices (default all).")
@click.option("--interval", type=float, help="Sampling interval in seconds (>= 1).")
@pass_ctx
def sidecar(ctx: Ctx, job_id: str, gpus: str | None, interval: float | None) -> None:
    """Sample the job's GPUs, serve them on /metrics with the job's labels, detect faults.

    The prolog starts one per job per node and the epilog stops it; inside a batch script
    `slurmhealth sidecar &` works too. Exits on SIGTERM or when the job is gone.
    """
    import json

    from slurmhealth.sidecar.lifecycle import LABELS_ENV
    from slurmhealth.sidecar.run import Sidecar
    from slurmhealth.sidecar.state import JobLabels

    _hook_logging("sidecar")
    flags = {} if interval is None else {"sidecar.interval_s": interval}
    cfg = ctx.config(flags)
    raw = os.environ.get(LABELS_ENV)
    labels = JobLabels(**json.loads(raw)) if raw else None
    if labels is None or labels.job_id != job_id:
        labels = JobLabels(
            job_id=job_id,
            user=os.environ.get("SLURM_JOB_USER", os.environ.get("USER", "")),
            account=os.environ.get("SLURM_JOB_ACCOUNT", ""),
            partition=os.environ.get("SLURM_JOB_PARTITION", ""),
            qos=os.environ.get("SLURM_JOB_QOS", ""),
            node=os.environ.get("SLURMD_NODENAME", cfg.node_name),
        )
    indices = tuple(parse_gpus(gpus) or ())
    sys.exit(Sidecar(cfg, labels, indices).run())


@cli.command()
@click.option("--node", help="Only this node.")
@click.option("--limit", default=50, show_default=True, help="At most this many rows.")
@json_option
@pass_ctx
def drains(ctx: Ctx, node: str | None, limit: int, as_json: bool) -> None:
    """Drains, suppressed drains and resumes recorded by slurmhealth, newest first."""
    from slurmhealth import render
    from slurmhealth.history import History
    from slurmhealth.history.read import drain_rows

    cfg = ctx.config()
    rows = []
    for path in _history_paths(cfg, node):
        with History(path) as db:
            rows += drain_rows(db, node=node, limit=limit)
    rows = sorted(rows, key=lambda r: r["ts"], reverse=True)[:limit]
    if as_json:
        render.print_json({"schema": "slurmhealth.drains/1", "drains": rows})
        return
    render.table(
        "drains",
        ["time (UTC)", "node", "state", "job", "reason", "by", "note"],
        [
            (
                render.utc(r["ts"]),
                r["node"],
                r["state"],
                r["job_id"],
                r["reason"],
                r["actor"],
                (r["detail"] or {}).get("note", "") if isinstance(r["detail"], dict) else "",
            )
            for r in rows
        ],
    )


def _history_paths(cfg: Any, node: str | None) -> list[str]:
    from slurmhealth.history.read import history_paths

    return history_paths(cfg, [node] if node else ())


@cli.command()
@click.argument("node")
@click.option("--reason", required=True, help="Why it is fit again (recorded).")
@click.option("--force", is_flag=True, help="Resume even if someone else drained it.")
@pass_ctx
def resume(ctx: Ctx, node: str, reason: str, force: bool) -> None:
    """Return NODE to service if slurmhealth drained it (--force for any reason)."""
    from slurmhealth.hooks.resume import resume_node

    outcome = resume_node(ctx.config(), node, reason, force=force)
    click.echo(outcome.message)
    sys.exit(outcome.exit_code)


@cli.command()
@json_option
@pass_ctx
def nodes(ctx: Ctx, as_json: bool) -> None:
    """Each node's Slurm state and reason next to its last recorded check."""
    from slurmhealth import render
    from slurmhealth.hooks.resume import node_overview

    rows = node_overview(ctx.config())
    if as_json:
        render.print_json({"schema": "slurmhealth.nodes/1", "nodes": rows})
        return
    render.table(
        "nodes",
        ["node", "state", "reason", "last check (UTC)", "phase", "status", "worst finding"],
        [
            (
                r["node"],
                r["state"],
                r["reason"],
                render.utc(r["last_check_ts"]),
                r["last_phase"],
                r["last_status"],
                r["worst_finding"],
            )
            for r in rows
        ],
    )


def _register_subcommands() -> None:
    from slurmhealth.cli_baseline import baseline, validate
    from slurmhealth.cli_evidence import evidence
    from slurmhealth.cli_exporter import exporter
    from slurmhealth.cli_incident import incident
    from slurmhealth.cli_report import report
    from slurmhealth.cli_xid import xid

    cli.add_command(report)
    cli.add_command(baseline)
    cli.add_command(validate)
    cli.add_command(incident)
    cli.add_command(evidence)
    cli.add_command(xid)
    cli.add_command(exporter)


_register_subcommands()


@cli.group()
def config() -> None:
    """Validate or show the effective configuration."""


@config.command("check")
@pass_ctx
def config_check(ctx: Ctx) -> None:
    """Validate the config (and the scenario, for the simulator); exit 2 on an error."""
    from slurmhealth.checks import validate_settings

    cfg = ctx.config()
    validate_settings(cfg.checks.settings, cfg.checks.disabled, cfg.sources)
    if cfg.gpu.backend == "sim":
        from slurmhealth.gpu.scenario import load_scenario

        if not cfg.gpu.sim_scenario:
            raise UsageError("gpu.backend is 'sim' but gpu.sim_scenario is not set")
        load_scenario(cfg.gpu.sim_scenario)
    files = sorted({s for s in cfg.sources.values() if not s.startswith(("environment", "flag"))})
    click.echo(f"config OK ({', '.join(files) or 'defaults only'})")


@config.command("show")
@json_option
@pass_ctx
def config_show(ctx: Ctx, as_json: bool) -> None:
    """Show every effective value and where it came from."""
    from slurmhealth import render
    from slurmhealth.config import effective_items

    items = effective_items(ctx.config())
    if as_json:
        render.print_json({k: {"value": v, "source": s} for k, v, s in items})
        return
    render.table("effective configuration", ["key", "value", "source"], items)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one line on stderr per error, exit codes as documented."""
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    try:
        cli.main(args=argv, prog_name="slurmhealth", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2 if exc.exit_code not in (0, 1) else exc.exit_code)
    except click.exceptions.Abort:
        click.echo("slurmhealth: aborted", err=True)
        sys.exit(3)
    except SlurmhealthError as exc:
        if debug:
            raise
        click.echo(f"slurmhealth: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:
        if debug:
            raise
        click.echo(
            f"slurmhealth: internal error: {type(exc).__name__}: {exc} (run with --debug)",
            err=True,
        )
        sys.exit(3)
