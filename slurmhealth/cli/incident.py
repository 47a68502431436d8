"""`slurmhealth incident add|search`: the fault knowledge base (no logic here).

Who may (``slurmhealth.access``): ``add`` root and the admin group of the system config;
``search`` anyone -- the knowledge base describes hardware faults, as ``report`` shows a
job's owner the incidents related to their job."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import click

from slurmhealth.cli import render
from slurmhealth.cli.options import Ctx, json_option, pass_ctx
from slurmhealth.errors import UsageError

if TYPE_CHECKING:
    from slurmhealth.config import Config


def _job_context(cfg: Config, job_id: str) -> dict[str, set[Any]]:
    """Nodes, GPUs, Xids and checks of the job, from every history this node can read; a
    job none of them knows is a usage error (a typo must not become an incident)."""
    from slurmhealth.history.read import (
        Reader,
        StoreError,
        history_paths,
        incident_rows,
        job_row,
    )
    from slurmhealth.report import incidents

    ctx: dict[str, set[Any]] = {"nodes": set(), "gpus": set(), "xids": set(), "checks": set()}
    known = False
    paths = history_paths(cfg)
    for path in paths:
        try:
            with Reader(path) as db:
                rows = incident_rows(db, job_id)
                known = known or bool(rows) or job_row(db, job_id) is not None
        except StoreError:
            continue
        by_node: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            by_node.setdefault(str(r.get("node")), []).append(r)
        for node, node_rows in by_node.items():
            for key, values in incidents.context_of(node_rows, node).items():
                ctx[key] |= values
    if not known:
        where = ", ".join(paths) or f"no history here ({cfg.db_path()})"
        raise UsageError(f"incident add: job {job_id} is in no history this node reads "
                         f"({where}); record it where the job ran")  # fmt: skip
    return ctx


@click.group()
def incident() -> None:
    """The fault knowledge base: record what a failure was, find it again."""


@incident.command("add")
@click.argument("job_id")
@click.option("--symptom", required=True, help="What was seen (e.g. 'NCCL timeout, GPU 5 lost').")
@click.option("--root-cause", required=True, help="What it turned out to be.")
@click.option("--fix", default="", help="What fixed it.")
@click.option("--prevention", default="", help="What keeps it from coming back.")
@click.option("--tag", "tags", multiple=True, help="Free-form tag (repeatable).")
@json_option
@pass_ctx
def add(
    ctx: Ctx,
    job_id: str,
    symptom: str,
    root_cause: str,
    fix: str,
    prevention: str,
    tags: tuple[str, ...],
    as_json: bool,
) -> None:
    """Record an incident for JOBID; the job's nodes, GPUs, Xids and checks are attached.
    Root and the admin group only."""
    import getpass
    from dataclasses import asdict

    from slurmhealth import access
    from slurmhealth.report import incidents

    access.require_admin(ctx.caller(), ctx.rights(), "record incidents")
    if not symptom.strip() or not root_cause.strip():  # the flags first, then the job
        raise UsageError("an incident needs --symptom and --root-cause")
    cfg = ctx.config()
    inc = incidents.add(
        cfg,
        job_id,
        symptom=symptom,
        root_cause=root_cause,
        fix=fix,
        prevention=prevention,
        author=os.environ.get("SUDO_USER") or getpass.getuser(),
        context=_job_context(cfg, job_id),
        tags=tags,
    )
    if as_json:
        render.print_json({"schema": "slurmhealth.incident/1", **asdict(inc)})
    else:
        click.echo(f"incident {inc.id} recorded (nodes {', '.join(inc.nodes) or '-'}, "
                   f"Xids {', '.join(map(str, inc.xids)) or '-'})")  # fmt: skip


@incident.command("search")
@click.argument("words", nargs=-1, required=True)
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="At most this many incidents.",
)
@json_option
@pass_ctx
def search(ctx: Ctx, words: tuple[str, ...], limit: int, as_json: bool) -> None:
    """Find past incidents containing WORDS (symptom, cause, fix, Xids, nodes, checks)."""
    from dataclasses import asdict

    from slurmhealth.report import incidents

    cfg = ctx.config()
    hits = incidents.search(cfg, " ".join(words), limit=limit)
    if as_json:
        render.print_json({"schema": "slurmhealth.incidents/1",
                           "incidents": [{"score": s, **asdict(i)} for s, i in hits]})  # fmt: skip
        return
    render.table(
        "incidents",
        ["when (UTC)", "job", "nodes", "symptom", "root cause", "fix", "match"],
        [
            (
                render.utc(i.ts),
                i.job_id,
                ",".join(i.nodes),
                i.symptom,
                i.root_cause,
                i.fix,
                f"{s:.0%}",
            )
            for s, i in hits
        ],
    )
