"""The commands Slurm runs: ``prolog`` and ``epilog``, the per-job ``sidecar`` the
prolog starts, and ``healthcheck`` (HealthCheckProgram, between jobs). Every log line
names the job and the node (it ends up in slurmd's log)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys

import click

from slurmhealth.cli.options import Ctx, gpus_option, json_option, pass_ctx
from slurmhealth.hooks.entry import hook_setup, run_hook


def _hook(ctx: Ctx, name: str) -> None:
    run_hook(ctx.config(), name)


@click.command()
@pass_ctx
def prolog(ctx: Ctx) -> None:
    """Slurm Prolog: check the job's GPUs (SLURM_JOB_GPUS); on a failing check drain the
    node with a precise reason and exit 1 so Slurm requeues the job elsewhere.

    Run it through prolog/slurmhealth-prolog, which adds the time limit and fails open.
    """
    _hook(ctx, "prolog")


@click.command()
@pass_ctx
def epilog(ctx: Ctx) -> None:
    """Slurm Epilog: record the job's end, re-check its GPUs and drain with a precise
    reason when a fault appeared during the job. Always exits 0 on a decision."""
    _hook(ctx, "epilog")


@click.command()
@click.option("--job", "job_id", envvar="SLURM_JOB_ID", required=True, help="Slurm job id.")
@gpus_option("GPU indices (default all).", envvar="SLURM_JOB_GPUS")
@click.option("--interval", type=float, help="Sampling interval in seconds (>= 1).")
@pass_ctx
def sidecar(ctx: Ctx, job_id: str, gpus: tuple[int, ...] | None, interval: float | None) -> None:
    """Sample the job's GPUs, serve them on /metrics with the job's labels, detect faults.

    The prolog starts one per job per node and the epilog stops it; inside a batch script
    `slurmhealth sidecar &` works too. Exits on SIGTERM or when the job is gone.
    """
    import json

    from slurmhealth.model_records import Job
    from slurmhealth.sidecar.lifecycle import LABELS_ENV
    from slurmhealth.sidecar.run import Sidecar

    hook_setup("sidecar")
    flags = {} if interval is None else {"sidecar.interval_s": interval}
    cfg = ctx.config(flags)
    from slurmhealth.hooks.job import clean_env

    env = clean_env(os.environ)
    raw = env.get(LABELS_ENV)
    labels = Job(**json.loads(raw)) if raw else None
    if labels is None or labels.job_id != job_id:
        labels = Job(
            job_id=job_id,
            user=env.get("SLURM_JOB_USER", env.get("USER", "")),
            account=env.get("SLURM_JOB_ACCOUNT", ""),
            partition=env.get("SLURM_JOB_PARTITION", ""),
            qos=env.get("SLURM_JOB_QOS", ""),
            node=env.get("SLURMD_NODENAME", cfg.node_name),
            nodes=env.get("SLURM_JOB_NODELIST", ""),
        )
    sys.exit(Sidecar(cfg, labels, gpus or ()).run())


@click.command()
@json_option
@pass_ctx
def healthcheck(ctx: Ctx, as_json: bool) -> None:
    """Slurm HealthCheckProgram: check every GPU of this idle node between jobs and drain
    it with the prolog's reasons, etiquette and circuit breaker when one fails. On a node
    with jobs the checks for a previous job's leftovers are skipped (and named). Resumes a
    node only through remediation ([remediate] enabled: reset, validate, resume).

    Always exits 0 (slurmd acts on nothing else; a non-zero exit at slurmd's start keeps
    the node from registering): errors are logged, and the node is left as it is. Run it
    through healthcheck/slurmhealth-healthcheck, which adds the time limit and syslog.
    """
    from slurmhealth.cli import render
    from slurmhealth.hooks.healthcheck import healthcheck as run

    hook_setup("healthcheck")
    hook_log = logging.getLogger("slurmhealth.hooks")
    try:
        cfg = ctx.config()
        hook_setup("healthcheck", cfg.node_name)
        result = run(cfg)
    except Exception as exc:  # fail open, loudly: a broken checker never drains
        hook_log.error("%s: %s; nothing checked, node left as it is", type(exc).__name__, exc,
                       exc_info=ctx.debug)  # fmt: skip
        sys.exit(0)
    data = result.to_dict()
    drain = result.drain
    summary = data["status"] + (f"; {drain.state}: {drain.reason}" if drain else "")
    hook_log.log(logging.DEBUG if summary == "ok" else logging.INFO, "%s%s", summary,
                 f" ({drain.detail})" if drain and drain.detail else "")  # fmt: skip
    if as_json:
        render.print_json(data)
    else:
        render.check_result(data)
    sys.exit(0)


@click.command("ctld-epilog")
@pass_ctx
def ctld_epilog(ctx: Ctx) -> None:
    """Slurm EpilogSlurmctld (on the controller): store the job's summary (verdict, whose
    fault, drains, failing GPUs, efficiency; at most 4000 characters) in its AdminComment in
    slurmdbd, for `sacct -o AdminComment` and `slurmhealth report` on any login node.

    Waits (at most 15 s) for the nodes' epilog summaries. Always exits 0: errors are
    logged. Run it through slurmhealth-ctld-epilog, which adds the time limit and syslog.
    """
    from slurmhealth.hooks.ctld_epilog import run_ctld_epilog

    hook_setup("ctld-epilog", "controller")
    hook_log = logging.getLogger("slurmhealth.hooks")
    try:
        result = run_ctld_epilog(ctx.config(), os.environ)
    except Exception as exc:  # fail open, loudly: slurmctld must never see this fail
        hook_log.error("%s: %s; no job summary stored", type(exc).__name__, exc,
                       exc_info=ctx.debug)  # fmt: skip
        sys.exit(0)
    if result.stored:
        hook_log.info("job summary stored in AdminComment (%d characters)", result.chars)
    else:
        hook_log.error("no job summary stored: %s", result.why)
    sys.exit(0)


@click.command("epilog-finish")
@click.argument("entries", nargs=-1)
@pass_ctx
def epilog_finish(ctx: Ctx, entries: tuple[str, ...]) -> None:
    """The epilog's after-work, detached from it: wait for the sidecar's final flush, the
    evidence bundle and summary.json, retention, and on the job's first node the job's
    summary in its AdminComment. ENTRY: a journal entry the epilog wrote in the run dir;
    none: every entry of this node no live worker holds (after a crash). Always exits 0.
    """
    from slurmhealth.hooks.finish import finish, finish_pending

    with contextlib.suppress(OSError):
        os.nice(10)  # behind the node's next prolog and job
    job = os.path.basename(entries[0]).split(".")[0] if entries else "pending"
    os.environ["SLURM_JOB_ID"] = job
    hook_setup("epilog-finish")
    hook_log = logging.getLogger("slurmhealth.hooks")
    try:
        cfg = ctx.config()
        for path in entries:
            hook_log.info("%s", finish(cfg, path) or "done")
        for path, what in finish_pending(cfg, cfg.node_name).items():  # a dead worker's
            hook_log.info("%s: %s", os.path.basename(path), what)
    except Exception as exc:  # fail open, loudly: the job's verdict is already out
        hook_log.error("%s: %s; the entry stays for the next agent start",
                       type(exc).__name__, exc, exc_info=ctx.debug)  # fmt: skip
    sys.exit(0)
