"""`slurmhealth evidence capture|list|show|prune`: a job's evidence bundles (no logic here)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import click

from slurmhealth.cli import render
from slurmhealth.cli.options import Ctx, gpus_option, json_option, pass_ctx
from slurmhealth.errors import UsageError

if TYPE_CHECKING:
    from slurmhealth.access import Owner, Rights
    from slurmhealth.config import Config


def _job_row(cfg: Config, job_id: str, node: str) -> dict[str, Any]:
    """The history's ``jobs`` row for the job ({} when there is none)."""
    from slurmhealth.history.read import Reader, StoreError, job_row

    path = cfg.db_path(node)
    if not os.path.exists(path):
        return {}
    try:
        with Reader(path) as db:
            out = job_row(db, job_id) or {}
    except StoreError:
        return {}
    if not isinstance(out.get("gpus"), list):
        out["gpus"] = []
    return out


def _bundle_owner(path: str, manifest: Mapping[str, Any] | None) -> Owner:
    """A bundle's owner: the job's uid its folder's ACL lets read it (an older bundle's
    folder belonged to it), else the user its root-written manifest names."""
    from slurmhealth import access
    from slurmhealth.evidence import bundle

    name = (manifest or {}).get("user")
    return access.job_owner(bundle.reader_of(path), str(name) if name else None)


def _job_nodes(cfg: Config, job_id: str, rights: Rights) -> list[str]:
    """The nodes with a bundle of the job (the evidence root itself may not be listable);
    a job folder the file modes keep the caller out of is a refusal (exit 4)."""

    from slurmhealth import access
    from slurmhealth.evidence import bundle

    folder = os.path.join(bundle.evidence_root(cfg), bundle.safe_name(job_id, "job id"))
    try:
        return sorted(e.name for e in os.scandir(folder) if e.is_dir(follow_symlinks=False))
    except PermissionError:
        owner: str | None = None
        with contextlib.suppress(OSError):
            owner = access.job_owner(bundle.reader_of(folder) or 0).name
        raise access.job_denied(job_id, owner, rights, "evidence") from None
    except OSError:
        return []


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _files_table(title: str, files: Sequence[Mapping[str, Any]]) -> None:
    render.table(
        title,
        ["file", "source", "size", "sha256", "cut", "s", "error"],
        [
            (
                f["name"],
                f.get("source"),
                _size(f.get("size") or 0),
                (f.get("sha256") or "")[:12],
                "timed out" if f.get("timed_out") else "yes" if f.get("truncated") else "",
                f.get("elapsed_s"),
                f.get("error") or "",
            )
            for f in files
        ],
    )


@click.group()
def evidence() -> None:
    """Evidence bundles: logs, dumps and stacks a job left behind, kept for diagnosis."""


@evidence.command("capture")
@click.argument("job_id")
@click.option("--node", help="Node name (default: this node).")
@gpus_option("GPU indices (default: the job's, else all).")
@click.option("--reason", default="manual", show_default=True, help="Why (recorded).")
@click.option("--stdout", "stdout_path", metavar="FILE", help="The job's output file.")
@click.option("--stderr", "stderr_path", metavar="FILE", help="The job's error file.")
@click.option("--pid", "pids", type=int, multiple=True, help="Python process to dump (repeat).")
@click.option("--budget", type=float, help="Seconds for the whole capture (evidence.budget_s).")
@json_option
@pass_ctx
def capture_cmd(
    ctx: Ctx,
    job_id: str,
    node: str | None,
    gpus: tuple[int, ...] | None,
    reason: str,
    stdout_path: str | None,
    stderr_path: str | None,
    pids: tuple[int, ...],
    budget: float | None,
    as_json: bool,
) -> None:
    """Capture JOB_ID's evidence bundle on this node now (job details from the history).
    Root and the admin group only."""
    from slurmhealth import access
    from slurmhealth.evidence.capture import capture

    access.require_admin(ctx.caller(), ctx.rights(), "capture evidence")
    cfg = ctx.config()
    node = node or cfg.node_name
    row = _job_row(cfg, job_id, node)
    result = capture(
        cfg,
        job_id,
        node,
        reason=reason,
        gpus=list(gpus) if gpus is not None else list(row.get("gpus") or ()),
        user=row.get("user") or "",
        uid=row.get("uid"),
        start_ts=row.get("start_ts"),
        end_ts=row.get("end_ts"),
        stdout_path=stdout_path,
        stderr_path=stderr_path,
        pids=pids,
        budget_s=budget if budget is not None else cfg.evidence.budget_s,
    )
    if as_json:
        render.print_json({
            "schema": "slurmhealth.evidence-capture/1", "dir": result.dir,
            "files": list(result.files), "truncated": result.truncated,
            "elapsed_s": result.elapsed_s, "skipped": dict(result.skipped),
            "recorded": result.recorded, "notes": list(result.notes),
        })  # fmt: skip
        return
    click.echo(f"{result.dir}: {len(result.files)} files in {result.elapsed_s:.2f} s"
               + (" (some cut: see the manifest)" if result.truncated else ""))  # fmt: skip
    _files_table("", list(result.files))
    for source, why in sorted(result.skipped.items()):
        render.echo_styled(f"  skipped {source}: {why}", dim=True)
    for note in result.notes:
        render.echo_styled(f"  note: {note}", fg="yellow")


