"""The ``slurmhealth(1)`` man page, rendered from the click help of every command, so the
page and ``--help`` never disagree. ``slurmhealth install`` writes it (gzipped) to
``/usr/share/man/man1/slurmhealth.1.gz``; ``man -l`` reads the groff text as well."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import click

from slurmhealth import __version__


def _escape(text: str) -> str:
    """groff-safe text: backslashes doubled, a leading dot or quote escaped, hyphens as
    minus signs so options copy and paste."""
    lines = []
    for line in text.replace("\\", "\\e").replace("-", "\\-").splitlines():
        lines.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(lines)


def _commands(group: click.Group, ctx: click.Context) -> Iterator[tuple[str, click.Command]]:
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        path = f"{ctx.command_path} {name}"
        yield path, cmd
        if isinstance(cmd, click.Group):
            sub = click.Context(cmd, info_name=name, parent=ctx)
            yield from _commands(cmd, sub)


def _help_of(cmd: click.Command, ctx: click.Context) -> str:
    """The command's own ``--help`` text, usage line included, at a fixed width."""
    fmt = click.HelpFormatter(width=78, max_width=78)
    cmd.format_help(ctx, fmt)
    return fmt.getvalue().rstrip()


def render(root: click.Group, date: dt.date | None = None) -> str:
    """The man page of ``root`` and every visible command below it, in groff ``man``."""
    day = (date or dt.date.today()).isoformat()
    # the root's context settings (defaults shown), as `slurmhealth --help` has them
    ctx = click.Context(root, info_name="slurmhealth", **root.context_settings)
    out = [
        f'.TH SLURMHEALTH 1 "{day}" "slurmhealth {__version__}" "User Commands"',
        ".SH NAME",
        "slurmhealth \\- GPU health checks, history and diagnosis for Slurm clusters",
        ".SH SYNOPSIS",
        ".B slurmhealth",
        "[\\fIOPTIONS\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR]...",
        ".SH DESCRIPTION",
        ".nf",
        _escape(_help_of(root, ctx)),
        ".fi",
        ".SH COMMANDS",
    ]
    for path, cmd in _commands(root, ctx):
        sub = click.Context(cmd, info_name=path.split(" ", 1)[1], parent=ctx)
        out += [f".SS {_escape(path)}", ".nf", _escape(_help_of(cmd, sub)), ".fi"]
    out += [
        ".SH FILES",
        ".TP",
        "/etc/slurmhealth/config.toml",
        "settings (see \\fBslurmhealth config show\\fR)",
        ".TP",
        "/etc/default/slurmhealth",
        "the wrappers' settings (SLURMHEALTH_BIN, SLURMHEALTH_LOG_FILE, timeouts)",
        ".TP",
        "/usr/lib/slurmhealth/slurmhealth\\-{prolog,epilog,healthcheck}",
        "what slurm.conf's Prolog, Epilog and HealthCheckProgram name",
        ".TP",
        "/usr/lib/slurmhealth/slurmhealth\\-ctld\\-epilog",
        "what slurm.conf's EpilogSlurmctld names (on the controller)",
        ".TP",
        "/var/lib/slurmhealth/history/history.db",
        "the node's history",
        ".TP",
        "/var/log/slurmhealth/slurmhealth.log",
        "file log (also in syslog/journal: \\fBjournalctl \\-t slurmhealth\\fR)",
    ]
    return "\n".join(out) + "\n"
