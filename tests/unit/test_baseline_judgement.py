"""How `slurmhealth baseline compare` and `outliers` judge a node against the fleet, at the
edges: which sizes are judged, the reference (median, pinned, per GPU model), the deviation
in percent and its sign for lower-is-better metrics, the warn/fail thresholds at equality,
and the line and JSON an operator reads."""

from __future__ import annotations

from typing import Any

import pytest

from slurmhealth.baseline import compare

BUSBW = "all_reduce_perf.busbw_avg"
LAT = "fio.randread.read_lat_p99"


def row(node: str, metric: str, value: float, ts: float = 100.0, **kw: Any) -> dict[str, Any]:
    return {"id": kw.pop("id", 0), "ts": ts, "node": node, "kind": kw.pop("kind", "nccl"),
            "metric": metric, "value": value, "unit": kw.pop("unit", "GB/s"),
            "gpu_model": kw.pop("gpu_model", "H100"), "gpu": kw.pop("gpu", None), **kw}  # fmt: skip


def test_which_sizes_are_judged() -> None:
    assert compare.judged(BUSBW)
    assert compare.judged(f"all_reduce_perf.busbw@{32 << 20}")
    assert not compare.judged(f"all_reduce_perf.busbw@{(32 << 20) - 1}")
    assert not compare.judged("all_reduce_perf.busbw@8192.float.sum")
    assert compare.judged(f"all_reduce_perf.busbw@{1 << 30}.float.sum.root0")
    assert compare.judged("ib_write_bw.bw@abc")  # not a size


def test_the_reference_is_the_median_of_each_nodes_latest_value() -> None:
    rows = [
        row("n1", BUSBW, 400.0, ts=1), row("n1", BUSBW, 480.0, ts=2),
        row("n2", BUSBW, 470.0, ts=5, id=1), row("n2", BUSBW, 100.0, ts=5, id=2),
        row("n3", BUSBW, 460.0), row("n4", BUSBW, 300.0, unit="GB/s!"),
    ]  # fmt: skip
    (ref,) = compare.reference(rows).values()
    # latest: n1 480 (ts 2), n2 100 (same ts, higher id), n3 460, n4 300 -> median 380
    assert ref.to_dict() == {
        "kind": "nccl", "metric": BUSBW, "gpu_model": "H100", "value": 380.0,
        "unit": "GB/s!", "source": "median", "samples": 4, "higher_is_better": True,
    }  # fmt: skip


def test_a_reference_per_gpu_model_and_for_one_model() -> None:
    rows = [row("n1", BUSBW, 400.0), row("n2", BUSBW, 200.0, gpu_model="A100")]
    refs = compare.reference(rows)
    assert refs[("nccl", BUSBW, "H100")].value == 400.0
    assert refs[("nccl", BUSBW, "A100")].value == 200.0
    assert list(compare.reference(rows, gpu_model="A100")) == [("nccl", BUSBW, "A100")]


def test_a_pinned_reference_by_kind_and_metric_before_metric_alone() -> None:
    rows = [row("n1", BUSBW, 400.0), row("n2", BUSBW, 300.0)]
    pinned = {f"nccl.{BUSBW}": "450", BUSBW: 999}
    (ref,) = compare.reference(rows, pinned=pinned).values()
    assert (ref.value, ref.source, ref.samples) == (450.0, "pinned", 0)
    (ref,) = compare.reference(rows, pinned={BUSBW: "420.5"}).values()
    assert (ref.value, ref.source) == (420.5, "pinned")


def _judge(value: float, reference: float = 100.0, metric: str = BUSBW, **kw: Any) -> Any:
    rows = [row("ref", metric, reference, unit=kw.pop("unit", "GB/s")), row("n9", metric, value)]
    refs = compare.reference([rows[0]])
    (dev,) = compare.compare(rows, "n9", refs, **kw)
    return dev


def test_deviation_and_status_at_the_thresholds() -> None:
    assert (_judge(90.0).status, _judge(90.0).worse_pct) == ("warn", 10.0)  # at warn_pct
    assert _judge(90.01).status == "ok"
    assert (_judge(80.0).status, _judge(80.0).deviation_pct) == ("fail", -20.0)  # at fail_pct
    assert _judge(80.01).status == "warn"
    assert _judge(120.0).status == "ok" and _judge(120.0).worse_pct == -20.0  # better
    assert _judge(94.0, warn_pct=5, fail_pct=6).status == "fail"
    assert _judge(96.0, warn_pct=4, fail_pct=6).status == "warn"
    assert _judge(97.0, warn_pct=4, fail_pct=6).status == "ok"
    assert _judge(66.666).deviation_pct == -33.33  # rounded to 2 places


def test_lower_is_better_latency_is_worse_when_higher() -> None:
    worse = _judge(125.0, metric=LAT, unit="us")
    assert (worse.deviation_pct, worse.worse_pct, worse.status) == (25.0, 25.0, "fail")
    assert _judge(75.0, metric=LAT).status == "ok"


