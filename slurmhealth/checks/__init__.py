"""The check catalog: small pure functions ``(context, thresholds) -> list[Finding]``.

Each check is registered once with :func:`check`, which refuses duplicate names and holds
the check's description, default thresholds, action and remediation hint. The same catalog
serves ``slurmhealth check``, the prolog, the epilog and the sidecar. The engine (context,
registration, one check's run) is :mod:`slurmhealth.checks.engine`, which the check modules
import; this package imports them on first use of the catalog.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from slurmhealth.checks.engine import EVERYWHERE as EVERYWHERE
from slurmhealth.checks.engine import PHASES as PHASES
from slurmhealth.checks.engine import PRE_JOB as PRE_JOB
from slurmhealth.checks.engine import REGISTRY as REGISTRY
from slurmhealth.checks.engine import RUNS as RUNS
from slurmhealth.checks.engine import CheckContext as CheckContext
from slurmhealth.checks.engine import CheckFn as CheckFn
from slurmhealth.checks.engine import CheckSpec as CheckSpec
from slurmhealth.checks.engine import check as check
from slurmhealth.checks.engine import finding as finding
from slurmhealth.checks.engine import readable as readable
from slurmhealth.checks.engine import resolved_thresholds as resolved_thresholds
from slurmhealth.checks.engine import run_check as run_check
from slurmhealth.errors import ConfigError
from slurmhealth.model import Finding


def catalog() -> dict[str, CheckSpec]:
    """Every registered check, importing the check modules on first use."""
    from slurmhealth.checks import (  # noqa: F401
        fabric,
        gpu,
        memory,
        mig,
        network,
        network_kernel,
        nvlink,
        pcie,
        sku,
        thermal,
        xid,
    )

    return REGISTRY


def validate_settings(
    settings: Mapping[str, Mapping[str, Any]],
    disabled: Iterable[str],
    sources: Mapping[str, str],
) -> None:
    """Refuse unknown check names and threshold keys in ``[checks.*]``; errors name the file
    (from ``sources``, the config's provenance map) and the key."""
    specs = catalog()
    for name in disabled:
        if name not in specs:
            source = sources.get("checks.disabled", "config")
            raise ConfigError(source, "checks.disabled", f"unknown check {name!r}")
    for name, table in settings.items():
        source = sources.get(f"checks.{name}", "config")
        if name not in specs:
            raise ConfigError(source, f"checks.{name}", "unknown check (see `slurmhealth checks`)")
        for key, value in table.items():
            known = specs[name].thresholds
            if key not in known:
                allowed = ", ".join(known) or "none"
                raise ConfigError(
                    source, f"checks.{name}.{key}", f"unknown threshold (known: {allowed})"
                )
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(source, f"checks.{name}.{key}", f"expected a number: {value!r}")


def enabled(phase: str, disabled: Iterable[str] = ()) -> list[CheckSpec]:
    """The checks that run in ``phase``, minus ``[checks] disabled``, in catalog order."""
    off = set(disabled)
    return [s for s in catalog().values() if s.name not in off and phase in s.phases]


def run_checks(
    ctx: CheckContext,
    settings: Mapping[str, Mapping[str, float]] | None = None,
    disabled: Iterable[str] = (),
) -> list[Finding]:
    """Run every enabled check for ``ctx.phase``; a crashing check is a warning, not a fail."""
    out: list[Finding] = []
    for spec in enabled(ctx.phase, disabled):
        out.extend(run_check(spec, ctx, settings))
    return sorted(out, key=Finding.sort_key)


def window_of(settings: Mapping[str, Mapping[str, Any]] | None = None) -> float:
    """The longest ``min_window_s`` of the rate checks: how far back the history must reach."""
    windows = [
        resolved_thresholds(spec, settings).get("min_window_s", 0.0) for spec in catalog().values()
    ]
    return float(max(windows, default=0.0))
