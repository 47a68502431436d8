"""Rendering for people (rich tables) and machines (versioned JSON). No logic.

Colour only on a terminal and never with ``NO_COLOR`` set (https://no-color.org); output
that is not a terminal (a pipe, a file) is never wrapped or cut: a table row stays one line
however long, so ``slurmhealth drains | grep REASON`` finds the whole reason.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

SEVERITY_STYLE = {"critical": "bold red", "fail": "red", "warn": "yellow", "info": "cyan"}
PIPE_WIDTH = 1_000_000  # columns of a console that is not a terminal: lines are never wrapped


def no_color() -> bool:
    """``NO_COLOR`` is set to something (no-color.org: present and not empty)."""
    return bool(os.environ.get("NO_COLOR"))


def style(text: str, **styles: Any) -> str:
    """``click.style`` unless ``NO_COLOR`` (click.echo drops styles off a terminal itself)."""
    import click

    return text if no_color() else click.style(text, **styles)


def echo_styled(text: str, **styles: Any) -> None:
    import click

    click.echo(style(text, **styles))


def utc(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))


def print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def table(
    title: str | None,
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    styles: Sequence[str | None] | None = None,
) -> None:
    """Print a table with rich; ``styles`` gives one style per row (or None)."""
    from rich.table import Table
    from rich.text import Text

    piped = not sys.stdout.isatty()
    t = Table(title=title, title_justify="left", show_lines=False, expand=False)
    for col in columns:
        t.add_column(col, overflow="fold", no_wrap=piped)
    for n, row in enumerate(rows):
        style = styles[n] if styles and n < len(styles) else None
        # Text(): values are data, never markup or emoji codes (":ab:" in a PCI id)
        t.add_row(*(Text("-" if v is None else str(v)) for v in row), style=style)
    console().print(t)


def console() -> Console:
    """A rich console: the terminal's width on a terminal, unbounded elsewhere; no colour
    off a terminal or with ``NO_COLOR``."""
    from rich.console import Console

    piped = not sys.stdout.isatty()
    return Console(
        soft_wrap=False,
        emoji=False,
        highlight=False,
        width=PIPE_WIDTH if piped else None,
        no_color=no_color(),
        color_system=None if piped or no_color() else "auto",
    )


def check_result(data: dict[str, Any]) -> None:
    """Print a check result (the dict of ``CheckResult.to_dict``).

    rich (40 ms to import) is loaded only when there is a table to draw, so a healthy
    node's answer stays fast."""
    import click

    gpus = ", ".join(str(g["index"]) for g in data["gpus"]) or "none"
    status = data["status"]
    colour = {"ok": "green", "warn": "yellow", "fail": "red"}[status]
    click.echo(
        f"{style(data['node'], bold=True)} {data['phase']} at {data['time']}: "
        f"{style(status.upper(), fg=colour, bold=True)} on GPU(s) {gpus} "
        f"in {data['duration_s'] * 1000:.0f} ms"
    )
    findings = data["findings"]
    if findings:
        table(
            None,
            ["GPU", "UUID", "check", "severity", "message", "action"],
            [
                (f["gpu"], f["uuid"], f["check"], f["severity"], f["message"], f["action"])
                for f in findings
            ],
            [SEVERITY_STYLE.get(f["severity"]) for f in findings],
        )
        hints = []
        for f in findings:
            if f["severity"] in ("fail", "critical") and f["hint"] not in hints:
                hints.append(f["hint"])
        for hint in hints:
            click.echo(f"  hint: {hint}")
    for note in data["notes"]:
        echo_styled(f"  note: {note}", dim=True)
    if not data["recorded"]:
        echo_styled("  note: history not writable; this run was spooled", fg="yellow")
