"""Per-SKU topology as data (``sku_table.toml``): what each GPU model's design has (NVLinks,
NVLink generation and speed, PCIe generation and width, memory), so a GPU is judged by its
own design. ``gpu_sku`` warns when a GPU shows less than its design: less memory (e.g. Xid
168, reduced memory) or a host link built narrower or slower than the design (``nvidia-smi
-q -d PCI`` "Max"). The expected NVLink count feeds ``nvlink_inactive``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from slurmhealth.checks.engine import CheckContext, check, finding, readable
from slurmhealth.errors import ConfigError, UsageError
from slurmhealth.model import Action, Finding, Severity

KEYS = ("nvlinks", "nvlink_gen", "nvlink_gbps", "pcie_gen", "pcie_width", "memory_mib")
"""What a design holds; ``[gpu.topology."HOSTLIST"]`` may set any of them, and ``sku``."""


@dataclass(frozen=True)
class Sku:
    name: str
    nvlinks: int = 0
    nvlink_gen: int = 0
    nvlink_gbps: int = 0
    pcie_gen: int = 0  # 0: not judged
    pcie_width: int = 0
    memory_mib: int = 0


@functools.cache
def _rows() -> Mapping[str, Mapping[str, Any]]:
    """The packaged table (read on first use; a broken file is a packaging bug and raises)."""
    import tomllib

    from slurmhealth.checks.packaged import packaged_text

    text = packaged_text("sku_table.toml")
    rows: dict[str, Mapping[str, Any]] = tomllib.loads(text)["sku"]
    return rows


@functools.cache
def skus() -> Mapping[str, Sku]:
    """Every SKU of the packaged table by name."""
    return {n: Sku(n, **{k: int(v) for k, v in r.items() if k in KEYS}) for n, r in _rows().items()}


@functools.cache
def _by_model() -> Mapping[str, str]:
    return {model: n for n, row in _rows().items() for model in row["names"]}


def design(model: str | None, override: Mapping[str, Any] | None = None) -> Sku | None:
    """The design of a GPU model (its NVML name), with a node set's override applied: the
    override's ``sku`` picks another table row, its other keys replace single values."""
    override = override or {}
    name = override.get("sku") or _by_model().get(model or "")
    base = skus().get(str(name)) if name else None
    values: dict[str, Any] = {k: int(v) for k, v in override.items() if k in KEYS}
    if base is None:
        return Sku(name=f"{model} (configured)", **values) if values else None
    return replace(base, **values)


@check(
    "gpu_sku",
    "Each GPU shows what its model's design has (checks/sku_table.toml, overridable per node "
    "set in [gpu.topology]): at least the design's memory (within 3%) and a host PCIe link "
    "built for the design's generation and width (the link's maximum, not its idle state).",
    action=Action.WARN,
    hint="a GPU below its design: reduced memory (nvidia-smi -q -d MEMORY; Xid 168) or a slot "
    "narrower/slower than the card (nvidia-smi -q -d PCI, lspci -vv); reseat or move the card",
)
def gpu_sku(ctx: CheckContext, th: Mapping[str, float]) -> list[Finding]:
    out = []
    for g in readable(ctx):
        sku = design(g.name, ctx.topology)
        if sku is None:
            continue
        problems = []
        mib = None if g.memory_total_bytes is None else g.memory_total_bytes >> 20
        if sku.memory_mib and mib is not None and not g.mig_mode and mib < 0.97 * sku.memory_mib:
            problems.append(f"memory {mib} MiB of the design's {sku.memory_mib} MiB")
        if sku.pcie_gen and g.pcie_gen_max is not None and g.pcie_gen_max < sku.pcie_gen:
            problems.append(f"PCIe gen {g.pcie_gen_max} max, design gen {sku.pcie_gen}")
        if sku.pcie_width and g.pcie_width_max is not None and g.pcie_width_max < sku.pcie_width:
            problems.append(f"PCIe x{g.pcie_width_max} max, design x{sku.pcie_width}")
        if problems:
            out.append(
                finding(
                    "gpu_sku",
                    Severity.WARN,
                    g,
                    f"below the {sku.name} design: " + "; ".join(problems),
                    sku=sku.name,
                    memory_mib=mib,
                    pcie_gen_max=g.pcie_gen_max,
                    pcie_width_max=g.pcie_width_max,
                )
            )
    return out


def node_override(
    tables: Mapping[str, Any], node: str, expand: Callable[..., Sequence[str]], source: str
) -> dict[str, Any]:
    """The first ``[gpu.topology."HOSTLIST"]`` table whose hostlist (``expand``: Slurm's
    hostlist syntax) names ``node``; unknown keys or SKUs, values that are not whole
    numbers and bad hostlists are configuration errors naming the key."""
    for pattern, table in tables.items():
        where = f"gpu.topology.{pattern}"
        if not isinstance(table, dict):
            raise ConfigError(source, where, "expected a table of design values")
        for key, value in table.items():
            problem = _bad_value(key, value)
            if problem:
                raise ConfigError(source, f"{where}.{key}", problem)
        try:
            names = expand(pattern)
        except UsageError as exc:
            raise ConfigError(source, where, f"not a hostlist: {exc}") from None
        if node in names:
            return dict(table)
    return {}


def _bad_value(key: str, value: Any) -> str:
    if key == "sku":
        return "" if value in skus() else f"unknown SKU (known: {', '.join(skus())})"
    if key not in KEYS:
        return f"unknown key (known: sku, {', '.join(KEYS)})"
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**31:
        return f"expected a whole number >= 0: {value!r}"
    return ""