def test_a_zero_reference_judges_nothing_as_deviating() -> None:
    dev = _judge(50.0, reference=0.0)
    assert (dev.deviation_pct, dev.status) == (0.0, "ok")


def test_compare_covers_only_the_node_its_judged_metrics_and_referenced_ones() -> None:
    small = "all_reduce_perf.busbw@8192"
    rows = [
        row("n1", BUSBW, 480.0), row("n2", BUSBW, 300.0), row("n2", small, 1.0),
        row("n1", small, 9.0), row("n2", "other.metric", 5.0, gpu_model="B200"),
        row("n2", "gpuburn.gflops", 50.0, kind="gpuburn", gpu=3, unit=""),
        row("n1", "gpuburn.gflops", 60.0, kind="gpuburn", gpu=0, unit=""),
    ]  # fmt: skip
    refs = compare.reference([r for r in rows if r["metric"] != "other.metric"])
    devs = compare.compare(rows, "n2", refs)
    assert [(d.node, d.metric, d.gpu) for d in devs] == [
        ("n2", "gpuburn.gflops", 3),
        ("n2", BUSBW, None),
    ]
    burn, bw = devs
    assert bw.to_dict() == {
        "node": "n2", "kind": "nccl", "metric": BUSBW, "gpu": None, "value": 300.0,
        "unit": "GB/s", "reference": 390.0, "reference_source": "median",
        "deviation_pct": -23.08, "worse_pct": 23.08, "status": "fail",
    }  # fmt: skip
    assert bw.line() == f"{BUSBW} 300.0 GB/s vs reference 390.0 (-23.1%) FAIL"
    assert burn.name == "gpuburn.gflops[gpu3]"
    assert burn.line() == "gpuburn.gflops[gpu3] 50.0 vs reference 55.0 (-9.1%) OK"


def test_outliers_below_the_fraction_of_the_fleet_median() -> None:
    rows = [
        row("n1", BUSBW, 100.0), row("n2", BUSBW, 100.0), row("n3", BUSBW, 80.0),
        row("n4", BUSBW, 79.0), row("n5", BUSBW, 100.0),
    ]  # fmt: skip
    (slow,) = compare.outliers(rows)
    assert slow.to_dict() == {
        "node": "n4", "gpu": None, "kind": "nccl", "metric": BUSBW, "value": 79.0,
        "unit": "GB/s", "fleet_median": 100.0, "ratio": 0.79, "where": "n4",
    }  # fmt: skip
    assert [o.node for o in compare.outliers(rows, fraction=0.85)] == ["n3", "n4"]


def test_latency_outliers_above_the_median_over_the_fraction() -> None:
    rows = [row(f"n{i}", LAT, 100.0) for i in range(4)]
    rows += [row("n8", LAT, 125.0), row("n9", LAT, 126.0)]
    assert [(o.node, o.ratio) for o in compare.outliers(rows)] == [("n9", 1.26)]


def test_outlier_gpus_sorted_and_named_node_colon_gpu() -> None:
    rows = [row("n1", "gpuburn.gflops", 100.0, gpu=g, kind="gpuburn") for g in range(6)]
    rows += [
        row("n2", "gpuburn.gflops", 10.0, gpu=5, kind="gpuburn"),
        row("n2", "gpuburn.gflops", 10.0, gpu=1, kind="gpuburn"),
        row("n0", BUSBW, 1.0), row("n1", BUSBW, 100.0), row("n3", BUSBW, 100.0),
    ]  # fmt: skip
    found = compare.outliers(rows)
    assert [(o.kind, o.where) for o in found] == [
        ("gpuburn", "n2:1"), ("gpuburn", "n2:5"), ("nccl", "n0"),
    ]  # fmt: skip
    assert found[0].ratio == 0.1


@pytest.mark.parametrize("median", [0.0, -5.0])
def test_no_outliers_against_a_median_of_zero_or_less(median: float) -> None:
    rows = [row("n1", BUSBW, median), row("n2", BUSBW, median), row("n3", BUSBW, -100.0)]
    assert compare.outliers(rows) == []


def test_small_sizes_are_never_outliers() -> None:
    small = "all_reduce_perf.busbw@8192"
    rows = [row("n1", small, 100.0), row("n2", small, 100.0), row("n3", small, 1.0)]
    assert compare.outliers(rows) == []


def test_latest_breaks_a_tie_of_times_by_row_id() -> None:
    """Two rows of the same second (one ingest): the later-stored one is the node's value,
    whatever order the rows come in; a row not yet stored (no id) counts as before id 1."""
    rows = [row("n1", BUSBW, 100.0, ts=5, id=2), row("n1", BUSBW, 470.0, ts=5, id=1)]
    assert compare.latest(rows)[("n1", "nccl", BUSBW, None)]["value"] == 100.0
    rows = [row("n1", BUSBW, 100.0, ts=5, id=1), row("n1", BUSBW, 470.0, ts=5, id=None)]
    assert compare.latest(rows)[("n1", "nccl", BUSBW, None)]["value"] == 100.0


