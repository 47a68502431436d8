"""nccl-tests output as src/util.cu prints it (and the per-test layouts before 2.13): the test
name and GPU model from the output, every message size kept, #wrong and summaries judged."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.baseline.model import BaselineParseError, BenchmarkFailed, ParseResult
from slurmhealth.baseline.parsers import parse


def _float(value: float, width: int) -> str:
    """util.cu getFloatStr: %.2f, else %.1f, else %.0f, else exponent, to fit ``width``."""
    for fmt in (f"{value:{width}.2f}", f"{value:{width}.1f}", f"{value:{width}.0f}"):
        if len(fmt) <= width:
            return fmt
    return f"{value:{width}.1e}"


def _g(value: float) -> str:
    return f"{value:g}"


def row(size: int, count: int, dtype: str, redop: str, root: int, halves: list[tuple]) -> str:
    """writeBenchmarkLinePreamble + writeBenchmarkLineBody x2 (``wrong`` None: -c 0)."""
    out = f"{size:12d}  {count:12d}  {dtype:>8}  {redop:>6}  {root:6d}"
    for t, a, b, w in halves:
        out += f"  {_float(t, 7):>7}  {_float(a, 6):>6}  {_float(b, 6):>6}"
        out += f"  {_g(w):>6}" if w is not None else "    N/A"
    return out


def header(test: str, ranks: int, model: str, hosts: int = 1) -> str:
    lines = [
        "# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807",
        f"# Collective test starting: {test}",
        f"# nThread 1 nGpus {ranks // hosts} minBytes 1024 maxBytes 1073741824 step: 4(factor)"
        " warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0 unalign: 0",
        "#",
        "# Using devices",
    ]
    per = ranks // hosts
    lines += [
        f"#  Rank {r:2d} Group  0 Pid {4000 + r:6d} on {f'dgx-{r // per:02d}':>10} device"
        f" {r % per:2d} [0000:{0x18 + r % per:02x}:00] {model}"
        for r in range(ranks)
    ]
    lines += [
        "#",
        "#                                                              out-of-place"
        "                       in-place          ",
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong"
        "     time   algbw   busbw  #wrong ",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)        "
        "      (us)  (GB/s)  (GB/s)         ",
    ]
    return "\n".join(lines) + "\n"


def footer(test: str, avg: float, oob: int = 0, check: str = "") -> str:
    return (
        f"# Out of bounds values : {oob} {'FAILED' if oob else 'OK'}\n"
        f"# Avg bus bandwidth    : {_g(avg)} {check}\n#\n# Collective test concluded: {test}\n#\n"
    )


SIZES = [1024 * 4**k for k in range(11)]  # 1 KiB .. 1 GiB


def all_gather(ranks: int = 8, model: str = "NVIDIA A100-SXM4-80GB", wrong: int = 0) -> str:
    rows = []
    for s in SIZES:
        t = 10 + s / 2e5
        algbw = s / t / 1e3
        busbw = algbw * (ranks - 1) / ranks
        halves = [(t, algbw, busbw, 0), (t * 1.01, algbw / 1.01, busbw / 1.01, wrong)]
        rows.append(row(s, s // 4 // ranks, "float", "none", -1, halves))
    return (
        header("all_gather_perf", ranks, model)
        + "\n".join(rows)
        + "\n"
        + footer("all_gather_perf", 61.2345)
    )


def _metric(r: ParseResult, metric: str) -> float:
    (value,) = [m.value for m in r.measurements if m.metric == metric]
    return value


def test_name_model_and_every_size_from_the_output() -> None:
    r = parse("nccl", all_gather())
    assert r.passed and r.errors == () and r.problems == ()
    assert r.meta["test"] == "all_gather_perf" and r.gpu_model == "NVIDIA A100-SXM4-80GB"
    assert r.meta["ranks"] == 8 and r.meta["nodes"] == ["dgx-00"] and r.meta["checked"]
    assert _metric(r, "all_gather_perf.busbw_avg") == 61.2345
    assert r.kind == "nccl" and {m.unit for m in r.measurements} == {"GB/s"}
    kept = {m.metric.split("@")[0] + "@" for m in r.measurements if "@" in m.metric}
    assert kept == {f"all_gather_perf.{f}@" for f in ("busbw", "algbw", "busbw_inplace",
                                                      "algbw_inplace")}  # fmt: skip
    sizes = {int(m.metric.split("@")[1]) for m in r.measurements if "@" in m.metric}
    assert sizes == set(SIZES)
    big = 1024 * 4**10
    t = 10 + big / 2e5
    assert _metric(r, f"all_gather_perf.algbw@{big}") == float(_float(big / t / 1e3, 6))
    assert _metric(r, f"all_gather_perf.busbw@{big}") == float(_float(big / t / 1e3 * 7 / 8, 6))


def test_hint_never_overrides_the_name_in_the_output() -> None:
    r = parse("nccl", all_gather(), test="all_reduce_perf")
    assert r.meta["test"] == "all_gather_perf"


def test_wrong_elements_in_g_format_fail_the_run() -> None:
    r = parse("nccl", all_gather(wrong=1048576))  # %6g prints 1.04858e+06
    assert not r.passed and len(r.errors) == len(SIZES)
    assert r.errors[0] == "size 1024 (float): in-place #wrong 1.04858e+06"


def test_no_check_prints_na() -> None:
    text = header("alltoall_perf", 8, "NVIDIA H100 80GB HBM3")
    text += row(1048576, 32768, "float", "none", -1, [(40.1, 26.15, 22.88, None)] * 2) + "\n"
    r = parse("nccl", text + footer("alltoall_perf", 22.88))
    assert r.passed and r.meta["checked"] is False
    assert _metric(r, "alltoall_perf.busbw_inplace@1048576") == 22.88


def test_pre_2_13_layouts_without_redop_or_root() -> None:
    # all_gather printed "size count type"; broadcast "size count type root"; the wrong
    # column was a max delta in %5.0le
    gather = (
        "# nThread 1 nGpus 4 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20"
        " validation: 1\n"
        "        1024            64   float    13.10    0.08    0.06  0e+00    12.90    0.08"
        "    0.06  0e+00\n"
        "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0.06 \n"
    )
    r = parse("nccl", "$ ./all_gather_perf -g 4\n" + gather)
    assert r.passed and _metric(r, "all_gather_perf.busbw@1024") == 0.06
    assert _metric(r, "all_gather_perf.busbw_avg") == 0.06  # an average below 1 GB/s counts
    bcast = gather.replace("   float    13.10", "   float     0    13.10").replace(
        "0e+00\n", "2e-07\n"
    )
    r = parse("nccl", "mpirun -np 4 ./build/broadcast_perf -g 1\n" + bcast)
    assert r.passed, r.errors  # a max delta of 2e-07 is rounding, not a wrong element
    assert r.meta["test"] == "broadcast_perf"


def test_launcher_prefixes_and_the_oldest_header() -> None:
    tagged = "".join(f"[1,0]<stdout>:{line}\n" for line in all_gather().splitlines())
    r = parse("nccl", tagged)
    assert r.meta["test"] == "all_gather_perf" and len(r.meta["sizes"]) == len(SIZES)
    labelled = "".join(f"0: {line}\n" for line in all_gather().splitlines())
    assert parse("nccl", labelled).measurements == r.measurements
    oldest = (  # 2017-2018: no '#' before nThread, rank lines without Group or Pid
        "nThread 1 nGpus 8 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5 iters: 20\n"
        "#   Rank  0 on   node-7 device  0 [0x06] Tesla P100-SXM2-16GB\n"
        "        1024           256   float     sum    14.10    0.07    0.13  0e+00    13.90"
        "    0.07    0.13  0e+00\n Out of bounds values : 0 OK\n Avg bus bandwidth    : 0.13 \n"
    )
    r = parse("nccl", oldest, test="all_reduce_perf")
    assert r.gpu_model == "Tesla P100-SXM2-16GB" and r.meta["nthread"] == 1 and r.passed
    assert _metric(r, "all_reduce_perf.busbw@1024") == 0.13


def test_per_iteration_and_timestamp_columns() -> None:
    base = row(8388608, 2097152, "float", "sum", -1, [(95.0, 88.3, 154.5, 0)] * 2)
    out, inp = base.split("      0", 1)
    line = out + "      0    93.1    97.4    97.9     1.2" + inp + "    93.0    97.5    98.0"
    line += "     1.1  2026-11-30 09:30:00"
    text = (
        header("all_reduce_perf", 8, "NVIDIA H100 80GB HBM3").replace(
            "out-of-place  ", "out-of-place (+ per-iteration)"
        )
        + "#       size  count  type redop root time algbw busbw #wrong i_min i_max i_p99 i_cv%\n"
    )
    r = parse("nccl", text + line + "\n" + footer("all_reduce_perf", 154.5))
    assert r.problems == () and _metric(r, "all_reduce_perf.busbw_inplace@8388608") == 154.5


def test_several_tests_and_data_types_in_one_file() -> None:
    reduce_rows = [
        row(4096, 1024, dtype, "sum", -1, [(20.0, 0.2, 0.36, 0)] * 2) for dtype in ("float", "half")
    ]
    text = header("all_reduce_perf", 8, "NVIDIA H100 80GB HBM3") + "\n".join(reduce_rows)
    text += "\n" + footer("all_reduce_perf", 0.36) + all_gather(model="NVIDIA H100 80GB HBM3")
    r = parse("nccl", text)
    assert r.meta["tests"] == ["all_reduce_perf", "all_gather_perf"]
    assert _metric(r, "all_reduce_perf.busbw@4096.half.sum") == 0.36
    assert _metric(r, "all_gather_perf.busbw_avg") == 61.2345
    assert r.gpu_model == "NVIDIA H100 80GB HBM3"


def test_name_inferred_from_the_bus_factor_when_missing() -> None:
    rows = [row(s, s // 4, "float", "sum", -1, [(100.0, 80.0, 140.0, 0)] * 2) for s in SIZES]
    text = header("x", 8, "NVIDIA H100 80GB HBM3").replace("# Collective test starting: x\n", "")
    r = parse("nccl", text + "\n".join(rows) + "\n" + footer("", 140.0).rsplit("# Coll", 1)[0])
    assert r.meta["test"] == "all_reduce_perf"  # busbw/algbw = 2(n-1)/n for n = 8
    assert "all_reduce_perf inferred" in " ".join(r.problems)


def test_avg_below_nccl_tests_min_bw_is_an_error() -> None:
    r = parse("nccl", all_gather().replace("61.2345 ", "61.2345 FAILED"))
    assert r.errors == ("avg bus bandwidth 61.2345 GB/s below NCCL_TESTS_MIN_BW",)


def test_nccls_last_error_string_is_a_reason_not_a_verdict() -> None:
    stale = "# error: NET/IB : Got async event : port error\n"
    r = parse("nccl", all_gather() + stale)
    assert r.passed and "nccl reported: NET/IB : Got async event : port error" in r.problems
    died = header("all_reduce_perf", 8, "NVIDIA H100 80GB HBM3") + "#\n" + stale
    with pytest.raises(BenchmarkFailed, match="nccl reported: NET/IB"):
        parse("nccl", died)


def test_a_run_that_died_before_its_table_is_a_failed_run() -> None:
    text = header("all_reduce_perf", 8, "NVIDIA H100 80GB HBM3")
    text += "dgx-00: Test NCCL failure common.cu:1040 'unhandled system error'\n"
    with pytest.raises(BenchmarkFailed, match="NCCL failure") as info:
        parse("nccl", text)
    assert info.value.exit_code == 1


_NOISE = st.text(
    alphabet=st.sampled_from(list("0123456789 .-e+#:/NA\nabfloatsumnonewrg_perfRankPidon[]")),
    max_size=400,
)


@settings(max_examples=200, deadline=None)
@given(text=_NOISE, test=st.none() | st.just("all_reduce_perf"))
def test_arbitrary_nccl_like_text_raises_only_parse_errors(text: str, test: str | None) -> None:
    try:
        r = parse("nccl", "# nThread 1 nGpus 1\n" + text, test=test)
    except BaselineParseError as exc:
        assert "\n" not in str(exc)
        return
    assert r.measurements and all(m.value > 0 for m in r.measurements)


_TOKEN = st.sampled_from(
    ["8", "1024", "-1", "0", "float", "sum", "none", "N/A", "12.5", "0.00", "1e+06", "2e-07",
     "2026-11-30", "09:30:00", "#", "x"]
)  # fmt: skip
_LINE = st.one_of(
    st.lists(_TOKEN, min_size=3, max_size=20).map(lambda t: "  ".join(["1024", "256", *t])),
    st.sampled_from(
        ["# Collective test starting: all_reduce_perf", "# nThread 1 nGpus 8 iters: 20",
         "#  Rank  0 Group  0 Pid 1 on h device  0 [0000:18:00] NVIDIA H100 80GB HBM3",
         "# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 12.5 FAILED",
         "# Avg bus bandwidth    : inf", "#  size count type redop root i_min",
         "./build/alltoall_perf -g 8", "Test NCCL failure common.cu:1 'x'", ""]
    ),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(_LINE, max_size=12))
def test_shuffled_nccl_pieces_raise_only_parse_errors(lines: list[str]) -> None:
    try:
        r = parse("nccl", "\n".join(lines))
    except BaselineParseError as exc:
        assert "\n" not in str(exc)
        return
    assert r.measurements and all(0 < m.value < float("inf") for m in r.measurements)


def _nameless(
    ranks: int, redop: str, root: int, ratio: float, *, rows: list[str] | None = None
) -> str:
    """A run whose output names no test: header without 'Collective test', the table (every
    size at busbw = ratio x algbw unless ``rows``), the footer without 'concluded'."""
    if rows is None:
        rows = [row(s, s // 4, "float", redop, root, [(100.0, 80.0, 80.0 * ratio, 0)] * 2)
                for s in SIZES]  # fmt: skip
    text = header("x", ranks, "NVIDIA H100 80GB HBM3")
    text = text.replace("# Collective test starting: x\n", "")
    return text + "\n".join(rows) + "\n" + footer("", 140.0).rsplit("# Coll", 1)[0]


@pytest.mark.parametrize(
    ("ranks", "redop", "root", "ratio", "name"),
    [
        (8, "sum", -1, 2 * 7 / 8, "all_reduce_perf"),
        (3, "sum", -1, 2 * 2 / 3 + 0.025, "all_reduce_perf"),  # within 0.03 of 2(n-1)/n
        (8, "sum", -1, 7 / 8, "reduce_scatter_perf"),
        (8, "max", -1, 7 / 8 - 0.025, "reduce_scatter_perf"),
        (8, "sum", 0, 1.0, "reduce_perf"),
        (8, "prod", 3, 0.4, "reduce_perf"),  # any factor: reduce's busbw is its algbw
        (8, "none", 0, 1.0, "broadcast_perf"),
        (8, "none", 2, 1.025, "broadcast_perf"),
    ],
)
def test_each_collective_inferred_from_its_bus_factor_and_columns(
    ranks: int, redop: str, root: int, ratio: float, name: str
) -> None:
    r = parse("nccl", _nameless(ranks, redop, root, ratio))
    assert r.meta["test"] == name
    assert f"test name not in the output; {name} inferred from the table" in r.problems
    assert _metric(r, f"{name}.busbw_avg") == 140.0


@pytest.mark.parametrize(
    ("ranks", "redop", "root", "ratio"),
    [
        (8, "sum", -1, 2 * 7 / 8 + 0.035),  # off the all_reduce factor
        (8, "sum", -1, 7 / 8 - 0.035),  # off the reduce_scatter factor
        (8, "none", 0, 1.035),  # off broadcast's 1
        (8, "none", -1, 7 / 8),  # all_gather's factor: several tests have it
        (2, "sum", -1, 1.0),  # 2 ranks: all_reduce's 2(n-1)/n is reduce_scatter's x2 = 1
    ],
)
def test_no_name_is_guessed_when_the_table_does_not_tell(
    ranks: int, redop: str, root: int, ratio: float
) -> None:
    r = parse("nccl", _nameless(ranks, redop, root, ratio))
    assert r.meta["test"] == "nccl"
    assert "test name not in the output (no 'Collective test' or '*_perf' line)" in r.problems
    assert not any("inferred" in p for p in r.problems)


def test_the_name_is_inferred_from_the_largest_measured_size() -> None:
    """Small sizes are latency-bound (their factor means nothing) and a size whose algbw
    printed as 0 has no factor: the largest size with a bandwidth decides."""
    rows = [row(s, s // 4, "float", "sum", -1, [(100.0, 80.0, 8.0, 0)] * 2) for s in SIZES[:-2]]
    rows.append(row(SIZES[-2], SIZES[-2] // 4, "float", "sum", -1, [(100.0, 80.0, 140.0, 0)] * 2))
    rows.append(row(SIZES[-1], SIZES[-1] // 4, "float", "sum", -1, [(100.0, 0.0, 0.0, 0)] * 2))
    r = parse("nccl", _nameless(8, "sum", -1, 0, rows=rows))
    assert r.meta["test"] == "all_reduce_perf"


def test_a_hint_names_a_nameless_run_without_a_problem() -> None:
    r = parse("nccl", _nameless(8, "sum", -1, 7 / 8), test="my_perf")
    assert r.meta["test"] == "my_perf" and not any("test name" in p for p in r.problems)


def test_what_the_run_says_of_itself() -> None:
    r = parse("nccl", all_gather(ranks=16).replace("nGpus 16", "nGpus 8", 1))
    meta = r.meta
    assert (meta["nthread"], meta["ngpus_per_thread"], meta["iters"], meta["validation"]) == (
        1, 8, 20, 1,
    )  # fmt: skip
    assert (meta["ranks"], meta["gpus"], meta["nodes"]) == (16, 16, ["dgx-00"])
    assert meta["sizes"] == SIZES and meta["max_bytes"] == SIZES[-1]
    assert meta["tests"] == ["all_gather_perf"]
    two_hosts = header("all_reduce_perf", 16, "NVIDIA H100 80GB HBM3", hosts=2)
    two_hosts += row(1 << 30, 1 << 28, "float", "sum", -1, [(9e3, 119.3, 223.7, 0)] * 2)
    r = parse("nccl", two_hosts + "\n" + footer("all_reduce_perf", 223.7))
    assert r.meta["nodes"] == ["dgx-00", "dgx-01"] and r.meta["ranks"] == 16


def _one_size(halves: list[tuple], tail: str = "", *, dtype: str = "float") -> ParseResult:
    text = header("all_reduce_perf", 8, "NVIDIA H100 80GB HBM3")
    text += row(1 << 30, 1 << 28, dtype, "sum", -1, halves) + "\n"
    return parse("nccl", text + (tail or footer("all_reduce_perf", 223.7)))


def test_wrong_elements_out_of_place_and_in_place_each_named() -> None:
    r = _one_size([(9e3, 119.3, 223.7, 3), (9e3, 119.3, 223.7, 0)])
    assert r.errors == (f"size {1 << 30} (float): out-of-place #wrong 3",)
    r = _one_size([(9e3, 119.3, 223.7, 0), (9e3, 119.3, 223.7, 1)])
    assert r.errors == (f"size {1 << 30} (float): in-place #wrong 1",)
    assert _one_size([(9e3, 119.3, 223.7, 0)] * 2).passed


def test_out_of_bounds_values_and_a_missing_summary() -> None:
    oob = footer("all_reduce_perf", 223.7, oob=3)
    r = _one_size([(9e3, 119.3, 223.7, 0)] * 2, oob)
    assert r.errors == ("out of bounds values: 3 FAILED",)
    r = _one_size([(9e3, 119.3, 223.7, 0)] * 2, oob.replace("3 FAILED", "0 FAILED"))
    assert r.errors == ("out of bounds values: 0 FAILED",)
    r = _one_size([(9e3, 119.3, 223.7, 0)] * 2, "# Avg bus bandwidth    : 223.7 \n")
    assert r.passed and r.problems == (
        "no '# Out of bounds values' line (output may be truncated)",
    )
    r = _one_size([(9e3, 119.3, 223.7, 0)] * 2, "# Out of bounds values : 0 OK\n")
    assert r.problems == (
        "no '# Avg bus bandwidth' line (cut short after 1 rows?); busbw_avg not recorded",
    )
    assert not any(m.metric.endswith("busbw_avg") for m in r.measurements)
    failed = footer("all_reduce_perf", 223.7, check="failed")
    assert _one_size([(9e3, 119.3, 223.7, 0)] * 2, failed).errors == (
        "avg bus bandwidth 223.7 GB/s below NCCL_TESTS_MIN_BW",
    )


@pytest.mark.parametrize("avg", ["0", "nan", "inf"])
def test_an_average_of_zero_or_not_a_number_is_not_a_measurement(avg: str) -> None:
    tail = f"# Out of bounds values : 0 OK\n# Avg bus bandwidth    : {avg} \n"
    r = _one_size([(9e3, 119.3, 223.7, 0)] * 2, tail)
    assert not any(m.metric.endswith("busbw_avg") for m in r.measurements)
    assert _metric(r, f"all_reduce_perf.busbw@{1 << 30}") == 223.7
    assert r.problems == ()  # the line is there: not 'cut short'


def test_each_size_with_its_time_count_and_type_and_no_zero_bandwidth() -> None:
    r = _one_size([(9e3, 119.3, 223.7, 0), (10.5, 0.0, 0.0, 0)], dtype="bfloat16")
    by_name = {m.metric: m for m in r.measurements}
    size = 1 << 30
    assert set(by_name) == {
        "all_reduce_perf.busbw_avg",
        f"all_reduce_perf.busbw@{size}",
        f"all_reduce_perf.algbw@{size}",
    }  # the in-place half printed 0.00: below the precision, not a measurement
    m = by_name[f"all_reduce_perf.algbw@{size}"]
    assert (m.value, m.unit) == (119.3, "GB/s")
    assert m.detail == {"time_us": 9000.0, "count": 1 << 28, "type": "bfloat16"}


def test_types_ops_and_roots_in_the_metric_name_when_the_run_covered_several() -> None:
    text = header("reduce_perf", 8, "NVIDIA H100 80GB HBM3")
    for dtype, redop, root in (("float", "sum", 0), ("half", "max", 0), ("float", "sum", 1)):
        text += row(1 << 20, 1 << 18, dtype, redop, root, [(50.0, 20.9, 20.9, 0)] * 2) + "\n"
    r = parse("nccl", text + footer("reduce_perf", 20.9))
    names = {m.metric for m in r.measurements if m.metric.startswith("reduce_perf.busbw@")}
    assert names == {
        f"reduce_perf.busbw@{1 << 20}.float.sum.root0",
        f"reduce_perf.busbw@{1 << 20}.half.max.root0",
        f"reduce_perf.busbw@{1 << 20}.float.sum.root1",
    }
    text = header("all_gather_perf", 8, "NVIDIA H100 80GB HBM3")
    for dtype in ("float", "half"):
        text += row(1 << 20, 1 << 15, dtype, "none", -1, [(50.0, 20.9, 18.3, 0)] * 2) + "\n"
    r = parse("nccl", text + footer("all_gather_perf", 18.3))
    names = {m.metric for m in r.measurements if m.metric.startswith("all_gather_perf.busbw@")}
    assert names == {f"all_gather_perf.busbw@{1 << 20}.{t}.none" for t in ("float", "half")}


def test_an_unreadable_row_is_named_by_its_line_number() -> None:
    text = header("all_reduce_perf", 8, "NVIDIA H100 80GB HBM3")
    first = text.count("\n") + 1
    good = row(1 << 20, 1 << 18, "float", "sum", -1, [(50.0, 20.9, 36.6, 0)] * 2)
    garbage = "x" * 150
    text += good + "\n" + garbage + "\n" + "  # an indented remark\n"
    r = parse("nccl", text + footer("all_reduce_perf", 36.6))
    assert r.problems == (f"line {first + 1}: unreadable table row {'x' * 80!r}",)
    assert r.measurements  # the rows before it still count


def test_a_failure_line_and_nccls_error_are_cut_at_200_characters() -> None:
    text = header("all_reduce_perf", 8, "NVIDIA H100 80GB HBM3")
    line = "dgx-00: Test NCCL failure common.cu:1040 " + "y" * 300
    lineno = text.count("\n") + 1
    with pytest.raises(BenchmarkFailed) as info:
        parse("nccl", text + line + "\n")
    assert f"line {lineno}: {line[:200]}" in str(info.value)
    assert f"line {lineno}: {line[:201]}" not in str(info.value)
    stale = "# error: " + "z" * 300 + "\n"
    r = parse("nccl", all_gather() + stale)
    assert f"nccl reported: {'z' * 200}" in r.problems


@pytest.mark.parametrize(
    "text",
    [
        "# nThread 1 nGpus 8 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5\n",
        "#  Rank  0 Group  0 Pid   4000 on     dgx-00 device  0 [0000:18:00] NVIDIA H100\n",
        "# Collective test starting: all_reduce_perf\n",
    ],
)
def test_nccl_output_without_results_is_a_failed_run(text: str) -> None:
    """Any one of the header, a rank line or the test's start says nccl-tests ran (and
    died): a failed benchmark, not an unreadable file."""
    with pytest.raises(BenchmarkFailed, match="no nccl-tests result rows"):
        parse("nccl", text)


def test_text_that_is_not_nccl_output_is_a_parse_error() -> None:
    with pytest.raises(BaselineParseError) as info:
        parse("nccl", "hello\nworld\n")
    assert str(info.value) == (
        "nccl: no nccl-tests result rows and no '# Avg bus bandwidth' line found"
    )


def test_the_device_model_in_the_meta() -> None:
    assert parse("nccl", all_gather()).meta["device_model"] == "NVIDIA A100-SXM4-80GB"
    no_model = all_gather().replace(" NVIDIA A100-SXM4-80GB\n", "\n")  # trailing blank cut
    r = parse("nccl", no_model)
    assert r.meta["device_model"] is None and r.gpu_model is None
    assert r.meta["ranks"] == 8 and r.meta["nodes"] == ["dgx-00"]  # the ranks still count


@pytest.mark.parametrize(("ratio", "redop"), [(2 * 7 / 8, "sum"), (7 / 8, "sum"), (1.0, "none")])
def test_a_root_of_0_is_a_rooted_collective(ratio: float, redop: str) -> None:
    """Root 0 is a real root (reduce, broadcast), whatever the factor; -1 is none."""
    name = "reduce_perf" if redop == "sum" else "broadcast_perf"
    assert parse("nccl", _nameless(8, redop, 0, ratio)).meta["test"] == name


def test_a_layout_without_redop_names_no_test() -> None:
    """Before 2.13 broadcast printed a root but no redop column: nothing to infer from."""
    text = (
        "# nThread 1 nGpus 4 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5\n"
        + "".join(
            f"#  Rank {r} Group 0 Pid {4000 + r} on dgx-00 device {r} [0000:18:00] H100\n"
            for r in range(4)
        )
        + "        1024            64   float     0    13.10    0.08    0.08  0e+00    12.90"
        "    0.08    0.08  0e+00\n# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0.08 \n"
    )
    assert parse("nccl", text).meta["test"] == "nccl"


def test_a_size_below_1_gbs_still_names_the_test() -> None:
    rows = [row(s, s // 4, "float", "sum", -1, [(100.0, 80.0, 8.0, 0)] * 2) for s in SIZES[:-1]]
    rows.append(row(SIZES[-1], SIZES[-1] // 4, "float", "sum", -1, [(9e5, 0.5, 0.88, 0)] * 2))
    assert parse("nccl", _nameless(8, "sum", -1, 0, rows=rows)).meta["test"] == "all_reduce_perf"


def _before_2_17(test: str, ranks: int = 8, model: str = "NVIDIA H100 80GB HBM3") -> str:
    """The header as nccl-tests printed it before 2.17: no version or 'Collective test' line
    (the name is only on the command line a job script echoes)."""
    lines = header(test, ranks, model).splitlines(keepends=True)[2:]
    return "".join(lines).replace(" unalign: 0", "")


def _rows(sizes: list[int], redop: str, root: int, algbw: float, busbw: float) -> str:
    return "".join(
        row(s, s // 4, "float", redop, root, [(100.0, algbw, busbw, 0)] * 2) + "\n" for s in sizes
    )


def test_runs_of_a_job_script_split_at_each_command_line() -> None:
    """A script echoing each command (``set -x``), the first run killed by ``timeout`` mid-table:
    each run is read under the name on its own command line."""
    cut = "+ timeout 600 srun ./build/all_reduce_perf -b 1K -e 1G -f 4 -g 8\n"
    cut += _before_2_17("all_reduce_perf") + _rows(SIZES[:3], "sum", -1, 80.0, 140.0)
    gather = "+ srun /opt/nccl-tests/build/all_gather_perf -b 1K -e 1G -f 4 -g 8\n"
    gather += _before_2_17("all_gather_perf") + _rows(SIZES[:2], "none", -1, 80.0, 70.0)
    gather += footer("", 70.0).rsplit("# Coll", 1)[0]
    a2a = "+ srun /opt/nccl-tests/build/alltoall_perf -b 1K -e 1G -f 4 -g 8\n"
    a2a += _before_2_17("alltoall_perf") + _rows(SIZES[:2], "none", -1, 60.0, 52.5)
    a2a += footer("", 52.5).rsplit("# Coll", 1)[0]
    r = parse("nccl", cut + gather + a2a)
    assert r.meta["tests"] == ["all_reduce_perf", "all_gather_perf", "alltoall_perf"]
    assert r.passed and r.problems == (
        "no '# Out of bounds values' line (output may be truncated)",
        "no '# Avg bus bandwidth' line (cut short after 3 rows?); busbw_avg not recorded",
    )
    assert _metric(r, f"all_reduce_perf.busbw@{SIZES[2]}") == 140.0
    assert _metric(r, "all_gather_perf.busbw_avg") == 70.0
    assert _metric(r, f"alltoall_perf.busbw@{SIZES[1]}") == 52.5
    assert not any(m.metric.startswith("nccl.") for m in r.measurements)


def test_a_run_that_died_keeps_its_failure_and_not_the_next_runs_rows() -> None:
    died = "+ srun ./build/all_reduce_perf -g 8\n" + _before_2_17("all_reduce_perf")
    died += "dgx-00: Test NCCL failure common.cu:1040 'unhandled system error'\n"
    gather = "+ srun ./build/all_gather_perf -g 8\n" + _before_2_17("all_gather_perf")
    gather += _rows(SIZES[:2], "none", -1, 80.0, 70.0) + footer("", 70.0).rsplit("# Coll", 1)[0]
    r = parse("nccl", died + gather)
    assert r.meta["tests"] == ["all_reduce_perf", "all_gather_perf"]  # each by its command
    assert _metric(r, "all_gather_perf.busbw_avg") == 70.0
    assert "test name not in the output" not in " ".join(r.problems)
    assert r.errors == (
        f"line {died.count(chr(10))}: dgx-00: Test NCCL failure common.cu:1040"
        " 'unhandled system error'",
    )
    assert not any(m.metric.startswith("all_reduce_perf.") for m in r.measurements)


def test_a_test_cut_short_after_another_is_named_by_its_start_line() -> None:
    """2.17+: the second test was killed mid-table, so no 'Collective test concluded' line."""
    text = all_gather(model="NVIDIA H100 80GB HBM3")
    text += header("all_reduce_perf", 8, "NVIDIA H100 80GB HBM3")
    text += _rows(SIZES[:4], "sum", -1, 80.0, 140.0)
    r = parse("nccl", text)
    assert r.meta["tests"] == ["all_gather_perf", "all_reduce_perf"]
    assert _metric(r, f"all_reduce_perf.busbw_inplace@{SIZES[3]}") == 140.0
    assert r.problems == (
        "no '# Out of bounds values' line (output may be truncated)",
        "no '# Avg bus bandwidth' line (cut short after 4 rows?); busbw_avg not recorded",
    )


def test_the_echoed_command_before_a_2_17_header_is_the_same_test() -> None:
    text = "$ ./build/all_reduce_perf -b 1K -e 1G -f 4 -g 8\n"
    text += header("all_reduce_perf", 8, "NVIDIA H100 80GB HBM3")
    text += _rows(SIZES, "sum", -1, 80.0, 140.0) + footer("all_reduce_perf", 140.0)
    r = parse("nccl", text)
    assert r.meta["tests"] == ["all_reduce_perf"] and r.passed and r.problems == ()
    assert r.kind == "nccl"


def test_errors_and_problems_of_every_test_in_the_file_are_kept() -> None:
    wrong = header("all_reduce_perf", 8, "NVIDIA H100 80GB HBM3")
    wrong += row(1 << 20, 1 << 18, "float", "sum", -1, [(50.0, 20.9, 36.6, 2)] * 2) + "\n"
    wrong += "# Avg bus bandwidth    : 36.6 \n#\n# Collective test concluded: all_reduce_perf\n"
    r = parse("nccl", wrong + all_gather())
    assert r.meta["tests"] == ["all_reduce_perf", "all_gather_perf"] and not r.passed
    assert r.errors == (
        f"size {1 << 20} (float): out-of-place #wrong 2",
        f"size {1 << 20} (float): in-place #wrong 2",
    )
    assert r.problems == ("no '# Out of bounds values' line (output may be truncated)",)


def test_rank_lines_of_a_gpu_without_a_name() -> None:
    """util.cu prints '[bus] %s': a device whose name is empty leaves the trailing space."""
    text = all_gather().replace("[0000:18:00] NVIDIA A100-SXM4-80GB\n", "[0000:18:00] \n")
    text = text.replace(" NVIDIA A100-SXM4-80GB\n", " \n")
    r = parse("nccl", text)
    assert r.meta["ranks"] == 8 and r.meta["nodes"] == ["dgx-00"]
    assert r.meta["device_model"] is None and r.gpu_model is None


def _per_iter_header(test: str) -> str:
    """writeResultHeader under ``-I 1``."""
    top = header(test, 8, "NVIDIA H100 80GB HBM3").rsplit("#\n", 1)[0] + "#\n"
    names = ("time", "algbw", "busbw", "#wrong", "i_min", "i_max", "i_p99", "i_cv%")
    cols = "  ".join(f"{c:>7}" for c in names)
    above = f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}              out-of-place"
    above += " (+ per-iteration)                                in-place (+ per-iteration)\n"
    first = f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}"
    return top + above + f"{first}  {cols}  {cols}\n"


@pytest.mark.parametrize("per_iter", [False, True])
def test_an_in_place_only_row_of_a_trace_replay(per_iter: bool) -> None:
    """writeBenchMarkLineNullBody: 32 blanks instead of the out-of-place half, under -I 1
    too (then the in-place half carries i_min i_max i_p99 i_cv%)."""
    head = _per_iter_header("all_reduce_perf") if per_iter else header("all_reduce_perf", 8, "x")
    line = f"{1 << 23:12d}  {1 << 21:12d}  {'float':>8}  {'sum':>6}  {-1:6d}" + " " * 32
    line += "    95.00   88.30  154.50       0"
    line += "     93.1     97.4     97.9      1.2" if per_iter else ""
    r = parse("nccl", head + line + "\n" + footer("all_reduce_perf", 154.5))
    assert r.problems == ()
    found = {m.metric: m.value for m in r.measurements}
    assert found == {
        "all_reduce_perf.busbw_avg": 154.5,
        f"all_reduce_perf.busbw_inplace@{1 << 23}": 154.5,
        f"all_reduce_perf.algbw_inplace@{1 << 23}": 88.3,
    }


def test_a_row_with_nccl_log_output_glued_in_is_unreadable() -> None:
    """NCCL_DEBUG=INFO writes to the same stdout: a line of another thread can land in the
    middle of a row (nccl-tests prints each half separately)."""
    text = header("all_reduce_perf", 8, "NVIDIA H100 80GB HBM3")
    text += row(1 << 22, 1 << 20, "float", "sum", -1, [(59.1, 70.9, 133.0, 0)] * 2) + "\n"
    lineno = text.count("\n") + 1
    glued = (
        f"{1 << 23:12d}  {1 << 21:12d}  {'float':>8}  {'sum':>6}  {-1:6d}    80.26  104.52  195.97"
        "       0dgx-00:4001:4120 [1] NCCL INFO Connected all trees"
    )
    text += glued + "\n    80.56  104.13  195.24       0\n"
    r = parse("nccl", text + footer("all_reduce_perf", 133.0))
    assert r.problems == (
        f"line {lineno}: unreadable table row {glued.strip()[:80]!r}",
        f"line {lineno + 1}: unreadable table row '80.56  104.13  195.24       0'",
    )
    assert _metric(r, f"all_reduce_perf.busbw@{1 << 22}") == 133.0


def test_several_types_in_a_layout_without_redop() -> None:
    """Before 2.13 all_gather printed no redop column; ``-d all`` still ran several types."""
    text = "$ ./build/all_gather_perf -g 4 -d all\n"
    text += "# nThread 1 nGpus 4 minBytes 1024 maxBytes 1024 step: 2(factor) warmup iters: 5\n"
    for dtype in ("float", "half"):
        text += f"        1024            64  {dtype:>6}    13.10    0.08    0.06  0e+00"
        text += "    12.90    0.08    0.06  0e+00\n"
    r = parse("nccl", text + "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0.06 \n")
    names = {m.metric for m in r.measurements if m.metric.startswith("all_gather_perf.busbw@")}
    assert names == {
        "all_gather_perf.busbw@1024.float.none",
        "all_gather_perf.busbw@1024.half.none",
    }


@pytest.mark.parametrize("binary", ["all_reduce_perf_mpi", "./build/all_reduce_perf_mpi"])
def test_an_mpi_build_is_the_same_test_before_and_after_2_17(binary: str) -> None:
    """2.17+ names the binary it runs (an MPI build's ends in _mpi); older versions' name
    comes from the command line, where _mpi was already dropped: one baseline, one name."""
    text = header(binary, 8, "NVIDIA H100 80GB HBM3")
    text += _rows(SIZES, "sum", -1, 80.0, 140.0) + footer(binary, 140.0)
    r = parse("nccl", text)
    assert r.meta["tests"] == ["all_reduce_perf"] and r.problems == ()
    assert _metric(r, "all_reduce_perf.busbw_avg") == 140.0
    old = parse("nccl", "+ mpirun -np 8 ./build/all_reduce_perf_mpi -g 1\n"
                + _nameless(8, "sum", -1, 2 * 7 / 8))  # fmt: skip
    assert old.meta["tests"] == ["all_reduce_perf"]  # named by its command line
    assert _metric(old, "all_reduce_perf.busbw_avg") == 140.0


_MIDDLE = _rows(SIZES[3:6], "sum", -1, 80.0, 140.0)  # a run's middle: its head and end cut


@pytest.mark.parametrize("layout", ["2.17", "before 2.17"])
def test_rows_kept_from_the_middle_of_a_run_stay_apart_from_the_next_run(layout: str) -> None:
    """A log collector that kept the last part of a job's output: the first run's rows
    without its header or name (unnamed, its problems said), then a whole run."""
    if layout == "2.17":
        text, tests = _MIDDLE + all_gather(model="NVIDIA H100 80GB HBM3"), ["all_gather_perf"]
    else:
        text = _MIDDLE + _before_2_17("all_gather_perf") + _rows(SIZES[:2], "none", -1, 80.0, 70.0)
        tests = ["nccl"]  # before 2.17 a run names itself nowhere but on its command line
    r = parse("nccl", text)
    assert r.meta["tests"] == ["nccl", *tests]
    first = {m.metric for m in r.measurements if m.value == 140.0}
    assert first == {f"nccl.busbw{p}@{s}" for s in SIZES[3:6] for p in ("", "_inplace")}
    assert r.problems[0] == "test name not in the output (no 'Collective test' or '*_perf' line)"
    assert not any(m.value == 140.0 and not m.metric.startswith("nccl.") for m in r.measurements)


def test_a_2_17_run_that_died_after_its_start_line_keeps_its_failure_apart() -> None:
    died = "# nccl-tests version 2.17.6 nccl-headers=22807 nccl-library=22807\n"
    died += "# Collective test starting: all_reduce_perf\n"
    died += "dgx-00: Test NCCL failure common.cu:1279 'unhandled cuda error'\n"
    r = parse("nccl", died + all_gather(model="NVIDIA H100 80GB HBM3"))
    assert r.meta["tests"] == ["all_reduce_perf", "all_gather_perf"] and not r.passed
    assert r.errors == ("line 3: dgx-00: Test NCCL failure common.cu:1279 'unhandled cuda error'",)
    assert _metric(r, "all_gather_perf.busbw_avg") == 61.2345
    assert not any(m.metric.startswith("all_reduce_perf.") for m in r.measurements)


def test_a_run_that_failed_before_its_header_keeps_its_failure_apart() -> None:
    """``-g 16`` on an 8-GPU node: nccl-tests fails before it prints its header."""
    died = "+ srun ./build/all_reduce_perf -b 1K -g 16\n"
    died += "dgx-00: Test CUDA failure common.cu:892 'invalid device ordinal'\n"
    gather = "+ srun ./build/all_gather_perf -g 8\n" + _before_2_17("all_gather_perf")
    gather += _rows(SIZES[:2], "none", -1, 80.0, 70.0) + footer("", 70.0).rsplit("# Coll", 1)[0]
    r = parse("nccl", died + gather)
    assert r.meta["tests"] == ["all_reduce_perf", "all_gather_perf"]
    assert r.errors == ("line 2: dgx-00: Test CUDA failure common.cu:892 'invalid device ordinal'",)
    assert _metric(r, "all_gather_perf.busbw_avg") == 70.0
    assert not any(m.metric.startswith("all_reduce_perf.") for m in r.measurements)
