"""fio ``--output-format=json`` output (a warning preamble before the JSON is skipped)."""

from __future__ import annotations

from typing import Any

from slurmhealth.baseline.model import Measurement, ParseResult
from slurmhealth.baseline.parse_common import (
    as_dict,
    as_float,
    as_list,
    fail,
    load_json_object,
    slug,
)

_DIRECTIONS = ("read", "write")


def _percentile(section: dict[str, Any], key: str) -> float | None:
    """A clat/lat percentile in ns; fio writes keys like ``"99.000000"``."""
    table = as_dict(section.get("percentile"))
    for k, v in table.items():
        try:
            if float(k) == float(key):
                return as_float(v)
        except ValueError:
            continue
    return None


def _direction(
    job: str, direction: str, data: dict[str, Any], problems: list[str]
) -> list[Measurement]:
    io_bytes = as_float(data.get("io_bytes"))
    total_ios = as_float(data.get("total_ios"))
    if not ((io_bytes or 0) > 0 or (total_ios or 0) > 0):
        return []
    prefix = f"fio.{job}.{direction}"
    out: list[Measurement] = []
    bw = as_float(data.get("bw"))
    if bw is None:
        problems.append(f"job {job!r} {direction}: no 'bw'")
    else:
        out.append(
            Measurement(f"{prefix}_bw", round(bw / 1024, 3), "MiB/s", detail={"bw_kib_s": bw})
        )
    iops = as_float(data.get("iops"))
    if iops is None:
        problems.append(f"job {job!r} {direction}: no 'iops'")
    else:
        out.append(Measurement(f"{prefix}_iops", iops, "IO/s"))
    found = False
    for source in ("clat_ns", "lat_ns"):
        section = as_dict(data.get(source))
        p50, p99 = _percentile(section, "50"), _percentile(section, "99")
        if p50 is not None and p99 is not None:
            for label, ns in (("p50", p50), ("p99", p99)):
                out.append(
                    Measurement(
                        f"{prefix}_lat_{label}",
                        round(ns / 1000, 3),
                        "us",
                        higher_is_better=False,
                        detail={"source": source},
                    )
                )
            found = True
            break
    if not found:
        mean = as_float(as_dict(data.get("clat_ns")).get("mean"))
        source = "clat_ns"
        if mean is None:
            mean, source = as_float(as_dict(data.get("lat_ns")).get("mean")), "lat_ns"
        if mean is None:
            problems.append(f"job {job!r} {direction}: no latency percentiles or mean")
        else:
            problems.append(f"job {job!r} {direction}: no latency percentiles; used {source} mean")
            out.append(
                Measurement(
                    f"{prefix}_lat_mean",
                    round(mean / 1000, 3),
                    "us",
                    higher_is_better=False,
                    detail={"source": source},
                )
            )
    return out


def parse_fio(text: str) -> ParseResult:
    """Per job and direction with I/O: ``fio.<job>.<read|write>_bw`` (MiB/s), ``_iops``,
    ``_lat_p50`` and ``_lat_p99`` (completion latency, us, lower is better)."""
    doc = load_json_object(text)
    if doc is None:
        raise fail("fio", "no JSON object found (run fio with --output-format=json)")
    jobs = as_list(doc.get("jobs"))
    if not jobs:
        raise fail("fio", "JSON has no 'jobs' list")
    measurements: list[Measurement] = []
    problems: list[str] = []
    errors: list[str] = []
    names: list[str] = []
    for index, raw in enumerate(jobs):
        job = as_dict(raw)
        if not job:
            problems.append(f"jobs[{index}] is not an object")
            continue
        jobname = job.get("jobname")
        name = slug(jobname) if isinstance(jobname, str) else f"job{index}"
        if not isinstance(jobname, str):
            problems.append(f"jobs[{index}] has no 'jobname'; called it {name!r}")
        names.append(name)
        err = as_float(job.get("error"))
        if err is None:
            problems.append(f"job {name!r}: no 'error' field")
        elif err != 0:
            errors.append(f"job {name!r}: error {int(err)}")
        found = []
        for direction in _DIRECTIONS:
            found += _direction(name, direction, as_dict(job.get(direction)), problems)
        if not found:
            problems.append(f"job {name!r}: no read or write I/O")
        measurements += found
    if not measurements and not errors:
        raise fail("fio", "no job with read or write I/O")
    meta: dict[str, Any] = {"jobs": names}
    if isinstance(doc.get("fio version"), str):
        meta["fio_version"] = doc["fio version"]
    return ParseResult(
        kind="fio",
        measurements=tuple(measurements),
        passed=not errors,
        errors=tuple(errors),
        problems=tuple(problems),
        meta=meta,
    )
