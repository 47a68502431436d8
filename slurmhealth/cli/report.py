"""``slurmhealth report JOBID``: parsing and output only; ``report.build`` does the work.

Exit codes: 0 report printed, 2 unknown job or bad option, 4 not allowed to read the job.
Added to the main group with ``cli.add_command(report)``.
"""

from __future__ import annotations

import os
import re

import click

from slurmhealth.errors import UsageError


def parse_window(text: str | None) -> float | None:
    """``600``, ``90s``, ``10m``, ``2h``, ``1d`` -> seconds."""
    if text is None:
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd]?)", text.strip())
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"--window: {text!r} is not a duration (e.g. 600, 90s, 10m, 2h)")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


@click.command()
@click.argument("job_id", metavar="JOBID")
@click.option(
    "--window",
    metavar="DURATION",
    help="Only timeline entries this close to the failure (10m, 600, 2h).",
)
@click.option("--json", "as_json", is_flag=True, help="Print versioned JSON.")
@click.option("--markdown", "as_markdown", is_flag=True, help="Print Markdown.")
@click.option(
    "--html",
    "html_file",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="Write one self-contained HTML file with plots.",
)
def report(
    job_id: str, window: str | None, as_json: bool, as_markdown: bool, html_file: str | None
) -> None:
    """What happened to JOBID, where and when (UTC) across all its nodes, the most likely
    root cause, how to verify it and where the evidence is.

    Reads every node history the config reaches and the shared evidence dir's summaries.
    Users may read their own jobs; root and the admin group any (else exit 4).
    """
    from slurmhealth.report.build import build_report

    if as_json + as_markdown + (html_file is not None) > 1:
        raise UsageError("choose one of --json, --markdown, --html")
    cfg = click.get_current_context().obj.config()
    result = build_report(cfg, job_id, window_s=parse_window(window), requester_uid=os.getuid())
    if as_json:
        from slurmhealth import render as base
        from slurmhealth.report.render import to_json

        base.print_json(to_json(result))
    elif as_markdown:
        from slurmhealth.report.render import to_markdown

        click.echo(to_markdown(result), nl=False)
    elif html_file is not None:
        from slurmhealth.report.html import to_html

        with open(html_file, "w", encoding="utf-8") as fh:
            fh.write(to_html(result))
        click.echo(f"report for job {result.job.job_id} written to {html_file}")
    else:
        from slurmhealth.report.render import print_report

        print_report(result)
