"""Rendering for people (rich tables) and machines (versioned JSON). No logic.

Colour only on a terminal and never with ``NO_COLOR`` set (https://no-color.org). Width: the
terminal's on a terminal; off one (a pipe, a file) ``COLUMNS`` or 100 for text and panels.
A piped table row stays one line up to :data:`PIPE_TABLE_MAX` columns (so
``slurmhealth drains | grep n2`` finds the whole reason) and folds beyond: no piped line is
wider than that.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

SEVERITY_STYLE = {"critical": "bold red", "fail": "red", "warn": "yellow", "info": "cyan"}
PIPE_WIDTH = 100  # columns of text and panels off a terminal, unless COLUMNS says otherwise
PIPE_TABLE_MAX = 200  # a piped table row stays one line up to this many columns, folds beyond


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
    """Print a table with rich; ``styles`` gives one style per row (or None). No rows: one
    line, ``TITLE: none``, instead of an empty frame."""
    from rich.table import Table
    from rich.text import Text

    rows = list(rows)
    if not rows:
        import click

        click.echo(f"{title or 'rows'}: none")
        return
    t = Table(title=title, title_justify="left", show_lines=False, expand=False)
    for col in columns:
        t.add_column(col, overflow="fold")
    for n, row in enumerate(rows):
        style = styles[n] if styles and n < len(styles) else None
        # Text(): values are data, never markup or emoji codes (":ab:" in a PCI id)
        t.add_row(*(Text("-" if v is None else str(v)) for v in row), style=style)
    piped = not sys.stdout.isatty()
    with printing(max(width(), PIPE_TABLE_MAX) if piped else None) as con:
        con.print(t)


@contextlib.contextmanager
def printing(columns: int | None = None) -> Iterator[Console]:
    """A :func:`console` to print on; off a terminal what it printed goes out at the end
    with each line's trailing blanks cut (rich pads a title to the table's width)."""
    if sys.stdout.isatty():
        yield console(columns)
        return
    import io

    con = console(columns)
    con.file = buffer = io.StringIO()
    try:
        yield con
    finally:
        text = buffer.getvalue()
        sys.stdout.write("".join(line.rstrip() + "\n" for line in text.splitlines()))
        sys.stdout.flush()


def width() -> int:
    """Columns to fill off a terminal: ``COLUMNS`` when it is a number (20 or more), else
    :data:`PIPE_WIDTH`. (On a terminal rich asks the terminal.)"""
    text = os.environ.get("COLUMNS", "").strip()
    return int(text) if text.isdigit() and int(text) >= 20 else PIPE_WIDTH


def console(columns: int | None = None) -> Console:
    """A rich console: the terminal's width on a terminal, ``columns`` or :func:`width` off
    one; no colour off a terminal or with ``NO_COLOR``."""
    from rich.console import Console

    piped = not sys.stdout.isatty()
    return Console(
        soft_wrap=False,
        emoji=False,
        highlight=False,
        width=(columns or width()) if piped else None,
        no_color=no_color(),
        color_system=None if piped or no_color() else "auto",
    )


def text_width() -> int:
    """Columns for plain text: the terminal's, else :func:`width`."""
    if sys.stdout.isatty():
        import shutil

        return shutil.get_terminal_size().columns
    return width()


def wrapped(prefix: str, text: str) -> str:
    """``prefix`` + ``text`` wrapped at :func:`text_width`, the lines after the first
    indented under the text; a word, a path or a `quoted command` is never broken."""
    import re
    import textwrap

    kept = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", "\0"), text)
    return textwrap.fill(kept, max(40, text_width()), initial_indent=prefix,
                         subsequent_indent=" " * len(prefix), break_long_words=False,
                         break_on_hyphens=False).replace("\0", " ")  # fmt: skip


def key_values(title: str, items: Iterable[tuple[str, object]]) -> None:
    """``title`` then one ``key: value`` line each, the keys aligned (a record, not a
    table: it reads the same at any width)."""
    import click

    pairs = [(k, "-" if v is None or v == "" else str(v)) for k, v in items]
    pad = max((len(k) for k, _ in pairs), default=0) + 1
    click.echo(style(title, bold=True))
    for k, v in pairs:
        click.echo(wrapped(f"  {k + ':':<{pad}} ", v))


