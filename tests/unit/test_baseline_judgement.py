"""How a node's benchmark numbers are judged against the fleet (slurmhealth.baseline.compare),
at the edges: the thresholds' exact values, which row is a node's latest, references per GPU
model with their unit and sample count, the order an operator reads, and outliers' bounds."""

from __future__ import annotations

from typing import Any

import pytest

from slurmhealth.baseline import compare
from slurmhealth.baseline.compare import Deviation, Outlier, Ref

BUSBW = "all_reduce_perf.busbw_avg"
LAT = "fio.randread.read_lat_p99"


def row(node: str, value: float, metric: str = BUSBW, **kw: Any) -> dict[str, Any]:
    base = {"id": 1, "ts": 100.0, "node": node, "kind": "nccl", "metric": metric,
            "value": value, "unit": "GB/s", "gpu_model": "H100", "gpu": None}  # fmt: skip
    return base | kw


def _one(rows: list[dict[str, Any]], node: str, **kw: Any) -> Deviation:
    (dev,) = compare.compare(rows, node, compare.reference(rows), **kw)
    return dev


def test_worse_by_exactly_the_thresholds_warns_and_fails() -> None:
    """Worse by 10% warns and by 20% fails (the documented defaults), not only beyond."""
    fleet = [row("n1", 100.0), row("n2", 100.0)]
    assert _one([*fleet, row("n3", 90.0)], "n3").status == "warn"
    assert _one([*fleet, row("n3", 80.0)], "n3").status == "fail"
    assert _one([*fleet, row("n3", 89.5)], "n3").status == "warn"  # 10.5%: not below 11
    assert _one([*fleet, row("n3", 79.5)], "n3").status == "fail"  # 20.5%: not below 21
    assert _one([*fleet, row("n3", 90.5)], "n3").status == "ok"


def test_a_deviation_names_everything_it_was_judged_on() -> None:
    rows = [row("n1", 3.0), row("n2", 3.0), row("n3", 2.0, unit=None, kind="bench")]
    rows[2]["metric"] = BUSBW
    devs = compare.compare(rows, "n3", compare.reference(rows, pinned={f"bench.{BUSBW}": 3}))
    assert devs == [
        Deviation(node="n3", kind="bench", metric=BUSBW, gpu=None, value=2.0, unit="",
                  reference=3.0, reference_source="pinned", deviation_pct=-33.33,
                  worse_pct=33.33, status="fail")
    ]  # fmt: skip
    assert devs[0].line() == f"{BUSBW} 2.0 vs reference 3.0 (-33.3%) FAIL"  # no unit, no gap


def test_a_reference_of_zero_judges_nothing() -> None:
    rows = [row("n1", 5.0)]
    dev = compare.compare(rows, "n1", compare.reference(rows, pinned={BUSBW: 0}))[0]
    assert (dev.deviation_pct, dev.worse_pct, dev.status) == (0.0, 0.0, "ok")


def test_the_latest_row_of_a_second_is_the_one_stored_last() -> None:
    """Two ingests in the same second: the later row (higher id) is the node's value."""
    rows = [row("n1", 480.0, id=7), row("n1", 300.0, id=6)]
    assert compare.latest(rows)[("n1", "nccl", BUSBW, None)]["value"] == 480.0
    unsaved = [row("n1", 480.0, id=1), row("n1", 300.0, id=None)]  # no id: before any id
    assert compare.latest(unsaved)[("n1", "nccl", BUSBW, None)]["value"] == 480.0


def test_a_reference_per_gpu_model_with_its_unit_and_sample_count() -> None:
    rows = [
        row("a1", 240.0, gpu_model="A100", unit=""),
        row("h1", 470.0, unit=""),
        row("h2", 480.0, unit="", ts=90.0),
        row("h3", 490.0, unit="GB/s", ts=110.0),  # the latest row gives the unit
        row("x1", 100.0, gpu_model=None, unit=None),  # a node whose model is unknown
    ]
    refs = compare.reference(rows)
    assert refs[("nccl", BUSBW, "H100")] == Ref(
        kind="nccl", metric=BUSBW, gpu_model="H100", value=480.0, unit="GB/s",
        source="median", samples=3, higher_is_better=True,
    )  # fmt: skip
    assert refs[("nccl", BUSBW, None)].unit == ""
    assert list(refs) == [("nccl", BUSBW, "A100"), ("nccl", BUSBW, "H100"), ("nccl", BUSBW, None)]
    only = compare.reference([rows[4], *rows[:4]], gpu_model="H100")
    assert list(only) == [("nccl", BUSBW, "H100")] and only[("nccl", BUSBW, "H100")].samples == 3
    pinned = compare.reference(rows, pinned={BUSBW: 500})[("nccl", BUSBW, "H100")]
    assert (pinned.value, pinned.source, pinned.samples) == (500.0, "pinned", 0)


