"""fio ``--output-format=json`` / ``json+`` output (a warning preamble, or the normal text
of ``--output-format=json,normal``, before the JSON is skipped).

Metrics are keyed by what was measured, not by the job's name (often a device path such as
``dev_nvme8n13``), so nodes with different device names compare: the I/O pattern (``rw``,
sequential ones as ``seqread`` / ``seqwrite`` / ``seqrw``), the block size of that direction
(``bs``, e.g. ``4k``, ``1m``) and the direction: ``fio.randread_4k.read_iops``. Jobs with the
same key (one job per device, or ``numjobs``) are summed (bandwidth, IOPS) and their worst
latency kept; ``group_reporting`` output is one job already."""

from __future__ import annotations

import re
from typing import Any

from slurmhealth.baseline.model import BenchmarkFailed, Measurement, ParseResult
from slurmhealth.baseline.parse_common import (
    as_dict,
    as_float,
    as_list,
    fail,
    load_json_object,
    result,
    slug,
)

_DIRECTIONS = ("read", "write", "trim")
_SEQUENTIAL = {"read": "seqread", "write": "seqwrite", "rw": "seqrw", "readwrite": "seqrw",
               "trim": "seqtrim", "trimwrite": "seqtrimwrite"}  # fmt: skip
_SIZE = re.compile(r"(\d{1,15})\s*([kmgtp]?)(?:i?b)?", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}


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


def _option(job: dict[str, Any], doc: dict[str, Any], *names: str) -> str | None:
    """A job option as written (``job options``, else ``global options``)."""
    for section in (as_dict(job.get("job options")), as_dict(doc.get("global options"))):
        for name in names:
            value = section.get(name)
            if isinstance(value, str | int) and not isinstance(value, bool):
                return str(value)
    return None


