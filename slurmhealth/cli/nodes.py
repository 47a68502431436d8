"""``slurmhealth nodes`` (Slurm state next to the last check) and ``slurmhealth resume``."""

from __future__ import annotations

import sys

import click

from slurmhealth.cli.options import Ctx, json_option, pass_ctx


@click.command()
@click.argument("node")
@click.option("--reason", required=True, help="Why it is fit again (recorded).")
@click.option("--force", is_flag=True, help="Resume even if someone else drained it.")
@json_option
@pass_ctx
def resume(ctx: Ctx, node: str, reason: str, force: bool, as_json: bool) -> None:
    """Return NODE to service if slurmhealth drained it (--force for any reason).

    Exits 0 when resumed, 1 when refused or not drained."""
    from slurmhealth.cli import render
    from slurmhealth.hooks.resume import resume_node

    outcome = resume_node(ctx.config(), node, reason, force=force)
    if as_json:
        render.print_json({"schema": "slurmhealth.resume/1", "node": node,
                           "resumed": outcome.exit_code == 0, "message": outcome.message,
                           "exit_code": outcome.exit_code})  # fmt: skip
    else:
        click.echo(outcome.message)
    sys.exit(outcome.exit_code)


@click.command()
@json_option
@pass_ctx
def nodes(ctx: Ctx, as_json: bool) -> None:
    """Each node's Slurm state and reason next to its last recorded check."""
    from slurmhealth.cli import render
    from slurmhealth.hooks.resume import node_overview

    rows = node_overview(ctx.config())
    if as_json:
        render.print_json({"schema": "slurmhealth.nodes/1", "nodes": rows})
        return
    render.table(
        "nodes",
        [
            "node",
            "state",
            "reason",
            "last check (UTC)",
            "phase",
            "status",
            "worst finding",
            "remediation",
        ],
        [
            (
                r["node"],
                r["state"],
                r["reason"],
                render.utc(r["last_check_ts"]),
                r["last_phase"],
                r["last_status"],
                r["worst_finding"],
                _remediation(r["remediation"]),
            )
            for r in rows
        ],
    )


def _remediation(step: dict[str, object] | None) -> str:
    """The node's newest remediation step: ``reset: ok (2026-12-02 14:01)``."""
    if not step:
        return ""
    from slurmhealth.cli import render

    started = step.get("started")
    when = render.utc(float(started)) if isinstance(started, int | float) else ""
    return f"{step.get('action')}: {step.get('outcome')} ({when})"