def test_references_and_deviations_are_listed_by_name() -> None:
    rows = [row("n1", 9.0, metric="b.busbw_avg", ts=100.0, kind="b"),
            row("n1", 9.0, metric="a.busbw_avg", ts=200.0, kind="a")]  # fmt: skip
    assert [k[1] for k in compare.reference(rows)] == ["a.busbw_avg", "b.busbw_avg"]
    devs = compare.compare(rows, "n1", compare.reference(rows))
    assert [d.metric for d in devs] == ["a.busbw_avg", "b.busbw_avg"]


def test_outliers_are_judged_within_their_gpu_model() -> None:
    rows = [row(n, 480.0) for n in ("h1", "h2", "h3")]
    rows += [row(n, 240.0, gpu_model="A100") for n in ("a1", "a2")]
    assert compare.outliers(rows) == []  # an A100 is not a slow H100


def test_outlier_bounds_are_strict() -> None:
    """Exactly 0.8 x the median (or median / 0.8 for a latency) is not an outlier."""
    rows = [row("n1", 100.0), row("n2", 100.0), row("n3", 80.0)]
    assert compare.outliers(rows) == []
    lat = [row(n, v, metric=LAT, kind="fio", unit="us") for n, v in
           (("n1", 100.0), ("n2", 100.0), ("n3", 125.0))]  # fmt: skip
    assert compare.outliers(lat) == []
    lat[2]["value"] = 125.5
    [slow] = compare.outliers(lat)
    assert slow == Outlier(node="n3", gpu=None, kind="fio", metric=LAT, value=125.5, unit="us",
                           fleet_median=100.0, ratio=1.255)  # fmt: skip


def test_a_median_of_zero_is_no_reference() -> None:
    lat = [row(n, v, metric=LAT, kind="fio") for n, v in (("n1", 0.0), ("n2", 0.0), ("n3", 5.0))]
    assert compare.outliers(lat) == []


def test_outliers_give_their_ratio_to_four_places_and_no_unit_as_empty() -> None:
    rows = [row("n1", 3.0, unit=None), row("n2", 3.0, unit=None), row("n3", 2.0, unit=None)]
    [out] = compare.outliers(rows)
    assert (out.ratio, out.unit, out.value) == (0.6667, "", 2.0)


def test_outliers_are_listed_by_metric_then_node_then_gpu() -> None:
    gf = "gpuburn.gflops"
    rows = [row(n, 100.0, metric=gf, kind="gpuburn", gpu=g) for n in ("n1", "n2") for g in range(8)]
    slow = {("n2", 5): 50.0, ("n2", 2): 60.0, ("n1", 7): 50.0}
    for r in rows:
        r["value"] = slow.get((r["node"], r["gpu"]), 100.0)
        r["ts"] = 200.0 - r["gpu"]  # the later GPUs stored first
    rows.append(row("n9", 10.0, kind="a", metric="a.busbw_avg"))
    rows += [row(n, 100.0, kind="a", metric="a.busbw_avg") for n in ("n7", "n8")]
    assert [(o.kind, o.where) for o in compare.outliers(rows)] == [
        ("a", "n9"), ("gpuburn", "n1:7"), ("gpuburn", "n2:2"), ("gpuburn", "n2:5")
    ]  # fmt: skip


@pytest.mark.parametrize("unit", ["GB/s", None])
def test_the_line_an_operator_reads(unit: str | None) -> None:
    dev = _one([row("n1", 480.0), row("n2", 360.0, unit=unit)], "n2")
    suffix = " GB/s" if unit else ""
    assert dev.line() == f"{BUSBW} 360.0{suffix} vs reference 420.0 (-14.3%) WARN"
