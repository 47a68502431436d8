"""Benchmark-output parsers: fixtures give exact values; arbitrary text never crashes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.baseline.model import (
    KINDS,
    BaselineParseError,
    BenchmarkFailed,
    Measurement,
    ParseResult,
)
from slurmhealth.baseline.parsers import parse

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "baseline"


def _load(kind: str, name: str) -> ParseResult:
    return parse(kind, (FIXTURES / name).read_text())


def _by(result: ParseResult, metric: str, gpu: int | None = None) -> Measurement:
    found = [m for m in result.measurements if m.metric == metric and m.gpu == gpu]
    assert len(found) == 1, (metric, gpu, result.measurements)
    return found[0]


# --- nccl ------------------------------------------------------------------------------


def test_nccl_single_node() -> None:
    r = _load("nccl", "nccl_all_reduce_1x8.txt")
    assert r.kind == "nccl" and r.passed and r.errors == () and r.problems == ()
    assert _by(r, "all_reduce_perf.busbw_avg").value == 169.8082
    big = _by(r, "all_reduce_perf.busbw@8589934592")
    assert big.value == 479.69 and big.unit == "GB/s" and big.detail["time_us"] == 31337.8
    assert _by(r, "all_reduce_perf.algbw@8589934592").value == 274.11
    assert _by(r, "all_reduce_perf.busbw_inplace@8589934592").detail["time_us"] == 31338.1
    assert _by(r, "all_reduce_perf.algbw_inplace@8589934592").value == 274.11
    assert r.meta["ranks"] == 8 and r.meta["gpus"] == 8 and r.meta["iters"] == 20
    assert r.meta["nodes"] == ["gpu-node01"]
    assert r.meta["device_model"] == "NVIDIA H100 80GB HBM3"
    assert r.gpu_model == "NVIDIA H100 80GB HBM3"
    assert len(r.meta["sizes"]) == 31


def test_nccl_keeps_every_size_but_not_zero_readings() -> None:
    r = _load("nccl", "nccl_all_reduce_1x8.txt")
    sizes = {int(m.metric.split("@")[1]) for m in r.measurements if "@" in m.metric}
    # 8..64 bytes print 0.00 GB/s: below the printed precision, not a measurement
    assert sizes == {2**k for k in range(7, 34)}
    assert _by(r, "all_reduce_perf.busbw@65536").value == 5.16
    assert _by(r, "all_reduce_perf.busbw_inplace@65536").value == 5.09
    assert _by(r, "all_reduce_perf.algbw@4096").value == 0.19
    assert all(m.value > 0 for m in r.measurements)


def test_nccl_multi_node() -> None:
    r = _load("nccl", "nccl_all_reduce_2x8.txt")
    assert r.passed and r.problems == ()
    assert r.meta["nodes"] == ["gpu-node01", "gpu-node02"] and r.meta["ranks"] == 16
    assert _by(r, "all_reduce_perf.busbw@8589934592").value == 371.87
    assert _by(r, "all_reduce_perf.busbw_avg").value == 127.8494


def test_nccl_wrong_results_are_errors() -> None:
    r = _load("nccl", "nccl_all_reduce_wrong.txt")
    assert not r.passed
    assert r.errors == tuple(
        f"size {s} (float): in-place #wrong 1024" for s in (2147483648, 4294967296, 8589934592)
    )


def test_nccl_truncated_keeps_what_it_read() -> None:
    r = _load("nccl", "nccl_all_reduce_truncated.txt")
    assert r.passed and r.errors == ()
    assert len(r.problems) == 3
    assert r.problems[0].startswith("line 34: unreadable table row")
    assert "no '# Out of bounds values' line (output may be truncated)" in r.problems
    # an average of the first 17 sizes would read as a 97% slower node: not recorded
    assert any("cut short after 17 rows" in p for p in r.problems)
    assert not [m for m in r.measurements if m.metric.endswith("busbw_avg")]
    assert _by(r, "all_reduce_perf.busbw@524288").value == 38.38
    assert r.meta["max_bytes"] == 524288


NCCL_MIN = """# nThread 1 nGpus 2 minBytes 8 maxBytes 64 step: 2(factor) warmup iters: 5 iters: 20
#  Rank  0 Group  0 Pid   100 on node1 device  0 [0x18] NVIDIA A100-SXM4-80GB
#  Rank  1 Group  0 Pid   100 on node1 device  1 [0x2a] NVIDIA A100-SXM4-80GB
    32     8  float  none  -1  12.10  0.00  0.00  N/A  11.90  0.00  0.00  N/A
    64    16  float  none   0  12.50  0.01  0.01    0  12.20  0.01  0.01    2
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.005
"""


def test_nccl_test_name_hint_and_na_wrong() -> None:
    r = parse("nccl", NCCL_MIN, test="all_gather_perf")
    assert _by(r, "all_gather_perf.busbw_avg").value == 0.005
    assert r.errors == ("size 64 (float): in-place #wrong 2",) and not r.passed
    assert parse("nccl", NCCL_MIN).measurements[0].metric == "nccl.busbw_avg"
    cmd = "./build/broadcast_perf -b 8 -e 64 -f 2 -g 2\n" + NCCL_MIN
    assert parse("nccl", cmd).measurements[0].metric == "broadcast_perf.busbw_avg"


def test_nccl_out_of_bounds_failure() -> None:
    r = parse("nccl", NCCL_MIN.replace("0 OK", "4 FAILED").replace("    2\n", "    0\n"))
    assert not r.passed and r.errors == ("out of bounds values: 4 FAILED",)


# --- gpu-burn ----------------------------------------------------------------------------


def test_gpuburn_slow_gpu() -> None:
    r = _load("gpuburn", "gpuburn_8gpu_slow3.txt")
    assert r.passed and r.errors == () and r.problems == ()
    values = [_by(r, "gpuburn.gflops", g).value for g in range(8)]
    assert values == [43210, 43180, 43250, 30247, 43195, 43230, 43170, 43205]
    g3 = _by(r, "gpuburn.gflops", 3)
    assert g3.detail == {"iterations": 56713, "errors": 0, "temp_c": 71}
    assert r.meta["tested"] == 8 and r.meta["percent"] == 100.0


def test_gpuburn_faulty() -> None:
    r = _load("gpuburn", "gpuburn_8gpu_faulty.txt")
    assert not r.passed
    assert r.errors == ("GPU 5: 37 errors (WARNING!)", "GPU 5: FAULTY")
    assert r.meta["verdicts"][5] == "FAULTY"


def test_gpuburn_cut_short_is_a_failed_run() -> None:
    text = (FIXTURES / "gpuburn_8gpu_slow3.txt").read_text().split("100.0%")[0]
    with pytest.raises(BenchmarkFailed, match=r"run cut short.*last progress 60%") as info:
        parse("gpuburn", text)
    assert info.value.exit_code == 1


# --- fio ----------------------------------------------------------------------------------


def test_fio_seqread_with_preamble() -> None:
    r = _load("fio", "fio_seqread.json")
    assert r.passed and r.problems == () and r.meta["jobs"] == ["seqread"]
    assert _by(r, "fio.seqread_1m.read_bw").value == 3200.0
    assert _by(r, "fio.seqread_1m.read_iops").value == 3200.0
    p99 = _by(r, "fio.seqread_1m.read_lat_p99")
    assert p99.value == 4292.608 and p99.unit == "us" and not p99.higher_is_better
    assert _by(r, "fio.seqread_1m.read_lat_p50").value == 2473.984
    assert not any("write" in m.metric for m in r.measurements)


def test_fio_randread() -> None:
    r = _load("fio", "fio_randread.json")
    assert [m.metric for m in r.measurements] == [
        "fio.randread_4k.read_bw",
        "fio.randread_4k.read_iops",
        "fio.randread_4k.read_lat_p50",
        "fio.randread_4k.read_lat_p99",
    ]
    assert [m.value for m in r.measurements] == [2400.0, 614400.0, 48.64, 125.44]


def test_fio_job_error_and_mean_fallback() -> None:
    text = (
        '{"jobs": [{"jobname": "w", "error": 5, "write": {"io_bytes": 10, "bw": 2048,'
        ' "iops": 3, "lat_ns": {"mean": 1500}}}]}'
    )
    r = parse("fio", text)
    assert not r.passed and r.errors == ("job 'w': error 5",)
    assert _by(r, "fio.seqwrite_4k.write_lat_mean").value == 1.5
    assert r.problems == ("job 'w' write: no latency percentiles; used lat_ns mean",)


# --- nvbandwidth -------------------------------------------------------------------------


def test_nvbandwidth() -> None:
    r = _load("nvbandwidth", "nvbandwidth_h2d_d2h.txt")
    assert r.passed and r.problems == ()
    assert _by(r, "nvbandwidth.host_to_device_memcpy_ce").value == 441.0
    assert _by(r, "nvbandwidth.device_to_host_memcpy_ce").value == 428.15
    assert _by(r, "nvbandwidth.device_to_host_memcpy_ce", 3).value == 41.02
    assert _by(r, "nvbandwidth.host_to_device_memcpy_ce", 7).value == 55.16
    assert _by(r, "nvbandwidth.device_to_device_memcpy_read_ce").value == 4669.63
    per_gpu = [m for m in r.measurements if m.metric.endswith("read_ce") and m.gpu is not None]
    assert per_gpu == []
    assert r.meta["gpus"] == 8 and r.meta["device_model"] == "NVIDIA H100 80GB HBM3"
    assert r.gpu_model == "NVIDIA H100 80GB HBM3"


def test_nvbandwidth_missing_sum_is_computed() -> None:
    text = (FIXTURES / "nvbandwidth_h2d_d2h.txt").read_text()
    text = text.replace("SUM host_to_device_memcpy_ce 441.00\n", "")
    r = parse("nvbandwidth", text)
    assert _by(r, "nvbandwidth.host_to_device_memcpy_ce").value == 441.0
    assert r.problems == ("host_to_device_memcpy_ce: no SUM line; summed the matrix",)


# --- dcgm ---------------------------------------------------------------------------------


def test_dcgm_text_pass_with_warning() -> None:
    r = _load("dcgm", "dcgm_diag_r3_pass.txt")
    assert r.passed and r.errors == ()
    assert r.meta["level"] == 3 and r.meta["level_source"] == "command"
    assert _by(r, "dcgm.memory_bandwidth").value == 1.0
    assert _by(r, "dcgm.targeted_power", 5).value == 0.5
    assert _by(r, "dcgm.targeted_power", 4).value == 1.0
    assert not any(m.metric in ("dcgm.inforom", "dcgm.eud_test") for m in r.measurements)
    assert r.meta["warnings"] == ["Targeted Power: GPU 5 Enforced Power Limit was reached 12 times"]
    assert r.meta["dcgm_version"] == "3.3.5"


def test_dcgm_text_fail() -> None:
    r = _load("dcgm", "dcgm_diag_r2_fail.txt")
    assert not r.passed
    assert r.errors[:2] == ("Page Retirement/Row Remap: Fail", "GPU Memory GPU 2: Fail")
    assert _by(r, "dcgm.gpu_memory", 2).value == 0.0
    assert _by(r, "dcgm.page_retirement_row_remap").value == 0.0
    assert r.meta["level"] == 2 and r.meta["level_source"] == "inferred"


def test_dcgm_json_pass() -> None:
    r = _load("dcgm", "dcgm_diag_r2_pass.json")
    assert r.passed and r.meta["format"] == "json" and r.meta["level"] == 2
    assert _by(r, "dcgm.denylist").value == 1.0
    assert _by(r, "dcgm.pcie", 7).value == 1.0
    assert not any(m.metric == "dcgm.inforom" for m in r.measurements)
    assert len(r.measurements) == 20


def test_dcgm_json_fail() -> None:
    r = _load("dcgm", "dcgm_diag_r2_fail.json")
    assert not r.passed
    assert r.errors == (
        "GPU Memory GPU 6: Fail",
        "GPU Memory: GPU 6 DBE errors detected: 3 (GPU memory test)",
    )
    assert _by(r, "dcgm.gpu_memory", 6).value == 0.0


def test_dcgm_connection_error_is_parse_error() -> None:
    text = "Error: Unable to complete diagnostic for group 2147483647. Return: (-21)\n"
    with pytest.raises(BaselineParseError, match=r"dcgm: no diagnostic results.*Error: Unable"):
        parse("dcgm", text)


# --- dispatch and robustness -----------------------------------------------------------


def test_nccl_without_rows_names_what_is_missing() -> None:
    with pytest.raises(BaselineParseError, match="no nccl-tests result rows"):
        parse("nccl", "# nThread 1 nGpus 8 minBytes 8\n#  Rank  0 Pid 1 on n device 0 [0x1] X\n")


def test_fio_not_json() -> None:
    with pytest.raises(BaselineParseError, match="no JSON object"):
        parse("fio", "seqread: (groupid=0, jobs=1): err= 0\n  read: IOPS=3200, BW=3200MiB/s\n")


def test_unknown_kind_lists_kinds() -> None:
    with pytest.raises(BaselineParseError, match="nccl, gpuburn, fio, nvbandwidth, dcgm"):
        parse("hpl", "")


@pytest.mark.parametrize("kind", KINDS)
def test_empty_text_is_one_line_parse_error(kind: str) -> None:
    with pytest.raises(BaselineParseError) as info:
        parse(kind, "")
    message = str(info.value)
    assert message.startswith(f"{kind}: ") and "\n" not in message


FIXTURE_KINDS = [
    ("nccl", "nccl_all_reduce_1x8.txt"),
    ("nccl", "nccl_all_reduce_truncated.txt"),
    ("gpuburn", "gpuburn_8gpu_faulty.txt"),
    ("fio", "fio_seqread.json"),
    ("nvbandwidth", "nvbandwidth_h2d_d2h.txt"),
    ("dcgm", "dcgm_diag_r3_pass.txt"),
    ("dcgm", "dcgm_diag_r2_fail.json"),
]

_TEXT = st.text(
    alphabet=st.sampled_from(list("0123456789 .-:|+#%(){}[]\",\n\tabcxyzCGPUNA/_'"))
    | st.characters(),
    max_size=400,
)


def _safe_parse(kind: str, text: str) -> None:
    try:
        result = parse(kind, text)
    except BaselineParseError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(result, ParseResult) and result.kind == kind
    assert result.measurements  # a result that measured nothing is a BenchmarkFailed


@settings(max_examples=150, deadline=None)
@given(kind=st.sampled_from(KINDS), text=_TEXT)
def test_arbitrary_text_never_crashes(kind: str, text: str) -> None:
    _safe_parse(kind, text)


@settings(max_examples=150, deadline=None)
@given(case=st.sampled_from(FIXTURE_KINDS), before=_TEXT, after=_TEXT)
def test_noise_around_fixture_never_crashes(case: tuple[str, str], before: str, after: str) -> None:
    kind, name = case
    _safe_parse(kind, before + (FIXTURES / name).read_text() + after)


@settings(max_examples=150, deadline=None)
@given(case=st.sampled_from(FIXTURE_KINDS), data=st.data())
def test_cut_fixture_never_crashes(case: tuple[str, str], data: st.DataObject) -> None:
    kind, name = case
    text = (FIXTURES / name).read_text()
    start = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(start, len(text)))
    _safe_parse(kind, text[start:end])
