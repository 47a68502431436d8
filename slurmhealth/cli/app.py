"""The root ``slurmhealth`` group, its global options and the console entry point.

Exit codes (:data:`EXIT_CODES`, shown in ``--help``): 0 healthy (or warnings only), 1 a
failing finding or failed action, 2 usage or input error, 3 internal error, 4 not allowed,
130 interrupted. Errors are one line on stderr; ``--debug`` adds the traceback.

Global flags (``--debug``, ``--quiet``, ``--json``) are accepted before the command and
after it: every command gets hidden copies of ``--debug`` and ``--quiet`` when it loads, and
``--json`` before the command stands for the command's own.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import click

from slurmhealth.cli import failure
from slurmhealth.cli.options import Ctx

# command name -> "module:attribute" under slurmhealth.cli. A new command is one module
# (or one function in the module of its group) and one line here.
COMMANDS: Mapping[str, str] = {
    "check": "check:check",
    "checks": "check:list_checks",
    "history": "history:history",
    "drains": "history:drains",
    "nodes": "nodes:nodes",
    "resume": "nodes:resume",
    "remediate": "remediate:remediate",
    "prolog": "hooks:prolog",
    "epilog": "hooks:epilog",
    "sidecar": "hooks:sidecar",
    "healthcheck": "hooks:healthcheck",
    "ctld-epilog": "hooks:ctld_epilog",
    "epilog-finish": "hooks:epilog_finish",
    "report": "report:report",
    "baseline": "baseline:baseline",
    "validate": "baseline:validate",
    "evidence": "evidence:evidence",
    "incident": "incident:incident",
    "xid": "xid:xid",
    "exporter": "exporter:exporter",
    "config": "config:config",
    "install": "install:install",
    "sweep": "sweep:sweep",
}
DAEMONS = frozenset({"sidecar", "exporter"})  # long-running: every warning is printed
EXIT_CODES = (
    (0, "healthy, or warnings only: done"),
    (1, "unhealthy: a failed check, benchmark or comparison; a refused resume"),
    (2, "usage or input error: flag, value, config, file, unknown job or GPU,"),
    (None, "a history written by a newer slurmhealth"),
    (3, "internal error (--debug shows the traceback)"),
    (4, "not allowed: another user's job, an admin-only command"),
    (130, "interrupted (Ctrl-C)"),
)  # fmt: skip
# "\b": click prints the paragraph as it is, one code per line
EPILOG = "\b\nExit codes:\n" + "\n".join(
    f"  {'' if code is None else code:>3}  {what}" for code, what in EXIT_CODES
)


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
            self.add_command(_with_help(_with_global_flags(command), cmd_name), cmd_name)
        return super().get_command(ctx, cmd_name)


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    root = ctx.find_object(Ctx)
    if value and root is not None:
        root.debug = True
        logging.getLogger().setLevel(logging.DEBUG)


def _set_quiet(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    root = ctx.find_object(Ctx)
    if value and root is not None:
        root.quiet = True
        if not root.debug:
            logging.getLogger().setLevel(logging.ERROR)


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    root = ctx.find_object(Ctx)
    if value and root is not None:
        root.as_json = True


def _global_flags() -> list[click.Option]:
    """Hidden copies of the root's --debug and --quiet for a command's own arguments."""
    return [
        click.Option(["--debug"], is_flag=True, hidden=True, expose_value=False,
                     callback=_set_debug),
        click.Option(["--quiet", "-q"], is_flag=True, hidden=True, expose_value=False,
                     callback=_set_quiet),
    ]  # fmt: skip


def _with_global_flags(command: click.Command) -> click.Command:
    """``command`` (and a group's subcommands) accepting --debug and --quiet after its name;
    under --quiet its output goes nowhere unless JSON was asked for."""
    if getattr(command, "_global_flags", False):
        return command
    command.params.extend(_global_flags())
    own_json = any("--json" in getattr(p, "opts", ()) for p in command.params)
    if isinstance(command, click.Group) and not own_json:  # `slurmhealth config --json show`
        command.params.append(click.Option(["--json"], is_flag=True, hidden=True,
                                           expose_value=False, callback=_set_json))  # fmt: skip
    runs_alone = not isinstance(command, click.Group) or command.invoke_without_command
    if command.callback is not None and runs_alone:  # `history` runs without a subcommand
        command.callback = _quietable(command.callback)
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _with_global_flags(sub)
    command._global_flags = True  # type: ignore[attr-defined]
    return command


def _with_help(command: click.Command, path: str) -> click.Command:
    """``command``'s ``--help`` (and its subcommands') ends with its examples and names
    the config defaults its options fall back to."""
    from slurmhealth.cli.examples import config_defaults, epilog

    config_defaults(command)
    text = epilog(path)
    if text and text not in (command.epilog or ""):
        command.epilog = f"{command.epilog}\n\n{text}" if command.epilog else text
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            _with_help(sub, f"{path} {name}")
    return command


def _quietable(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        root = click.get_current_context().find_object(Ctx)
        if root is None or not root.quiet or kwargs.get("as_json"):
            return fn(*args, **kwargs)
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            return fn(*args, **kwargs)

    return run


@click.group(
    cls=LazyGroup,
    lazy=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"], "show_default": True},
    epilog=EPILOG,
)
@click.option(
    "--config",
    "config_path",
    envvar="SLURMHEALTH_CONFIG",
    metavar="FILE",
    help="Config file (default /etc/slurmhealth/config.toml).",
)
@click.option("--db", metavar="PATH", help="History database (overrides paths.db).")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs (anywhere).")
@click.option(
    "--quiet",
    "-q",
    is_flag=True,
    help="Print nothing but errors (and asked-for JSON); the exit code tells (anywhere).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the command's own --json.")
@click.version_option(package_name="slurmhealth")
@click.pass_context
def cli(
    click_ctx: click.Context,
    config_path: str | None,
    db: str | None,
    debug: bool,
    quiet: bool,
    as_json: bool,
) -> None:
    """slurmhealth: GPU health checks, history and diagnosis for Slurm clusters.

    Output: tables for people, the terminal's width; piped, plain and COLUMNS (else 100)
    wide, no colour (nor with NO_COLOR set); --json prints one object with a "schema" key.
    A warning is printed once per run, its repeats counted ("... (x200)").

    \b
    Start here:
      slurmhealth check              run every check on this node's GPUs now
      slurmhealth nodes              each node's Slurm state and its last check
      slurmhealth report 1234        what happened to job 1234 and what to do
      slurmhealth COMMAND --help     each command's options, defaults and an example"""
    click_ctx.obj = Ctx(config_path, db, debug, quiet, as_json)
    quiet_level = logging.ERROR if quiet else logging.WARNING
    before = list(logging.getLogger().handlers)
    logging.basicConfig(
        level=logging.DEBUG if debug else quiet_level,
        format="slurmhealth: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    if click_ctx.invoked_subcommand not in DAEMONS:  # a daemon's repeats are news each time
        from slurmhealth.cli import once

        once.install_on_root(skip=before)  # ours, not a host program's (pytest's capture)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one line on stderr per error, exit codes as documented."""
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    try:
        cli.main(args=argv, prog_name="slurmhealth", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.UsageError as exc:  # one line, naming the command, as every other error
        if type(exc).__name__ == "NoArgsIsHelpError":  # click >= 8.2: a bare group name
            click.echo(exc.format_message(), err=True)
            sys.exit(2)
        where = exc.ctx.command_path if exc.ctx is not None else "slurmhealth"
        click.echo(f"{where}: error: {exc.format_message()} (see {where} --help)", err=True)
        sys.exit(2)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2 if exc.exit_code not in (0, 1) else exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        failure.exit_for(KeyboardInterrupt())
    except Exception as exc:  # SlurmhealthError, a broken pipe, the rest
        failure.exit_for(exc, debug)