def _bs(text: str | None, direction: str) -> str:
    """The block size of ``direction`` as ``4k`` / ``1m`` / ``512``: fio's ``bs=`` may give
    read,write,trim sizes separated by commas, the last one applying to the directions after
    it (``bs=8k,32k``: trims 32k); k/m/g are 1024-based; the default is 4k."""
    if text is None:
        return "4k"
    parts = [p.strip() for p in text.split(",")]
    part = parts[min(_DIRECTIONS.index(direction), len(parts) - 1)]
    if not part:  # "bs=,8k": the default for reads
        return "4k"
    m = _SIZE.fullmatch(part)
    if not m:
        return slug(part)
    size = int(m.group(1)) * _UNITS[m.group(2).lower()]
    for suffix, unit in (("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if size and size % unit == 0:
            return f"{size // unit}{suffix}"
    return str(size)


def _pattern(rw: str) -> str:
    """``randread`` stays; fio's sequential ``read`` / ``write`` / ``rw`` become ``seqread`` /
    ``seqwrite`` / ``seqrw``; a ``:N`` offset modifier is dropped."""
    name = rw.split(":")[0].strip().lower()
    return _SEQUENTIAL.get(name, slug(name))


def _direction(
    prefix: str, where: str, data: dict[str, Any], problems: list[str]
) -> list[Measurement]:
    io_bytes = as_float(data.get("io_bytes"))
    total_ios = as_float(data.get("total_ios"))
    if not ((io_bytes or 0) > 0 or (total_ios or 0) > 0):
        return []
    out: list[Measurement] = []
    bw = as_float(data.get("bw"))
    if bw is None:
        problems.append(f"{where}: no 'bw'")
    elif bw > 0:
        out.append(
            Measurement(f"{prefix}_bw", round(bw / 1024, 3), "MiB/s", detail={"bw_kib_s": bw})
        )
    iops = as_float(data.get("iops"))
    if iops is None:
        problems.append(f"{where}: no 'iops'")
    elif iops > 0:
        out.append(Measurement(f"{prefix}_iops", iops, "IO/s"))
    return out + _latency(prefix, where, data, problems)


def _latency(
    prefix: str, where: str, data: dict[str, Any], problems: list[str]
) -> list[Measurement]:
    for source in ("clat_ns", "lat_ns"):
        section = as_dict(data.get(source))
        p50, p99 = _percentile(section, "50"), _percentile(section, "99")
        if p50 is not None and p99 is not None:
            return [
                Measurement(f"{prefix}_lat_{label}", round(ns / 1000, 3), "us",
                            higher_is_better=False, detail={"source": source})
                for label, ns in (("p50", p50), ("p99", p99))
            ]  # fmt: skip
    for source in ("clat_ns", "lat_ns"):
        mean = as_float(as_dict(data.get(source)).get("mean"))
        if mean is not None:
            problems.append(f"{where}: no latency percentiles; used {source} mean")
            return [
                Measurement(f"{prefix}_lat_mean", round(mean / 1000, 3), "us",
                            higher_is_better=False, detail={"source": source})
            ]  # fmt: skip
    problems.append(f"{where}: no latency percentiles or mean")
    return []


def _combine(found: list[tuple[str, Measurement]]) -> list[Measurement]:
    """One measurement per metric: bandwidth and IOPS summed over the jobs that share the
    key, the worst latency kept; ``detail["jobs"]`` names them."""
    merged: dict[str, tuple[Measurement, list[str]]] = {}
    for job, m in found:
        if m.metric not in merged:
            merged[m.metric] = (m, [job])
            continue
        old, jobs = merged[m.metric]
        value = max(old.value, m.value) if not m.higher_is_better else old.value + m.value
        merged[m.metric] = (Measurement(m.metric, round(value, 3), m.unit,
                                        higher_is_better=m.higher_is_better,
                                        detail=old.detail), [*jobs, job])  # fmt: skip
    return [
        Measurement(m.metric, m.value, m.unit, higher_is_better=m.higher_is_better,
                    detail={**m.detail, "jobs": jobs})
        for m, jobs in merged.values()
    ]  # fmt: skip


def _job(
    doc: dict[str, Any], job: dict[str, Any], name: str, problems: list[str]
) -> list[Measurement]:
    rw = _option(job, doc, "rw", "readwrite")
    bs = _option(job, doc, "bs", "blocksize")
    found: list[Measurement] = []
    for direction in _DIRECTIONS:
        pattern = _pattern(rw or direction)
        prefix = f"fio.{pattern}_{_bs(bs, direction)}.{direction}"
        found += _direction(prefix, f"job {name!r} {direction}", as_dict(job.get(direction)),
                            problems)  # fmt: skip
    return found


def parse_fio(text: str) -> ParseResult:
    """Per I/O pattern, block size and direction with I/O: ``fio.<pattern>_<bs>.<dir>_bw``
    (MiB/s), ``_iops``, ``_lat_p50`` and ``_lat_p99`` (completion latency, us, lower is
    better), e.g. ``fio.randread_4k.read_iops``, ``fio.seqwrite_1m.write_bw``."""
    doc = load_json_object(text)
    if doc is None:
        raise fail("fio", "no JSON object found (run fio with --output-format=json)")
    jobs = as_list(doc.get("jobs"))
    if not jobs:
        raise fail("fio", "JSON has no 'jobs' list")
    found: list[tuple[str, Measurement]] = []
    problems: list[str] = []
    errors: list[str] = []
    names: list[str] = []
    for index, raw in enumerate(jobs):
        job = as_dict(raw)
        if not job:
            problems.append(f"jobs[{index}] is not an object")
            continue
        jobname = job.get("jobname")
        name = jobname if isinstance(jobname, str) else f"job{index}"
        if not isinstance(jobname, str):
            problems.append(f"jobs[{index}] has no 'jobname'; called it {name!r}")
        names.append(name)
        err = as_float(job.get("error"))
        if err is None:
            problems.append(f"job {name!r}: no 'error' field")
        elif err != 0:
            errors.append(f"job {name!r}: error {int(err)}")
        measured = _job(doc, job, name, problems)
        if not measured:
            problems.append(f"job {name!r}: no read, write or trim I/O")
        found += [(name, m) for m in measured]
    if not found:
        what = "no job with read, write or trim I/O"
        raise BenchmarkFailed(f"fio: {what}" + (f" ({'; '.join(errors)})" if errors else ""))
    meta: dict[str, Any] = {"jobs": names}
    if isinstance(doc.get("fio version"), str):
        meta["fio_version"] = doc["fio version"]
    return result("fio", _combine(found), errors, problems, meta)