def test_references_in_the_order_the_command_lists_them() -> None:
    rows = [
        row("n1", "b.metric", 1.0, ts=1, id=1),
        row("n1", "a.metric", 2.0, ts=2, id=2),
        row("n2", "a.metric", 3.0, ts=3, id=3, gpu_model=None),  # a node of unknown model
    ]
    refs = compare.reference(rows)
    assert list(refs) == [
        ("nccl", "a.metric", "H100"),
        ("nccl", "a.metric", None),
        ("nccl", "b.metric", "H100"),
    ]
    assert compare.reference([row("n1", BUSBW, 1.0, unit=None)])[("nccl", BUSBW, "H100")].unit == ""


def test_deviations_in_metric_order() -> None:
    rows = [
        row("n1", "b.metric", 1.0, id=1), row("n1", "a.metric", 2.0, id=2),
        row("n1", "c.metric", 2.0, id=3), row("n1", "c.metric", 2.0, id=4, gpu=0),
    ]  # fmt: skip
    refs = compare.reference(rows)
    assert [(d.metric, d.gpu) for d in compare.compare(rows, "n1", refs)] == [
        ("a.metric", None), ("b.metric", None), ("c.metric", 0), ("c.metric", None),
    ]  # fmt: skip


def test_outliers_against_their_own_gpu_models_fleet() -> None:
    rows = [row(f"a{i}", BUSBW, 50.0, gpu_model="A100") for i in range(3)]
    rows += [row(f"h{i}", BUSBW, 100.0) for i in range(3)]
    assert compare.outliers(rows) == []
    rows.append(row("h9", BUSBW, 200.0 / 3, unit=None))
    (slow,) = compare.outliers(rows)
    assert (slow.node, slow.ratio, slow.unit, slow.fleet_median) == ("h9", 0.6667, "", 100.0)


def test_a_nodes_own_outlier_before_its_gpus() -> None:
    rows = [row("n1", "gpuburn.gflops", 10.0, gpu=g, kind="gpuburn") for g in (0, 1)]
    rows += [row("n1", "gpuburn.gflops", 10.0, kind="gpuburn")]
    rows += [row(f"n{i}", "gpuburn.gflops", 100.0, gpu=0, kind="gpuburn") for i in range(2, 9)]
    assert [o.where for o in compare.outliers(rows)] == ["n1", "n1:0", "n1:1"]


def test_a_deviation_names_everything_it_was_judged_on() -> None:
    """A reference pinned by kind and metric, a row without a unit: every field, and a line
    with no gap where the unit would be."""
    rows = [
        row("n1", BUSBW, 3.0),
        row("n2", BUSBW, 3.0),
        row("n3", BUSBW, 2.0, unit=None, kind="bench"),
    ]
    devs = compare.compare(rows, "n3", compare.reference(rows, pinned={f"bench.{BUSBW}": 3}))
    assert [d.to_dict() for d in devs] == [
        {"node": "n3", "kind": "bench", "metric": BUSBW, "gpu": None, "value": 2.0, "unit": "",
         "reference": 3.0, "reference_source": "pinned", "deviation_pct": -33.33,
         "worse_pct": 33.33, "status": "fail"}
    ]  # fmt: skip
    assert devs[0].line() == f"{BUSBW} 2.0 vs reference 3.0 (-33.3%) FAIL"


def test_a_reference_takes_the_latest_rows_unit_and_counts_its_samples() -> None:
    rows = [
        row("a1", BUSBW, 240.0, gpu_model="A100", unit=""),
        row("h1", BUSBW, 470.0, unit=""),
        row("h2", BUSBW, 480.0, ts=90.0, unit=""),
        row("h3", BUSBW, 490.0, ts=110.0),  # the latest row gives the unit
        row("x1", BUSBW, 100.0, gpu_model=None, unit=None),  # a node whose model is unknown
    ]
    h100 = compare.reference(rows)[("nccl", BUSBW, "H100")]
    assert (h100.value, h100.unit, h100.samples) == (480.0, "GB/s", 3)
    only = compare.reference([rows[4], *rows[:4]], gpu_model="H100")  # the unknown model first
    assert list(only) == [("nccl", BUSBW, "H100")] and only[("nccl", BUSBW, "H100")].samples == 3


def test_outliers_are_listed_by_metric_then_node_then_gpu() -> None:
    gf = "gpuburn.gflops"
    slow = {("n2", 5): 50.0, ("n2", 2): 60.0, ("n1", 7): 50.0}
    rows = [
        row(n, gf, slow.get((n, g), 100.0), ts=200.0 - g, kind="gpuburn", gpu=g)  # later GPUs first
        for n in ("n1", "n2")
        for g in range(8)
    ]
    rows.append(row("n9", "a.busbw_avg", 10.0, kind="a"))
    rows += [row(n, "a.busbw_avg", 100.0, kind="a") for n in ("n7", "n8")]
    assert [(o.kind, o.where) for o in compare.outliers(rows)] == [
        ("a", "n9"), ("gpuburn", "n1:7"), ("gpuburn", "n2:2"), ("gpuburn", "n2:5")
    ]  # fmt: skip
