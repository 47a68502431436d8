"""`slurmhealth exporter`: the node's one scrape target (logic in slurmhealth.agent.exporter)."""

from __future__ import annotations

import click

from slurmhealth.cli.options import Ctx, pass_ctx


@click.command("exporter")
@click.option("--once", is_flag=True, help="Write the textfile (or print the exposition) once.")
@click.option("--port", type=int, help="Port of /metrics (overrides metrics.port; 0: none).")
@click.option("--textfile-dir", help="node_exporter textfile dir (overrides metrics.textfile_dir).")
@click.option(
    "--agent/--no-agent",
    default=True,
    show_default=True,
    help="Also be the node agent the prolog and epilog ask (run dir's agent.sock).",
)
@pass_ctx
def exporter(ctx: Ctx, once: bool, port: int | None, textfile_dir: str | None, agent: bool) -> None:
    """Serve this node's health and every running job's series on one fixed port
    (metrics.port) and/or in node_exporter's textfile dir; runs until SIGTERM. It is also
    the node agent: GPU library kept open, the latest snapshot shared by the prologs, the
    epilog's after-work (docs/agent.md)."""
    import os
    import sys

    from slurmhealth.agent.exporter import ConfigWatch, run
    from slurmhealth.config import load_config

    flags = {"paths.db": ctx.db, "metrics.port": port, "metrics.textfile_dir": textfile_dir}
    path = ctx.config_path
    watch = ConfigWatch(
        lambda: load_config(path, flags=flags),
        # a config that does not load: the defaults and the environment, so the node's
        # fail-opens (SLURMHEALTH_FAIL_OPEN_LOG) are still counted and served
        fallback=lambda: load_config(os.devnull, flags=flags),
    )
    sys.exit(run(watch, once=once, agent=agent and not once))
