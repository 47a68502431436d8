"""GPU memory health: ECC and row remapping (``nvidia-smi -q -d ECC,ROW_REMAPPER``)."""

from __future__ import annotations

from collections.abc import Mapping

from slurmhealth.checks.counters import RATE_THRESHOLDS, rate_warnings
from slurmhealth.checks.engine import EVERYWHERE, CheckContext, check, finding, readable
from slurmhealth.model import Action, Finding, Severity


@check(
    "ecc_uncorrectable",
    "Uncorrectable ECC errors: volatile (since the last driver load) above volatile_max "
    "fails; aggregate (lifetime) above aggregate_max warns.",
    action=Action.RESET,
    hint="uncorrectable memory error: drain, reset the GPU to trigger row remapping, then "
    "check `nvidia-smi -q -d ROW_REMAPPER`; RMA if remapping fails",
    thresholds={"volatile_max": 0, "aggregate_max": 0},
    phases=EVERYWHERE,
)
def ecc_uncorrectable(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _ecc_uncorrectable(ctx, th)


def _ecc_uncorrectable(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    out = []
    for g in readable(ctx):
        vol, agg = g.ecc_volatile_uncorrectable, g.ecc_aggregate_uncorrectable
        if vol is not None and vol > th["volatile_max"]:
            out.append(
                finding(
                    "ecc_uncorrectable",
                    Severity.FAIL,
                    g,
                    f"{vol} volatile uncorrectable ECC error(s)",
                    volatile=vol,
                    aggregate=agg,
                )
            )
        elif agg is not None and agg > th["aggregate_max"]:
            out.append(
                finding(
                    "ecc_uncorrectable",
                    Severity.WARN,
                    g,
                    f"{agg} aggregate (lifetime) uncorrectable ECC error(s)",
                    action=Action.WARN,
                    aggregate=agg,
                )
            )
    return out


@check(
    "row_remap",
    "No row remap pending (needs a GPU reset) and no row remap failure (needs RMA); on GPUs "
    "without row remapping, no retired pages pending.",
    action=Action.RESET,
    hint="reset the GPU (nvidia-smi -r -i N) to apply the pending remap",
    phases=EVERYWHERE,
)
def row_remap(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _row_remap(ctx, th)


def _row_remap(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    out = []
    for g in readable(ctx):
        rows = {
            "correctable": g.remapped_rows_correctable,
            "uncorrectable": g.remapped_rows_uncorrectable,
        }
        if g.remap_failure:
            out.append(
                finding(
                    "row_remap",
                    Severity.FAIL,
                    g,
                    "row remapping failed: the GPU has no spare rows left",
                    action=Action.DRAIN,
                    hint="row remap failure: the GPU needs replacement (RMA); keep it drained",
                    remapped_rows=rows,
                )
            )
        elif g.remap_pending:
            out.append(
                finding("row_remap", Severity.FAIL, g, "row remap pending", remapped_rows=rows)
            )
        elif g.retired_pages_pending:
            out.append(finding("row_remap", Severity.FAIL, g, "retired pages pending"))
    return out


@check(
    "ecc_correctable",
    "Correctable (single-bit) ECC errors since the driver loaded stay below warn_per_min, "
    "judged over at least min_window_s seconds and min_count errors: a trickle is normal "
    "and corrected, a sustained rate means the memory is wearing.",
    action=Action.WARN,
    hint="watch `nvidia-smi -q -d ECC,ROW_REMAPPER`: a GPU whose correctable errors keep "
    "climbing usually needs a row remap (reset) soon; plan an RMA if remaps run out",
    thresholds={
        "warn_per_min": 10,
        "min_window_s": RATE_THRESHOLDS["min_window_s"],
        "min_count": 20,
    },
)
def ecc_correctable(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return _ecc_correctable(ctx, th)


def _ecc_correctable(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    return rate_warnings(ctx, th, "ecc_correctable", "ecc_correctable", "correctable ECC errors")
