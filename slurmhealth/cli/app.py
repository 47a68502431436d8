"""The root ``slurmhealth`` group, its global options and the console entry point.

Exit codes: 0 healthy (or warnings only), 1 a failing finding, 2 usage or config error,
3 internal error, 4 not allowed (another user's report). Errors are one line on stderr;
``--debug`` adds the traceback.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Mapping
from typing import Any

import click

from slurmhealth.cli.options import Ctx
from slurmhealth.errors import SlurmhealthError

# command name -> "module:attribute" under slurmhealth.cli. A new command is one module
# (or one function in the module of its group) and one line here.
COMMANDS: Mapping[str, str] = {
    "check": "check:check",
    "checks": "check:list_checks",
    "history": "history:history",
    "drains": "history:drains",
    "nodes": "nodes:nodes",
    "resume": "nodes:resume",
    "prolog": "hooks:prolog",
    "epilog": "hooks:epilog",
    "sidecar": "hooks:sidecar",
    "healthcheck": "hooks:healthcheck",
    "report": "report:report",
    "baseline": "baseline:baseline",
    "validate": "baseline:validate",
    "evidence": "evidence:evidence",
    "incident": "incident:incident",
    "xid": "xid:xid",
    "config": "config:config",
}


class LazyGroup(click.Group):
    """Imports a subcommand's module only when the command is named (or ``--help`` lists
    them all): the prolog runs ``slurmhealth prolog`` before every job and should pay for
    its own module only."""

    def __init__(self, *args: Any, lazy: Mapping[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            module, attr = self.lazy[cmd_name].split(":")
            command = getattr(importlib.import_module(f"slurmhealth.cli.{module}"), attr)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
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
