"""perftest output (Debian's ``perftest`` package, linux-rdma/perftest): every bandwidth
tool (``ib_write_bw``, ``ib_read_bw``, ``ib_send_bw``, ``ib_atomic_bw``,
``raw_ethernet_bw``) and latency tool (``ib_write_lat``, ``ib_read_lat``, ``ib_send_lat``,
``ib_atomic_lat``, ``raw_ethernet_lat``), client or server side.

Read as perftest prints it (the grammar is :mod:`.perftest_grammar`, built from perftest's
print formats): the banner (``RDMA_Write BW Test``, ``Send Bidirectional BW Test``,
``Atomic FETCH_AND_ADD Latency Test``), the settings block (`` Device         : mlx5_0``,
`` Connection type : RC``), then the result table::

     #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]
     65536      5000             46834.52            46742.18             0.747875

Units: ``MiB/sec`` (the default since perftest 24.07) and ``MB/sec`` (before) are both 2^20
bytes per second, ``Gb/sec`` (``--report_gbits``) 10^9 bits: all become Gb/s, rounded to
the coarsest resolution perftest prints (0.01 Gb/s, 0.0001 below 0.1), so one run printed
in any unit stores the same value; each measurement keeps what was printed (``printed``).
Layouts: ``#sl`` (QoS), per-port columns, ``CPU_Util[%]``; ``-a`` prints one row per
message size; ``--run_infinitely`` prints one row per interval (rows of one size are
averaged; a row cut short is a problem, not a value); several runs in one file (a header
per run) are read table by table, each under its own banner's test. Duration runs (``-D``)
print a zero peak (not measured). ``--output=bandwidth|message_rate|latency`` prints one
number per run and nothing else: the caller names the test and the unit (``output``,
``unit``), since the output does not. A header that is not one of perftest's is a one-line
error naming what it saw.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from slurmhealth.baseline.model import Measurement, ParseResult
from slurmhealth.baseline.parse_common import LAUNCHER_PREFIX, NUM, fail, result
from slurmhealth.baseline.perftest_grammar import (
    BANNER,
    GBPS_PER_UNIT,
    Header,
    HeaderError,
    parse_header,
    tool_name,
)

KIND = "perftest"
OUTPUTS = ("bandwidth", "message_rate", "latency")  # perftest's --output=<units>
_SETTING = re.compile(r"(Device|Link type|Transport type|Connection type)\s*:\s*([\w.-]{1,40})")
_CELL = NUM + r"|inf|nan|-nan"
_ROW = re.compile(r"^\s*\d{1,12}(?:\s+(?:" + _CELL + r")){1,14}\s*$", re.IGNORECASE)
_ONE_NUMBER = re.compile(r"^\s*(" + NUM + r")\s*$")
_ERROR = re.compile(
    r"Couldn't|Unable to|Failed to|failed|Completion with error|Problems with|"
    r"\bERROR\b|error in|No IB devices found|timed out",
)
_BENIGN = re.compile(r"CPU [Ff]requency|Requested mtu is higher|Waiting for client")
_LAT_HEADLINE = ("lat_typical", "lat_avg", "lat_p99", "lat_p99_9")


@dataclass
class _Table:
    test: str
    header: Header
    rows: dict[int, list[list[str]]] = field(default_factory=dict)  # size -> rows


def parse_perftest(
    text: str, *, test: str | None = None, output: str | None = None, unit: str | None = None
) -> ParseResult:
    """Measurements of a bandwidth table in Gb/s: ``<test>.bw_avg`` and ``<test>.bw_peak``
    of the largest message size (a peak of 0 is not measured), ``<test>.bw_avg@<bytes>``
    for each size; of a latency table in microseconds (lower is better, ``_us``):
    ``<test>.lat_typical_us`` / ``lat_avg_us`` / ``lat_p99_us`` / ``lat_p99_9_us`` of the
    smallest size, ``<test>.lat_typical_us@<bytes>`` (``lat_avg_us@`` for duration runs)
    for each. ``<test>`` is ``ib_write_bw``, ``ib_send_lat``, ``raw_ethernet_bw``... from
    the banner, else ``test``; a bidirectional run adds ``_bidir``. ``output`` (one of
    :data:`OUTPUTS`) reads ``--output`` one-number runs; ``unit`` is their bandwidth unit
    (``Gb/sec`` with ``--report_gbits``, else ``MiB/sec``)."""
    if output is not None:
        return _one_number(text, test, output, unit)
    meta: dict[str, Any] = {}
    errors: list[str] = []
    problems: list[str] = []
    tables: list[_Table] = []
    name: str | None = None
    banner: re.Match[str] | None = None
    for raw in text.splitlines():
        line = LAUNCHER_PREFIX.sub("", raw, count=1)
        if m := BANNER.match(line):
            banner, name = m, None
        elif "#bytes" in line:
            try:
                header = parse_header(line)
            except HeaderError as exc:
                what = f"unreadable result table header at {exc}: {line.strip()[:120]!r}"
                raise fail(KIND, what) from None
            name = name or _name(banner, meta, test, header)
            tables.append(_Table(name, header))
        elif tables and _ROW.match(line):
            cells = line.split()
            tables[-1].rows.setdefault(int(cells[0]), []).append(cells)
        elif not tables and (found := _SETTING.findall(line)):
            meta.update({k.lower().replace(" ", "_"): v for k, v in found})
        elif _ERROR.search(line) and not _BENIGN.search(line):
            errors.append(line.strip()[:200])
    if not tables:
        if errors:
            return result(KIND, [], errors, problems, meta)
        raise fail(KIND, _nothing_read(text))
    measurements: list[Measurement] = []
    for table in tables:
        measurements += _measure(table, meta, problems)
    meta["test"] = tables[-1].test
    meta["unit_printed"] = tables[-1].header.unit or "usec"
    return result(KIND, _merge(measurements), errors, problems, meta)


def _name(
    banner: re.Match[str] | None, meta: dict[str, Any], test: str | None, header: Header
) -> str:
    if banner is None:
        return test or ("ib_lat" if header.latency else "ib_bw")
    connection = meta.get("connection_type")
    base = tool_name(banner, connection if isinstance(connection, str) else None)
    return base + ("_bidir" if banner["bidir"] else "")


def _nothing_read(text: str) -> str:
    numbers = [ln.strip() for ln in text.splitlines() if _ONE_NUMBER.match(ln)]
    if numbers:
        return (
            f"one number per line ({numbers[0]!r}) and no result table: perftest "
            "--output=... prints neither the test nor the unit; ingest it with "
            "--perftest-output bandwidth|message_rate|latency and --test"
        )
    return "no '#bytes ... BW average[...]' or '#bytes ... t_typical[usec]' result table"


def gbps(value: float, unit: str) -> float:
    """A bandwidth printed in ``unit`` as Gb/s at the coarsest resolution perftest prints
    it with: 0.01 Gb/s (``%.2lf`` Gb/sec), 0.0001 below 0.1 Gb/s (where Gb/sec gets six
    decimals but ``%.2lf`` MiB/sec only resolves 0.000084 Gb/s)."""
    g = value * GBPS_PER_UNIT[unit]
    return round(g, 2) if g >= 0.1 else round(g, 4)


def _cell(cells: list[str], i: int | None) -> float | None:
    if i is None or i >= len(cells):
        return None
    try:
        v = float(cells[i])
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _measure(table: _Table, meta: dict[str, Any], problems: list[str]) -> list[Measurement]:
    header, per_size = table.header, {}
    for size, rows in table.rows.items():
        whole = [r for r in rows if len(r) >= header.required]
        for r in rows:
            if len(r) < header.required:
                problems.append(
                    f"row with {len(r)} of {header.required} values: {' '.join(r)[:80]}"
                )
        if whole:
            per_size[size] = whole
    if not per_size:
        problems.append(f"{table.test}: the result table has no complete row")
        return []
    meta.setdefault("sizes", [])
    meta["sizes"] = sorted(set(meta["sizes"]) | set(per_size))
    if any(len(r) > 1 for r in per_size.values()):
        meta["intervals"] = max(len(r) for r in per_size.values())
    if header.latency:
        return _latency(table.test, header, per_size, problems)
    return _bandwidth(table.test, header, per_size, problems)


def _mean(rows: list[list[str]], i: int | None) -> tuple[float, str] | None:
    """The mean of column ``i`` over the rows (``--run_infinitely`` intervals), and the
    value as printed (the one row's text, or the mean at the tool's two decimals)."""
    values = [v for r in rows if (v := _cell(r, i)) is not None]
    if not values or i is None:
        return None
    if len(values) == 1:
        return values[0], rows[0][i]
    return statistics.fmean(values), f"{statistics.fmean(values):.2f} (mean of {len(values)})"


def _bandwidth(
    test: str, header: Header, per_size: dict[int, list[list[str]]], problems: list[str]
) -> list[Measurement]:
    unit = header.unit or "MiB/sec"
    avg_i, peak_i = header.index("bw_avg"), header.index("bw_peak")
    by_size: dict[int, tuple[float, str, float | None, str]] = {}
    for size, rows in sorted(per_size.items()):
        avg = _mean(rows, avg_i)
        if avg is None or not avg[0] > 0:
            problems.append(f"{test} {size} bytes: no average bandwidth ({rows[0][avg_i or 0]})")
            continue
        peak = _mean(rows, peak_i)
        known = peak is not None and peak[0] > 0
        by_size[size] = (
            avg[0],
            avg[1],
            peak[0] if peak and known else None,
            peak[1] if peak else "",
        )
    if not by_size:
        problems.append(f"{test}: the result table has no row with a bandwidth")
        return []
    top = max(by_size)
    top_avg, avg_text, top_peak, peak_text = by_size[top]
    detail = {"bytes": top}
    out = [Measurement(f"{test}.bw_avg", gbps(top_avg, unit), "Gb/s", detail=detail,
                       printed=f"{avg_text} {unit}")]  # fmt: skip
    if top_peak:
        out.append(Measurement(f"{test}.bw_peak", gbps(top_peak, unit), "Gb/s", detail=detail,
                               printed=f"{peak_text} {unit}"))  # fmt: skip
    out += [
        Measurement(f"{test}.bw_avg@{size}", gbps(a, unit), "Gb/s", printed=f"{t} {unit}")
        for size, (a, t, _, _) in sorted(by_size.items())
    ]
    return out


def _latency(
    test: str, header: Header, per_size: dict[int, list[list[str]]], problems: list[str]
) -> list[Measurement]:
    per_size_col = "lat_typical" if header.index("lat_typical") is not None else "lat_avg"
    out: list[Measurement] = []
    first = min(per_size)
    for col in _LAT_HEADLINE:
        got = _mean(per_size[first], header.index(col))
        if got is not None and got[0] > 0:
            out.append(_lat(f"{test}.{col}_us", got, {"bytes": first}))
    for size, rows in sorted(per_size.items()):
        got = _mean(rows, header.index(per_size_col))
        if got is None or not got[0] > 0:
            problems.append(f"{test} {size} bytes: no latency")
            continue
        out.append(_lat(f"{test}.{per_size_col}_us@{size}", got, {}))
    return out


def _lat(metric: str, got: tuple[float, str], detail: dict[str, Any]) -> Measurement:
    return Measurement(metric, round(got[0], 2), "us", higher_is_better=False, detail=detail,
                       printed=f"{got[1]} usec")  # fmt: skip


def _merge(measurements: list[Measurement]) -> list[Measurement]:
    """One measurement per metric: a later table of the same test (the next run of a
    script) replaces an earlier one's value."""
    by_metric: dict[str, Measurement] = {}
    for m in measurements:
        by_metric.pop(m.metric, None)
        by_metric[m.metric] = m
    return list(by_metric.values())


