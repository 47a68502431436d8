"""``slurmhealth history`` (recorded check runs) and ``slurmhealth drains`` (recorded
drains and resumes), read from every history this host reaches, newest first;
``slurmhealth history prune`` (admins) applies the ``[history]`` retention now.

Access (``slurmhealth.access``): ``history`` lists every user's jobs, so only root and the
admin group may run it without ``--job``; with ``--job`` the job's owner may too. Refusals
exit 4 in one line. ``drains`` is node-level (the reasons ``sinfo -R`` shows anyone): no
check beyond the history's file modes."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

import click

from slurmhealth.cli.options import Ctx, json_option, pass_ctx
from slurmhealth.errors import UsageError

if TYPE_CHECKING:
    from slurmhealth.access import Rights
    from slurmhealth.config import Config


def parse_since(text: str | None, now: float) -> float | None:
    """``--since``: ``30m``, ``2h``, ``1d`` ago, or an ISO date/time in UTC."""
    from slurmhealth.config.timeparse import since_ts

    if not text:
        return None
    ts = since_ts(text, now)
    if ts is None:
        raise UsageError(f"--since: {text!r} is neither a duration (30m, 2h, 1d) nor a date")
    return ts


def _history_paths(cfg: Config, node: str | None) -> list[str]:
    from slurmhealth.history.read import history_paths

    return history_paths(cfg, [node] if node else ())


def _readable_paths(cfg: Config, node: str | None, rights: Rights, job: str | None) -> list[str]:
    """The histories to read; a history the caller's file rights keep them out of (root:admin
    0640 in a 0750 folder) is a one-line refusal, not an empty answer."""
    from slurmhealth import access

    paths = _history_paths(cfg, node)
    if paths:
        return paths
    folder = os.path.dirname(cfg.db_path(node)) or "."
    if os.path.isdir(folder) and not os.access(folder, os.R_OK | os.X_OK):
        hint = f"; `slurmhealth report {job}` reads your job's summary" if job else ""
        raise access.AccessDenied(
            f"history {cfg.db_path(node)} is private to {access.who_may(rights)}{hint}"
        )
    return []


def _check_job_owner(ctx: Ctx, rights: Rights, paths: list[str], job: str) -> None:
    """A non-admin may read ``--job``'s runs only when the history records them as its owner."""
    from slurmhealth import access
    from slurmhealth.history.read import Reader, job_row, owner_uid

    uid: int | None = None
    user: str | None = None
    for path in paths:
        with Reader(path) as db:
            uid = uid if uid is not None else owner_uid(db, job)
            user = user or (job_row(db, job) or {}).get("user") or None
    access.check_job(ctx.caller(), rights, job, *access.job_owner(uid, user), "history")


@click.group(invoke_without_command=True)
@click.option("--node", help="Only runs of this node.")
@click.option("--job", help="Only runs of this Slurm job id.")
@click.option("--since", help="Only runs since a duration ago (30m, 2h, 1d) or a UTC date.")
@click.option(
    "--limit", type=click.IntRange(min=1), default=50, show_default=True,
    help="At most this many runs.",
)  # fmt: skip
@json_option
@pass_ctx
def history(
    ctx: Ctx, node: str | None, job: str | None, since: str | None, limit: int, as_json: bool
) -> None:
    """Show recorded check runs and their findings, newest first.

    Every job's runs: root and the admin group only. Anyone: --job JOBID of their own job
    where the history's file modes let them read it (else `slurmhealth report JOBID`)."""
    if click.get_current_context().invoked_subcommand is not None:
        return  # `history prune`
    from slurmhealth import access
    from slurmhealth.cli import render
    from slurmhealth.history.read import Reader
    from slurmhealth.history.read import runs as history_runs

    cfg, rights = ctx.config(), ctx.rights()
    start = parse_since(since, time.time())
    admin = access.is_admin(ctx.caller(), rights)
    if not admin and job is None:
        access.require_admin(ctx.caller(), rights, "list every job's runs (use --job JOBID)")
    paths = _readable_paths(cfg, node, rights, job)
    if not admin and job is not None:
        _check_job_owner(ctx, rights, paths, job)
    runs = []
    for path in paths:
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


@history.command("prune")
@click.option("--node", help="The history of this node (default: this node's).")
@click.option(
    "--max-rows", type=click.IntRange(min=1), default=None,
    help="Delete at most this many rows (default: history.prune_max_rows).",
)  # fmt: skip
@click.option("--all", "until_done", is_flag=True, help="Repeat until nothing more is due.")
@click.option("--vacuum", is_flag=True, help="Then give the freed pages back (VACUUM; slow).")
@json_option
@pass_ctx
def prune(
    ctx: Ctx, node: str | None, max_rows: int | None, until_done: bool, vacuum: bool,
    as_json: bool,
) -> None:  # fmt: skip
    """Delete what the [history] retention no longer keeps (raw samples, rollups, records),
    a bounded number of rows per run, as the epilog and the health check do. Admins only."""
    import dataclasses

    from slurmhealth import access
    from slurmhealth.cli import render
    from slurmhealth.history import History
    from slurmhealth.history.retention import policy

    cfg = ctx.config()
    access.require_admin(ctx.caller(), ctx.rights(), "prune a history")
    rules = policy(cfg)
    if max_rows is not None:
        rules = dataclasses.replace(rules, max_rows=max_rows)
    deleted: dict[str, int] = {}
    with History.for_node(cfg, node) as db:
        while True:
            result = db.prune(rules)
            for table, n in result.deleted.items():
                deleted[table] = deleted.get(table, 0) + n
            if result.complete or not until_done:
                break
        if vacuum:
            db.vacuum()
    doc = {"schema": "slurmhealth.history-prune/1", "db": db.path, "deleted": deleted,
           "complete": result.complete, "retention": dataclasses.asdict(rules)}  # fmt: skip
    if as_json:
        render.print_json(doc)
        return
    total = sum(deleted.values())
    more = "" if result.complete else "; more is due (run again, or --all)"
    parts = ", ".join(f"{t} {n}" for t, n in deleted.items()) or "nothing due"
    click.echo(f"{db.path}: deleted {total} rows ({parts}){more}")


@click.command()
@click.option("--node", help="Only this node.")
@click.option(
    "--limit", type=click.IntRange(min=1), default=50, show_default=True,
    help="At most this many rows.",
)  # fmt: skip
@json_option
@pass_ctx
def drains(ctx: Ctx, node: str | None, limit: int, as_json: bool) -> None:
    """Drains, suppressed drains and resumes recorded by slurmhealth, newest first."""
    from slurmhealth.cli import render
    from slurmhealth.history.read import Reader, drain_rows

    cfg = ctx.config()
    rows = []
    for path in _readable_paths(cfg, node, ctx.rights(), None):
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
