"""Pure comparisons over ``baselines`` rows (dicts as :func:`baseline.store.rows` returns).

A node's value of a metric is its latest row (per GPU for per-GPU metrics such as
``gpuburn.gflops``). The reference of a metric is the median over the fleet of those latest
values (all GPUs of all nodes for per-GPU metrics), per GPU model, unless pinned in config
(``[baseline.pinned]``). Latencies (``*_lat_p50`` / ``*_lat_p99``) are lower-is-better.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from slurmhealth.baseline.store import higher_is_better

RefKey = tuple[str, str, str | None]  # (kind, metric, gpu_model)

# Below this message size an nccl-tests bandwidth is latency, not bandwidth (nccl-tests
# doc/PERFORMANCE.md: time matters at small sizes, bandwidth at large ones; nccl-tests' own
# default size is 32 MiB): such ``...@<bytes>`` values are stored and shown, never judged.
JUDGED_MIN_BYTES = 32 << 20
_SIZE = re.compile(r"@(\d{1,20})(?:\.|$)")


def judged(metric: str) -> bool:
    """False for a per-size metric (``all_reduce_perf.busbw@8192``) below
    :data:`JUDGED_MIN_BYTES`; True for every other metric."""
    m = _SIZE.search(metric)
    return m is None or int(m.group(1)) >= JUDGED_MIN_BYTES


@dataclass(frozen=True)
class Ref:
    kind: str
    metric: str
    gpu_model: str | None
    value: float
    unit: str
    source: str  # "median" | "pinned"
    samples: int  # latest values the median was taken over (0 when pinned)
    higher_is_better: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Deviation:
    node: str
    kind: str
    metric: str
    gpu: int | None
    value: float
    unit: str
    reference: float
    reference_source: str
    deviation_pct: float  # (value - reference) / reference, in percent, signed
    worse_pct: float  # how much worse than the reference (negative: better)
    status: str  # ok | warn | fail

    @property
    def name(self) -> str:
        return f"{self.metric}" + ("" if self.gpu is None else f"[gpu{self.gpu}]")

    def line(self) -> str:
        """``all_reduce_perf.busbw_avg 360.0 GB/s vs reference 480.0 (-25.0%) FAIL``."""
        unit = f" {self.unit}" if self.unit else ""
        return (
            f"{self.name} {self.value:.1f}{unit} vs reference {self.reference:.1f} "
            f"({self.deviation_pct:+.1f}%) {self.status.upper()}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Outlier:
    node: str
    gpu: int | None
    kind: str
    metric: str
    value: float
    unit: str
    fleet_median: float
    ratio: float  # value / fleet median

    @property
    def where(self) -> str:
        return self.node if self.gpu is None else f"{self.node}:{self.gpu}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "where": self.where}


def latest(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str, int | None], Any]:
    """The latest row per (node, kind, metric, gpu)."""
    out: dict[tuple[str, str, str, int | None], Any] = {}
    for r in sorted(rows, key=lambda r: (r["ts"], r.get("id") or 0)):
        out[(r["node"], r["kind"], r["metric"], r.get("gpu"))] = r
    return out


def _pinned_value(pinned: Mapping[str, Any], kind: str, metric: str) -> float | None:
    for key in (f"{kind}.{metric}", metric):
        if key in pinned:
            return float(pinned[key])
    return None


def reference(
    rows: Iterable[Mapping[str, Any]],
    gpu_model: str | None = None,
    pinned: Mapping[str, Any] | None = None,
) -> dict[RefKey, Ref]:
    """Reference per (kind, metric, gpu_model): pinned value, else the fleet median of the
    latest value of each node (each node+GPU for per-GPU metrics). ``gpu_model`` limits
    the rows to that model."""
    pinned = pinned or {}
    groups: dict[RefKey, list[Mapping[str, Any]]] = {}
    for r in latest(rows).values():
        if gpu_model is not None and r.get("gpu_model") != gpu_model:
            continue
        groups.setdefault((r["kind"], r["metric"], r.get("gpu_model")), []).append(r)
    refs: dict[RefKey, Ref] = {}
    for (kind, metric, model), group in sorted(groups.items(), key=lambda kv: str(kv[0])):
        pin = _pinned_value(pinned, kind, metric)
        refs[(kind, metric, model)] = Ref(
            kind=kind,
            metric=metric,
            gpu_model=model,
            value=pin if pin is not None else statistics.median(float(r["value"]) for r in group),
            unit=str(group[-1].get("unit") or ""),
            source="pinned" if pin is not None else "median",
            samples=0 if pin is not None else len(group),
            higher_is_better=higher_is_better(metric),
        )
    return refs


def _status(worse_pct: float, warn_pct: float, fail_pct: float) -> str:
    if worse_pct >= fail_pct:
        return "fail"
    return "warn" if worse_pct >= warn_pct else "ok"


def compare(
    rows: Iterable[Mapping[str, Any]],
    node: str,
    refs: Mapping[RefKey, Ref],
    warn_pct: float = 10.0,
    fail_pct: float = 20.0,
) -> list[Deviation]:
    """``node``'s latest value of each metric against its reference (metrics without a
    reference, and small nccl-tests sizes, see :func:`judged`, are left out). Worse by
    ``warn_pct`` percent: warn; by ``fail_pct``: fail."""
    out: list[Deviation] = []
    for (n, kind, metric, gpu), r in sorted(latest(rows).items(), key=lambda kv: str(kv[0])):
        ref = refs.get((kind, metric, r.get("gpu_model")))
        if n != node or ref is None or not judged(metric):
            continue
        value = float(r["value"])
        dev = (value - ref.value) / ref.value * 100 if ref.value else 0.0
        worse = -dev if ref.higher_is_better else dev
        out.append(
            Deviation(
                node=node,
                kind=kind,
                metric=metric,
                gpu=gpu,
                value=value,
                unit=str(r.get("unit") or ""),
                reference=ref.value,
                reference_source=ref.source,
                deviation_pct=round(dev, 2),
                worse_pct=round(worse, 2),
                status=_status(worse, warn_pct, fail_pct),
            )
        )
    return out


def outliers(rows: Iterable[Mapping[str, Any]], fraction: float = 0.8) -> list[Outlier]:
    """Nodes (node-level metrics) or GPUs (per-GPU metrics, against all GPUs of the fleet)
    whose latest value is below ``fraction`` x the fleet median of the same metric and GPU
    model (above median / ``fraction`` for lower-is-better metrics)."""
    groups: dict[RefKey, list[Mapping[str, Any]]] = {}
    for r in latest(rows).values():
        groups.setdefault((r["kind"], r["metric"], r.get("gpu_model")), []).append(r)
    out: list[Outlier] = []
    for (kind, metric, _model), group in groups.items():
        median = statistics.median(float(r["value"]) for r in group)
        if median <= 0 or not judged(metric):
            continue
        better_high = higher_is_better(metric)
        for r in group:
            value = float(r["value"])
            bad = value < fraction * median if better_high else value > median / fraction
            if bad:
                out.append(
                    Outlier(
                        node=r["node"],
                        gpu=r.get("gpu"),
                        kind=kind,
                        metric=metric,
                        value=value,
                        unit=str(r.get("unit") or ""),
                        fleet_median=median,
                        ratio=round(value / median, 4),
                    )
                )
    return sorted(out, key=lambda o: (o.kind, o.metric, o.node, o.gpu if o.gpu is not None else -1))