def _one_number(text: str, test: str | None, output: str, unit: str | None) -> ParseResult:
    """``--output=bandwidth|message_rate|latency``: one ``%lf`` per run, nothing else."""
    if output not in OUTPUTS:
        raise fail(KIND, f"unknown --output {output!r}; expected one of: {', '.join(OUTPUTS)}")
    if not test:
        raise fail(KIND, "--output runs print no banner: name the test (e.g. ib_write_bw)")
    unit = unit or "MiB/sec"
    if unit not in GBPS_PER_UNIT:
        raise fail(KIND, f"unknown unit {unit!r}; expected one of: {', '.join(GBPS_PER_UNIT)}")
    numbers: list[tuple[float, str]] = []
    errors: list[str] = []
    other: list[str] = []
    for raw in text.splitlines():
        line = LAUNCHER_PREFIX.sub("", raw, count=1).strip()
        if n := _ONE_NUMBER.match(line):
            numbers.append((float(n[1]), n[1]))
        elif _ERROR.search(line) and not _BENIGN.search(line):
            errors.append(line[:200])
        elif line:
            other.append(line)
    meta: dict[str, Any] = {"test": test, "output": output, "runs": len(numbers)}
    if not numbers:
        if errors:
            return result(KIND, [], errors, [], meta)
        seen = f": {other[0][:80]!r}" if other else ""
        raise fail(KIND, f"--output={output}: no number on a line of its own{seen}")
    value = statistics.fmean(v for v, _ in numbers)
    shown = numbers[0][1] if len(numbers) == 1 else f"{value:.6f} (mean of {len(numbers)})"
    if output == "bandwidth":
        meta["unit_printed"] = unit
        m = Measurement(f"{test}.bw_avg", gbps(value, unit), "Gb/s", printed=f"{shown} {unit}")
    elif output == "message_rate":
        m = Measurement(f"{test}.msg_rate", round(value, 6), "Mpps", printed=f"{shown} Mpps")
    else:
        m = _lat(f"{test}.lat_avg_us", (value, shown), {})  # perftest prints t_avg
    problems = [f"not a number: {o[:80]}" for o in other[:5]]
    return result(KIND, [m] if m.value > 0 else [], errors, problems, meta)