@evidence.command("list")
@json_option
@pass_ctx
def list_cmd(ctx: Ctx, as_json: bool) -> None:
    """Bundles under the evidence directory, newest first (a user: their own jobs')."""
    from slurmhealth import access
    from slurmhealth.evidence import bundle, list_bundles

    cfg, caller, rights = ctx.config(), ctx.caller(), ctx.rights()
    root = bundle.evidence_root(cfg)
    if os.path.isdir(root) and not os.access(root, os.R_OK):  # 0711: root lists, all traverse
        raise access.AccessDenied(f"only root may list {root}; "
                                  "name the job: slurmhealth evidence show JOBID")  # fmt: skip
    bundles = [b for b in list_bundles(cfg)
               if access.may_read_job(caller, rights, *_bundle_owner(b["path"], None))]  # fmt: skip
    if as_json:
        render.print_json({"schema": "slurmhealth.evidence-list/1", "bundles": bundles})
        return
    render.table(
        "evidence bundles",
        ["job", "node", "files", "size", "modified (UTC)", "reason", "cut"],
        [
            (
                b["job"],
                b["node"],
                b["files"],
                _size(b["size"]),
                render.utc(b["mtime"]),
                b["reason"] or ("summary only" if not b["captured"] else ""),
                "yes" if b["truncated"] else "",
            )
            for b in bundles
        ],
    )


@evidence.command("show")
@click.argument("job_id")
@click.option("--node", help="Only this node (default: every node with a bundle).")
@json_option
@pass_ctx
def show_cmd(ctx: Ctx, job_id: str, node: str | None, as_json: bool) -> None:
    """Print the manifest of JOB_ID's bundle(s): its owner, root and the admin group."""
    from slurmhealth import access
    from slurmhealth.evidence import bundle, read_manifest

    cfg, caller, rights = ctx.config(), ctx.caller(), ctx.rights()
    manifests = []
    listed = _job_nodes(cfg, job_id, rights)
    for n in [node] if node else listed:
        path = bundle.bundle_path(cfg, job_id, n)
        if not os.path.isdir(path):
            continue
        m = read_manifest(cfg, job_id, n)
        owner = _bundle_owner(path, m)
        if not access.may_read_job(caller, rights, *owner):
            raise access.job_denied(job_id, owner.name, rights, "evidence")
        manifests += [m] if m and bundle.captured(m) else []  # not a summary's alone
    if not manifests:
        where = f" on {node}" if node else ""
        raise UsageError(f"no evidence bundle for job {job_id}{where}")
    if as_json:
        render.print_json({"schema": "slurmhealth.evidence-show/1", "manifests": manifests})
        return
    for m in manifests:
        click.echo(f"job {m['job_id']} on {m['node']}: {m.get('reason')} at "
                   f"{render.utc(m.get('created'))}, {m.get('elapsed_s')} s")  # fmt: skip
        _files_table("", list(m.get("files", [])))
        for source, why in sorted((m.get("skipped") or {}).items()):
            render.echo_styled(f"  skipped {source}: {why}", dim=True)


@evidence.command("prune")
@click.option("--max-age-days", type=float, help="Remove older bundles (evidence.max_age_days).")
@click.option("--max-total-gb", type=float, help="Then the oldest above this total size.")
@click.option("--dry-run", is_flag=True, help="Only say what would be removed.")
@json_option
@pass_ctx
def prune_cmd(
    ctx: Ctx, max_age_days: float | None, max_total_gb: float | None, dry_run: bool, as_json: bool
) -> None:
    """Remove old bundles: older than an age, then the oldest until under a size. Root and
    the admin group only."""
    from slurmhealth import access
    from slurmhealth.evidence import prune

    access.require_admin(ctx.caller(), ctx.rights(), "prune evidence")
    cfg = ctx.config()
    age = cfg.evidence.max_age_days if max_age_days is None else max_age_days
    gb = cfg.evidence.max_total_gb if max_total_gb is None else max_total_gb
    removed = prune(cfg, age or None, int(gb * 1024**3) or None, dry_run=dry_run)
    if as_json:
        render.print_json({"schema": "slurmhealth.evidence-prune/1", "dry_run": dry_run,
                           "removed": removed})  # fmt: skip
        return
    verb = "would remove" if dry_run else "removed"
    click.echo(f"{verb} {len(removed)} bundle(s)")
    for path in removed:
        click.echo(f"  {path}")
