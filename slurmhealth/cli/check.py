"""``slurmhealth check`` (run the checks now) and ``slurmhealth checks`` (the catalog)."""

from __future__ import annotations

import sys

import click

from slurmhealth.cli.options import Ctx, gpus_option, json_option, pass_ctx


@click.command()
@gpus_option("GPU indices, e.g. 0,3 or 0-7 (default: all).")
@click.option(
    "--pre-job",
    is_flag=True,
    help="The node is idle: also check for a previous job's leftovers (stale processes, "
    "used GPU memory), as the prolog does; recorded as phase 'healthcheck'.",
)
@json_option
@pass_ctx
def check(ctx: Ctx, gpus: tuple[int, ...] | None, pre_job: bool, as_json: bool) -> None:
    """Run every health check on the node's GPUs and record the run.

    A job may be running: checks for leftovers of a previous job run only with --pre-job.
    Exits 0 when healthy or with warnings only, 1 when a check fails.
    """
    from slurmhealth.cli import render
    from slurmhealth.hooks.check import run_check

    phase = "healthcheck" if pre_job else "check"
    result = run_check(ctx.config(), gpus=gpus, phase=phase)
    data = result.to_dict()
    if as_json:
        render.print_json(data)
    else:
        render.check_result(data)
    sys.exit(result.exit_code)


@click.command("checks")
@json_option
def list_checks(as_json: bool) -> None:
    """List every check with its description, thresholds and action."""
    from slurmhealth.checks import catalog
    from slurmhealth.cli import render

    specs = list(catalog().values())
    if as_json:
        render.print_json(
            {
                "schema": "slurmhealth.checks/1",
                "checks": [
                    {
                        "name": s.name,
                        "description": s.description,
                        "action": s.action.value,
                        "thresholds": dict(s.thresholds),
                        "phases": list(s.phases),
                        "hint": s.hint,
                    }
                    for s in specs
                ],
            }
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
