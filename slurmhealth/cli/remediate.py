"""``slurmhealth remediate``: what automatic repair would do on the fleet (``--dry-run``),
or one step of it on this node (``--run``, from a timer)."""

from __future__ import annotations

import sys

import click

from slurmhealth.cli.options import Ctx, json_option, pass_ctx

EPILOG = """\b
Examples:
  slurmhealth remediate --dry-run            # the planned action of every node
  slurmhealth remediate --dry-run --json     # the same as JSON (schema remediate-plan/1)
  slurmhealth remediate --run                # one check + remediation step on this node

Needs [remediate] enabled = true to act (docs/remediation.md); --dry-run changes nothing."""


@click.command(epilog=EPILOG)
@click.option("--dry-run", "dry_run", is_flag=True, help="Show the planned action per node.")
@click.option("--run", "run_once", is_flag=True, help="Check this node, then one step.")
@click.option(
    "--sim-reboot",
    is_flag=True,
    hidden=True,
    help="Simulator: record that this node rebooted (the test cluster's RebootProgram).",
)
@json_option
@pass_ctx
def remediate(ctx: Ctx, dry_run: bool, run_once: bool, sim_reboot: bool, as_json: bool) -> None:
    """Repair nodes slurmhealth drained: reset the GPU, re-validate and resume; else reboot
    (scontrol reboot ASAP nextstate=RESUME); after max_attempts in the window, leave the
    node drained as "service required" with an incident. Admins' drains are never touched,
    nor a node that still runs a job.

    Exits 0; 1 when --run is asked with remediation disabled; 2 for a usage error."""
    from slurmhealth.cli import render
    from slurmhealth.errors import UsageError

    if sum((dry_run, run_once, sim_reboot)) != 1:
        raise UsageError("give one of --dry-run or --run")
    cfg = ctx.config()
    if sim_reboot:
        from slurmhealth.gpu.reset import record_sim_reboot

        click.echo(f"{cfg.node_name}: simulated reboot recorded in {record_sim_reboot(cfg)}")
        return
    if dry_run:
        from slurmhealth.hooks.remediate_plan import dry_run as plan

        doc = plan(cfg)
        if as_json:
            render.print_json(doc)
            return
        state = "enabled" if doc["enabled"] else "DISABLED ([remediate] enabled = false)"
        click.echo(f"remediation {state}; at most {doc['limit']} node(s) at once, "
                   f"{doc['max_attempts']} attempt(s) per {doc['window_s']:g} s")  # fmt: skip
        render.table("planned actions", ["node", "state", "action", "gpus", "fault", "why"],
                     [(r["node"], r["state"], r["action"], ",".join(map(str, r["gpus"])),
                       r["fault"], r["why"]) for r in doc["nodes"]])  # fmt: skip
        return
    if not cfg.remediate.enabled:
        click.echo("remediation is disabled ([remediate] enabled = false): nothing done", err=True)
        sys.exit(1)
    from slurmhealth.hooks.healthcheck import healthcheck

    result = healthcheck(cfg)
    step = result.remediation or {}
    if as_json:
        render.print_json({"schema": "slurmhealth.remediate/1", **step,
                           "check_status": result.check.status})  # fmt: skip
    else:
        click.echo(f"{step.get('node')}: {step.get('action')}: {step.get('why')}")
