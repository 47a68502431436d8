"""``slurmhealth baseline ...`` and ``slurmhealth validate``: parsing and output only.

Exit codes: 0 fine, 1 a benchmark reported errors / a metric fails its reference / the
validation failed, 2 usage error (unreadable file, unknown benchmark).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click

from slurmhealth.cli.options import Ctx, json_option, pass_ctx
from slurmhealth.errors import UsageError

if TYPE_CHECKING:
    from slurmhealth.baseline.compare import Ref, RefKey
    from slurmhealth.config import Config


@click.group()
def baseline() -> None:
    """Benchmark baselines: store results, compare nodes with the fleet, find outliers."""


@baseline.command("ingest")
@click.argument(
    "kind", type=click.Choice(["nccl", "gpuburn", "fio", "nvbandwidth", "dcgm", "perftest"])
)
@click.argument("file", metavar="FILE")
@click.option("--node", help="Node the result belongs to (default: this node).")
@click.option("--gpu-model", help="GPU model, e.g. 'NVIDIA H100 80GB HBM3'.")
@click.option("--label", help="Free label, e.g. 'acceptance' or 'after-rma'.")
@click.option("--test", help="The tool, when the output does not name it (ib_write_bw).")
@click.option(
    "--perftest-output",
    type=click.Choice(["bandwidth", "message_rate", "latency"]),
    help="perftest ran with --output=...: one number per run (give --test too).",
)
@click.option(
    "--perftest-unit",
    type=click.Choice(["MiB/sec", "MB/sec", "Gb/sec"]),
    help="Unit of a --perftest-output bandwidth (Gb/sec with --report_gbits).",
)
@json_option
@pass_ctx
def ingest_cmd(
    ctx: Ctx,
    kind: str,
    file: str,
    node: str | None,
    gpu_model: str | None,
    label: str | None,
    test: str | None,
    perftest_output: str | None,
    perftest_unit: str | None,
    as_json: bool,
) -> None:
    """Parse FILE (the benchmark's output) as KIND and store its numbers.

    Exits 1 when the tool itself reported errors (the numbers are stored anyway)."""
    from slurmhealth.baseline import store
    from slurmhealth.baseline.parsers import parse

    try:
        with open(file, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError as exc:
        raise UsageError(f"{file}: {exc.strerror or exc}") from None
    cfg = ctx.config()
    node = node or cfg.node_name
    result = parse(kind, text, test=test, output=perftest_output, unit=perftest_unit)
    model = gpu_model or result.gpu_model
    n = store.ingest(cfg, kind, result, node=node, gpu_model=model, label=label, source=file)
    if as_json:
        from slurmhealth.cli import render

        render.print_json({
            "schema": "slurmhealth.baseline-ingest/1", "kind": kind, "node": node,
            "file": file, "gpu_model": model, "stored": n, "passed": result.passed,
            "errors": list(result.errors), "problems": list(result.problems),
            "measurements": [{"metric": m.metric, "gpu": m.gpu, "value": m.value,
                              "unit": m.unit, "printed": m.printed}
                             for m in result.measurements],
        })  # fmt: skip
        sys.exit(0 if result.passed else 1)
    click.echo(f"stored {n} {kind} measurement(s) for {node} from {file}")
    for m in result.measurements:
        gpu = "" if m.gpu is None else f" [gpu{m.gpu}]"
        printed = f" (printed {m.printed})" if m.printed else ""
        click.echo(f"  {m.metric}{gpu} = {m.value:g} {m.unit}{printed}".rstrip())
    for p in result.problems:
        click.echo(f"  parser: {p}")
    if result.passed:
        click.echo("tool reported no errors")
        return
    click.echo("tool reported errors: " + ("; ".join(result.errors) or "yes"))
    sys.exit(1)


@baseline.command("show")
@click.option("--node", help="Only this node.")
@click.option("--kind", help="Only this kind (nccl, gpuburn, fio, ...).")
@json_option
@pass_ctx
def show_cmd(ctx: Ctx, node: str | None, kind: str | None, as_json: bool) -> None:
    """Stored baseline rows of every reachable history, oldest first."""
    from slurmhealth.baseline import store
    from slurmhealth.cli import render

    rows = store.rows(ctx.config(), node=node, kind=kind)
    if as_json:
        render.print_json({"schema": "slurmhealth.baselines/1", "baselines": rows})
        return
    render.table(
        "baselines",
        ["time (UTC)", "node", "kind", "metric", "gpu", "value", "unit", "label"],
        [
            (render.utc(r["ts"]), r["node"], r["kind"], r["metric"], r["gpu"],
             f"{r['value']:g}", r["unit"], r["label"])
            for r in rows
        ],
    )  # fmt: skip


def _refs(cfg: Config, rows: list[dict[str, Any]]) -> dict[RefKey, Ref]:
    from slurmhealth.baseline import compare

    return compare.reference(rows, pinned=cfg.baseline.pinned)


@baseline.command("reference")
@json_option
@pass_ctx
def reference_cmd(ctx: Ctx, as_json: bool) -> None:
    """Reference of each metric: the fleet median of each node's latest value, or pinned."""
    from slurmhealth.baseline import store
    from slurmhealth.cli import render

    cfg = ctx.config()
    refs = list(_refs(cfg, store.rows(cfg)).values())
    if as_json:
        render.print_json({"schema": "slurmhealth.reference/1",
                           "references": [r.to_dict() for r in refs]})  # fmt: skip
        return
    render.table(
        "reference",
        ["kind", "metric", "gpu model", "value", "unit", "source", "samples"],
        [(r.kind, r.metric, r.gpu_model, f"{r.value:g}", r.unit, r.source, r.samples)
         for r in refs],
    )  # fmt: skip


@baseline.command("compare")
@click.argument("node", required=False)
@json_option
@pass_ctx
def compare_cmd(ctx: Ctx, node: str | None, as_json: bool) -> None:
    """NODE's latest values against the reference (default: this node).

    Exits 1 when any metric fails ([baseline] fail_pct worse than its reference)."""
    from slurmhealth.baseline import compare, store
    from slurmhealth.cli import render

    cfg = ctx.config()
    node = node or cfg.node_name
    rows = store.rows(cfg)
    devs = compare.compare(
        rows, node, _refs(cfg, rows), cfg.baseline.warn_pct, cfg.baseline.fail_pct
    )
    failed = any(d.status == "fail" for d in devs)
    if as_json:
        render.print_json({"schema": "slurmhealth.compare/1", "node": node,
                           "status": "fail" if failed else "ok",
                           "deviations": [d.to_dict() for d in devs]})  # fmt: skip
    elif not devs:
        click.echo(f"{node}: no baseline values with a reference")
    else:
        for d in devs:
            click.echo(d.line())
    sys.exit(1 if failed else 0)


@baseline.command("outliers")
@click.option("--fraction", type=float, default=None,
              help="Below this share of the fleet median (default [baseline] "
                   "outlier_fraction, 0.8).")  # fmt: skip
@json_option
@pass_ctx
def outliers_cmd(ctx: Ctx, fraction: float | None, as_json: bool) -> None:
    """Nodes, or GPUs (node:gpu) for per-GPU metrics, far below the fleet median."""
    from slurmhealth.baseline import compare, store
    from slurmhealth.cli import render

    cfg = ctx.config()
    frac = cfg.baseline.outlier_fraction if fraction is None else fraction
    if not 0 < frac <= 1:
        raise UsageError(f"--fraction: {frac:g} is not between 0 and 1")
    found = compare.outliers(store.rows(cfg), frac)
    if as_json:
        render.print_json({"schema": "slurmhealth.outliers/1", "fraction": frac,
                           "outliers": [o.to_dict() for o in found]})  # fmt: skip
        return
    if not found:
        click.echo(f"no outliers (fraction {frac:g})")
        return
    for o in found:
        click.echo(f"{o.where} {o.metric} {o.value:g} {o.unit} fleet median "
                   f"{o.fleet_median:g} ratio {o.ratio:.2f}")  # fmt: skip


@click.command()
@click.option("--node", help="Node name (default: this node); the history written is its.")
@click.option(
    "--benchmarks",
    metavar="LIST",
    help="Comma-separated names from [baseline] validate_commands (default: all).",
)
@json_option
@pass_ctx
def validate(ctx: Ctx, node: str | None, benchmarks: str | None, as_json: bool) -> None:
    """Validate a drained node without a Slurm job: health checks on all GPUs plus short
    benchmarks compared with the fleet. A pass lets `slurmhealth resume` return it.

    Progress (each benchmark's start and time taken) goes to stderr (not with --quiet). A
    benchmark whose program is not installed is SKIPPED with the reason, not failed.
    Exits 0 on a pass, 1 on a fail."""
    from slurmhealth.cli import render
    from slurmhealth.hooks.validate import run_validate

    names = None
    if benchmarks is not None:
        names = [b.strip() for b in benchmarks.split(",") if b.strip()]
    cfg = ctx.config({"node.name": node} if node else None)

    def progress(line: str) -> None:
        if not ctx.quiet:
            click.echo(f"validate: {line}", err=True)

    result = run_validate(cfg, names, progress=progress)
    if as_json:
        render.print_json(result.to_dict())
    else:
        click.echo(f"{result.node}: checks {result.check_status}")
        for b in result.benchmarks:
            if b.skipped:
                click.echo(f"  {b.name}: SKIPPED ({b.skipped})")
                continue
            click.echo(f"  {b.name}: {'ok' if b.passed else 'FAIL'} ({b.stored} values stored, "
                       f"{b.seconds:.1f} s)")  # fmt: skip
            for p in b.problems:
                click.echo(f"    {p}")
        verdict = "PASS" if result.exit_code == 0 else "FAIL"
        click.echo(f"validation {verdict}" + ("" if not result.reasons else
                   ": " + "; ".join(result.reasons)))  # fmt: skip
    sys.exit(result.exit_code)
