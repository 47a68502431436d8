"""``slurmhealth history`` (recorded check runs) and ``slurmhealth drains`` (recorded
drains and resumes), read from every history this host reaches, newest first."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import click

from slurmhealth.cli.options import Ctx, json_option, pass_ctx
from slurmhealth.errors import UsageError

if TYPE_CHECKING:
    from slurmhealth.config import Config


def parse_since(text: str | None, now: float) -> float | None:
    """``--since``: ``30m``, ``2h``, ``1d`` ago, or an ISO date/time in UTC."""
    from slurmhealth.timeparse import since_ts

    if not text:
        return None
    ts = since_ts(text, now)
    if ts is None:
        raise UsageError(f"--since: {text!r} is neither a duration (30m, 2h, 1d) nor a date")
    return ts


def _history_paths(cfg: Config, node: str | None) -> list[str]:
    from slurmhealth.history.read import history_paths

    return history_paths(cfg, [node] if node else ())


@click.command()
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
    from slurmhealth.cli import render
    from slurmhealth.history.read import Reader
    from slurmhealth.history.read import runs as history_runs

    cfg = ctx.config()
    start = parse_since(since, time.time())
    runs = []
    for path in _history_paths(cfg, node):
        with Reader(path) as db:  # a reader never creates nor fixes files
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


@click.command()
@click.option("--node", help="Only this node.")
@click.option("--limit", default=50, show_default=True, help="At most this many rows.")
@json_option
@pass_ctx
def drains(ctx: Ctx, node: str | None, limit: int, as_json: bool) -> None:
    """Drains, suppressed drains and resumes recorded by slurmhealth, newest first."""
    from slurmhealth.cli import render
    from slurmhealth.history.read import Reader, drain_rows

    cfg = ctx.config()
    rows = []
    for path in _history_paths(cfg, node):
        with Reader(path) as db:  # a reader never creates nor fixes files
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
