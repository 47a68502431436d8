"""`slurmhealth xid N`: what one NVIDIA Xid means and what to do (rendering only)."""

from __future__ import annotations

import click

from slurmhealth.cli.options import json_option
from slurmhealth.errors import UsageError


@click.command("xid")
@click.argument("number")
@json_option
def xid(number: str, as_json: bool) -> None:
    """Explain Xid NUMBER: its catalog name, immediate action, verdict and hint.

    \b
    Example:
      slurmhealth xid 79     # GPU has fallen off the bus: what to do
    """
    from slurmhealth.checks.xid_table import explain
    from slurmhealth.cli import render

    if not (number.isascii() and number.isdigit() and len(number) <= 5):
        raise UsageError(f"xid: {number!r} is not an Xid number (0-99999)")
    info = explain(int(number))
    if as_json:
        render.print_json({"schema": "slurmhealth.xid/1", **info})
        return
    render.key_values(f"Xid {int(number)}", info.items())
