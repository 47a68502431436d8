"""``slurmhealth report JOBID``: parsing and output only; ``report.build`` does the work.

Exit codes: 0 report printed, 2 unknown job or bad option (an --html file that cannot be
written), 4 not allowed to read the job.
"""

from __future__ import annotations

import os

import click

from slurmhealth.cli.options import Ctx, json_option, pass_ctx
from slurmhealth.errors import UsageError


def parse_window(text: str | None) -> float | None:
    """``--window``: ``600``, ``90s``, ``10m``, ``2h``, ``1d`` -> seconds (more than 0)."""
    from slurmhealth.config.timeparse import duration_s

    if text is None:
        return None
    seconds = duration_s(text)
    if not seconds:
        raise UsageError(f"--window: {text!r} is not a duration (e.g. 600, 90s, 10m, 2h)")
    return seconds


@click.command()
@click.argument("job_id", metavar="JOBID")
@click.option(
    "--window",
    metavar="DURATION",
    help="Only timeline entries this close to the failure (10m, 600, 2h).",
)
@click.option(
    "--timeline",
    "full_timeline",
    is_flag=True,
    help="Show every timeline entry (default: what matters, repeats merged).",
)
@json_option
@click.option("--markdown", "as_markdown", is_flag=True, help="Print Markdown.")
@click.option(
    "--html",
    "html_file",
    metavar="FILE",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Write one self-contained HTML file with plots ('-': to stdout).",
)
@pass_ctx
def report(
    ctx: Ctx,
    job_id: str,
    window: str | None,
    full_timeline: bool,
    as_json: bool,
    as_markdown: bool,
    html_file: str | None,
) -> None:
    """What happened to JOBID and whose fault it was (hardware, system, application), what
    you and the admins should do, how well the job used its GPUs, then the diagnoses, the
    timeline (UTC) across all its nodes and where the evidence is.

    Reads every node history the config reaches and the shared evidence dir's summaries.
    Users may read their own jobs; root and the admin group of the root-owned system config
    any (else exit 4).
    """
    from slurmhealth.report.gather import build_report

    if as_json + as_markdown + (html_file is not None) > 1:
        raise UsageError("choose one of --json, --markdown, --html")
    if html_file not in (None, "-"):
        _check_writable(html_file)  # before the report is built, which may take a while
    cfg = ctx.config()
    result = build_report(cfg, job_id, window_s=parse_window(window), requester_uid=os.getuid(),
                          rights=ctx.rights())  # fmt: skip
    if as_json:
        from slurmhealth.cli.render import print_json
        from slurmhealth.report.render import to_json

        print_json(to_json(result))
    elif as_markdown:
        from slurmhealth.report.render import to_markdown

        click.echo(to_markdown(result, full_timeline), nl=False)
    elif html_file is not None:
        from slurmhealth.report.html import to_html

        _write_html(html_file, to_html(result))
        if html_file != "-":
            click.echo(f"report for job {result.job.job_id} written to {html_file}")
    else:
        from slurmhealth.cli.render import printing
        from slurmhealth.report.render import print_report

        with printing() as con:
            print_report(result, con, full_timeline)


def _check_writable(path: str) -> None:
    """A one-line usage error now for an --html file that cannot be written."""
    folder = os.path.dirname(path) or "."
    if os.path.isdir(path):
        raise UsageError(f"--html {path}: is a directory")
    if not os.path.isdir(folder):
        raise UsageError(f"--html {path}: no such directory {folder}")
    if not os.access(folder, os.W_OK) and not os.access(path, os.W_OK):
        raise UsageError(f"--html {path}: not writable")


def _write_html(path: str, html: str) -> None:
    if path == "-":
        click.echo(html, nl=False)
        return
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(html)
    except OSError as exc:
        raise UsageError(f"--html {path}: {exc.strerror or exc}") from None
