"""fio JSON (``--output-format=json`` / ``json+``): metrics keyed by I/O pattern, block size and
direction, never by job name, so nodes with different device names compare."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.baseline.model import BaselineParseError, BenchmarkFailed, ParseResult
from slurmhealth.baseline.parsers import parse


def _dir(
    bw_kib: float, iops: float, p50_ns: int, p99_ns: int, plus: bool = False
) -> dict[str, Any]:
    clat: dict[str, Any] = {
        "min": 1000,
        "max": p99_ns * 3,
        "mean": p50_ns * 1.1,
        "percentile": {"1.000000": 900, "50.000000": p50_ns, "99.000000": p99_ns},
    }
    if plus:  # json+ adds the latency histogram
        clat["bins"] = {"1000": 3, str(p50_ns): 900, str(p99_ns): 9}
    return {
        "io_bytes": int(bw_kib * 1024 * 60),
        "bw": bw_kib,
        "iops": iops,
        "runtime": 60000,
        "total_ios": int(iops * 60),
        "clat_ns": clat,
        "lat_ns": {"min": 1100, "max": p99_ns * 3, "mean": p50_ns * 1.2},
    }


_IDLE = {"io_bytes": 0, "bw": 0, "iops": 0.0, "runtime": 0, "total_ios": 0}


def job(name: str, options: dict[str, str], read: Any = None, write: Any = None) -> dict[str, Any]:
    return {
        "jobname": name,
        "groupid": 0,
        "error": 0,
        "job options": {"name": name, **options},
        "read": read or _IDLE,
        "write": write or _IDLE,
        "trim": _IDLE,
    }


def doc(*jobs: dict[str, Any], global_options: dict[str, str] | None = None) -> str:
    return json.dumps(
        {"fio version": "fio-3.36", "global options": global_options or {}, "jobs": list(jobs)},
        indent=2,
    )


def _values(r: ParseResult) -> dict[str, float]:
    return {m.metric: m.value for m in r.measurements}


def test_two_nodes_with_different_device_names_compare() -> None:
    opts = {"rw": "randread", "bs": "4k", "iodepth": "32", "filename": "/dev/nvme8n13"}
    a = parse("fio", doc(job("dev_nvme8n13", opts, read=_dir(2457600, 614400, 48640, 125440))))
    opts["filename"] = "/dev/nvme0n1"
    b = parse("fio", doc(job("dev_nvme0n1", opts, read=_dir(2400000, 600000, 49000, 130000))))
    assert (
        set(_values(a))
        == set(_values(b))
        == {
            "fio.randread_4k.read_bw",
            "fio.randread_4k.read_iops",
            "fio.randread_4k.read_lat_p50",
            "fio.randread_4k.read_lat_p99",
        }
    )
    assert _values(a)["fio.randread_4k.read_bw"] == 2400.0  # MiB/s
    assert _values(b)["fio.randread_4k.read_lat_p99"] == 130.0  # us


def test_jobs_sharing_a_key_are_summed_and_worst_latency_kept() -> None:
    opts = {"rw": "write", "bs": "1M"}
    text = doc(
        job("dev_nvme0n1", opts, write=_dir(1024000, 1000, 900000, 2000000)),
        job("dev_nvme1n1", opts, write=_dir(2048000, 2000, 800000, 3000000)),
    )
    r = parse("fio", text)
    v = _values(r)
    assert v["fio.seqwrite_1m.write_bw"] == 3000.0 and v["fio.seqwrite_1m.write_iops"] == 3000
    assert (
        v["fio.seqwrite_1m.write_lat_p99"] == 3000.0 and v["fio.seqwrite_1m.write_lat_p50"] == 900.0
    )
    (bw,) = [m for m in r.measurements if m.metric == "fio.seqwrite_1m.write_bw"]
    assert bw.detail["jobs"] == ["dev_nvme0n1", "dev_nvme1n1"]


def test_mixed_job_with_per_direction_block_sizes() -> None:
    # bs=read,write sizes; rw with an offset modifier; iodepth etc. from global options
    text = doc(
        job("mix", {"rw": "randrw:8", "bs": "4k,64KiB"},
            read=_dir(40000, 10000, 90000, 300000), write=_dir(64000, 1000, 95000, 400000)),
    )  # fmt: skip
    v = _values(parse("fio", text))
    assert v["fio.randrw_4k.read_iops"] == 10000 and v["fio.randrw_64k.write_iops"] == 1000


@pytest.mark.parametrize(
    ("bs", "read", "write"),
    [("256k", "256k", "256k"), ("8k,32k", "8k", "32k"), (",8k", "4k", "8k"), ("4096", "4k", "4k"),
     ("1M", "1m", "1m"), ("2KiB,1g", "2k", "1g"), ("512", "512", "512")],
)  # fmt: skip
def test_block_size_of_each_direction(bs: str, read: str, write: str) -> None:
    both = job(
        "j", {"rw": "randrw", "bs": bs}, read=_dir(1000, 10, 5, 9), write=_dir(1000, 10, 5, 9)
    )
    keys = {m.metric.split(".")[1] for m in parse("fio", doc(both)).measurements}
    assert keys == {f"randrw_{read}", f"randrw_{write}"}


def test_global_options_json_plus_and_normal_text_before_the_json() -> None:
    text = "seq: (g=0): rw=read, bs=(R) 128KiB-128KiB\nfio-3.36\nStarting 1 process\n"
    text += doc(job("seq", {}, read=_dir(7000000, 54687, 2000000, 4000000, plus=True)),
                global_options={"rw": "read", "bs": "128k", "direct": "1"})  # fmt: skip
    v = _values(parse("fio", text))
    assert v["fio.seqread_128k.read_bw"] == round(7000000 / 1024, 3)
    assert v["fio.seqread_128k.read_lat_p99"] == 4000.0


def test_group_reporting_output_is_one_job() -> None:
    grouped = job("randwrite", {"rw": "randwrite", "bs": "4096", "numjobs": "16"},
                  write=_dir(800000, 200000, 70000, 250000))  # fmt: skip
    r = parse("fio", doc(grouped))
    assert _values(r)["fio.randwrite_4k.write_iops"] == 200000 and r.meta["jobs"] == ["randwrite"]


def test_job_errors_without_io_measure_nothing() -> None:
    failed = job("dev_nvme3n1", {"rw": "randread", "bs": "4k"})
    failed["error"] = 5
    with pytest.raises(BenchmarkFailed, match=r"no job with read, write or trim I/O.*error 5"):
        parse("fio", doc(failed))


def test_numbers_beyond_float_range_are_skipped() -> None:
    huge = job("big", {"rw": "read", "bs": "1m"}, read=_dir(1000, 1, 5000, 9000))
    huge["read"]["bw"] = 10**400
    r = parse("fio", doc(huge))
    assert "fio.seqread_1m.read_bw" not in _values(r)
    assert r.problems == ("job 'big' read: no 'bw'",)


_KEYS = ["jobs", "jobname", "read", "write", "trim", "bw", "iops", "io_bytes", "total_ios",
         "clat_ns", "percentile", "50.000000", "99.000000", "error", "job options",
         "global options", "rw", "bs", "mean"]  # fmt: skip
_JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(10**308, 10**400)  # beyond float range
    | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(_KEYS), inner, max_size=6)
    ),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None)
@given(value=_JSONISH)
def test_arbitrary_json_raises_only_parse_errors(value: Any) -> None:
    try:
        r = parse("fio", json.dumps(value))
    except BaselineParseError as exc:
        assert "\n" not in str(exc)
        return
    assert r.measurements and all(0 < m.value < float("inf") for m in r.measurements)