def check_result(data: dict[str, Any]) -> None:
    """Print a check result (the dict of ``CheckResult.to_dict``).

    rich (40 ms to import) is loaded only when there is a table to draw, so a healthy
    node's answer stays fast."""
    import click

    status = data["status"]
    colour = {"ok": "green", "warn": "yellow", "fail": "red"}[status]
    click.echo(
        f"{style(data['node'], bold=True)} {data['phase']} at {data['time']}: "
        f"{style(status.upper(), fg=colour, bold=True)} {check_headline(data)} "
        f"({data['duration_s'] * 1000:.0f} ms)"
    )
    findings = data["findings"]
    if findings:
        # a terminal under 120 columns leaves the UUID out (--json has it): the message first
        keys = ["gpu", "check", "severity", "message", "action"]
        if not sys.stdout.isatty() or text_width() >= 120:
            keys.append("uuid")
        table(
            None,
            [k.upper() if k in ("gpu", "uuid") else k for k in keys],
            [tuple(f[k] for k in keys) for f in findings],
            [SEVERITY_STYLE.get(f["severity"]) for f in findings],
        )
        hints = []
        for f in findings:
            if f["severity"] in ("fail", "critical") and f["hint"] not in hints:
                hints.append(f["hint"])
        for hint in hints:
            click.echo(wrapped("  hint: ", hint))
    from slurmhealth.cli import once

    for note in data["notes"]:
        if not once.shown(note):  # a warning stderr already carried this run: not twice
            echo_styled(wrapped("  note: ", note), dim=True)
    if not data["recorded"]:
        echo_styled("  note: history not writable; this run was spooled", fg="yellow")


HEADLINE_ITEMS = 3  # failing GPUs/links/ports named in a check's headline; the rest counted


def check_headline(data: dict[str, Any]) -> str:
    """What failed, named: ``on GPU 3 (NVLink 7 inactive); 7 other GPUs passed``. Only the
    worst severity's findings are named (warnings alone when nothing failed), each GPU once
    with its messages; node-level findings (a port, the driver) by their message."""
    findings = data["findings"]
    worst = ("fail", "critical") if data["status"] == "fail" else ("warn",)
    named: dict[object, list[str]] = {}
    for f in findings:
        if f["severity"] in worst:
            named.setdefault(f["gpu"], [])
            if f["message"] not in named[f["gpu"]]:
                named[f["gpu"]].append(f["message"])
    touched = {f["gpu"] for f in findings if f["severity"] in ("warn", "fail", "critical")}
    passed = sum(1 for g in data["gpus"] if g["index"] not in touched)
    n = len(data["gpus"])
    if not named:
        return f"on {n} GPU{'s' if n != 1 else ''}, all passed" if n else "(no GPUs checked)"
    items = [_named(gpu, msgs) for gpu, msgs in sorted(named.items(), key=_gpu_first)]
    text = "on " + ", ".join(items[:HEADLINE_ITEMS])
    if len(items) > HEADLINE_ITEMS:
        text += f" and {len(items) - HEADLINE_ITEMS} more"
    warned = sum(1 for f in findings if f["severity"] == "warn") if "warn" not in worst else 0
    if warned:
        text += f"; {warned} warning{'s' if warned != 1 else ''}"
    if passed:
        text += f"; {passed} other GPU{'s' if passed != 1 else ''} passed"
    return text


def _gpu_first(item: tuple[object, list[str]]) -> tuple[int, int]:
    gpu = item[0]
    return (1, 0) if not isinstance(gpu, int) else (0, gpu)


def _named(gpu: object, messages: list[str]) -> str:
    more = f", +{len(messages) - 1} more" if len(messages) > 1 else ""
    if gpu is None:
        return messages[0] + more
    return f"GPU {gpu} ({messages[0]}{more})"
