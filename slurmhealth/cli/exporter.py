"""`slurmhealth exporter`: the node's one scrape target (logic in slurmhealth.exporter)."""

from __future__ import annotations

import click

from slurmhealth.cli.options import Ctx, pass_ctx


@click.command("exporter")
@click.option("--once", is_flag=True, help="Write the textfile (or print the exposition) once.")
@click.option("--port", type=int, help="Port of /metrics (overrides metrics.port; 0: none).")
@click.option("--textfile-dir", help="node_exporter textfile dir (overrides metrics.textfile_dir).")
@pass_ctx
def exporter(ctx: Ctx, once: bool, port: int | None, textfile_dir: str | None) -> None:
    """Serve this node's health and every running job's series on one fixed port
    (metrics.port) and/or in node_exporter's textfile dir; runs until SIGTERM."""
    import os
    import sys

    from slurmhealth.config import load_config
    from slurmhealth.exporter import ConfigWatch, run

    flags = {"paths.db": ctx.db, "metrics.port": port, "metrics.textfile_dir": textfile_dir}
    path = ctx.config_path
    watch = ConfigWatch(
        lambda: load_config(path, flags=flags),
        # a config that does not load: the defaults and the environment, so the node's
        # fail-opens (SLURMHEALTH_FAIL_OPEN_LOG) are still counted and served
        fallback=lambda: load_config(os.devnull, flags=flags),
    )
    sys.exit(run(watch, once=once))
