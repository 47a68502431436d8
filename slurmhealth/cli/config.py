"""``slurmhealth config check|show``: validate or show the effective configuration."""

from __future__ import annotations

import click

from slurmhealth.cli.options import Ctx, json_option, pass_ctx
from slurmhealth.errors import UsageError


@click.group()
def config() -> None:
    """Validate or show the effective configuration."""


@config.command("check")
@json_option
@pass_ctx
def config_check(ctx: Ctx, as_json: bool) -> None:
    """Validate the config (and the scenario, for the simulator); exit 2 on an error."""
    from slurmhealth.checks import validate_settings
    from slurmhealth.hooks.gpu_scope import node_topology

    cfg = ctx.config()
    validate_settings(cfg.checks.settings, cfg.checks.disabled, cfg.sources)
    node_topology(cfg)  # [gpu.topology.HOSTLIST] tables: keys, SKUs, hostlists
    if cfg.gpu.backend == "sim":
        from slurmhealth.gpu.scenario import load_scenario

        if not cfg.gpu.sim_scenario:
            raise UsageError("gpu.backend is 'sim' but gpu.sim_scenario is not set")
        load_scenario(cfg.gpu.sim_scenario)
    files = sorted({s for s in cfg.sources.values() if not s.startswith(("environment", "flag"))})
    if as_json:
        from slurmhealth.cli import render

        render.print_json({"schema": "slurmhealth.config-check/1", "ok": True, "files": files})
        return
    click.echo(f"config OK ({', '.join(files) or 'defaults only'})")


@config.command("show")
@json_option
@pass_ctx
def config_show(ctx: Ctx, as_json: bool) -> None:
    """Show every effective value and where it came from."""
    from slurmhealth.cli import render
    from slurmhealth.config import effective_items

    items = effective_items(ctx.config())
    if as_json:
        values = {k: {"value": v, "source": s} for k, v, s in items}
        render.print_json({"schema": "slurmhealth.config/1", "values": values})
        return
    render.table("effective configuration", ["key", "value", "source"], items)
