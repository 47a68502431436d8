"""perftest bandwidth output (``ib_write_bw``, ``ib_read_bw``, ``ib_send_bw``,
``ib_atomic_bw``; Debian's ``perftest`` package), client or server side.

Read as perftest prints it: the test banner (``RDMA_Write BW Test``, ``RDMA_Read
Bidirectional BW Test``), the settings block (`` Device         : mlx5_0``, `` Link type
: IB``), then the result table::

     #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
     65536      5000             392.87             392.11             0.747872

Units: ``--report_gbits`` prints Gb/sec (10^9 bits), the default MB/sec (2^20 bytes);
both become Gb/s here. Layouts: the default, ``#sl`` (QoS) before ``#iterations``, per-port
columns (dual port), ``CPU_Util[%]`` after the message rate; ``-a`` prints one row per
message size. Duration runs (``-D``) print a zero peak (not measured). Warnings
(``Conflicting CPU frequency values detected``) may sit inside the table.
"""

from __future__ import annotations

import re
from typing import Any

from slurmhealth.baseline.model import Measurement, ParseResult
from slurmhealth.baseline.parse_common import LAUNCHER_PREFIX, NUM, fail, result

KIND = "perftest"
MB_PER_S_IN_GBPS = 1048576 * 8 / 1e9  # perftest's MB/sec is 2^20 bytes per second

_BANNER = re.compile(
    r"^\s*(RDMA_Write|RDMA_Read|Send|Atomic(?:_\w+)?)\s+(Bidirectional\s+)?BW Test\s*$",
    re.IGNORECASE,
)
_TESTS = {"rdma_write": "ib_write_bw", "rdma_read": "ib_read_bw", "send": "ib_send_bw"}
_SETTING = re.compile(r"(Device|Link type|Transport type|Connection type)\s*:\s*([\w.-]{1,40})")
_COLUMN = re.compile(
    r"#\w{1,20}|BW (?:peak|average|Port\d)\[[^\]]{1,10}\]"
    r"|MsgRate[^\[]{0,8}\[[^\]]{1,10}\]|CPU_Util\[%\]"
)
_UNIT = re.compile(r"BW average\[(Gb/sec|MB/sec)\]")
_ROW = re.compile(r"^\s*\d{1,12}(?:\s+(?:" + NUM + r"|inf|nan|-nan)){2,12}\s*$", re.IGNORECASE)
_ERROR = re.compile(
    r"Couldn't|Unable to|Failed to|failed|Completion with error|Problems with|"
    r"\bERROR\b|error in|No IB devices found|timed out",
)
_BENIGN = re.compile(r"CPU [Ff]requency|Requested mtu is higher|Waiting for client")


def parse_perftest(text: str, *, test: str | None = None) -> ParseResult:
    """Measurements in Gb/s: ``<test>.bw_avg`` and ``<test>.bw_peak`` of the largest message
    size (the plateau; a peak of 0 is not measured), and ``<test>.bw_avg@<bytes>`` for each
    size. ``<test>`` is ``ib_write_bw`` / ``ib_read_bw`` / ``ib_send_bw`` from the banner,
    else ``test``; a bidirectional run adds ``_bidir``."""
    meta: dict[str, Any] = {}
    errors: list[str] = []
    problems: list[str] = []
    columns: list[str] = []
    unit = ""
    rows: list[list[str]] = []
    for raw in text.splitlines():
        line = LAUNCHER_PREFIX.sub("", raw, count=1)
        if m := _BANNER.match(line):
            name = _TESTS.get(m[1].lower(), f"ib_{m[1].lower()}_bw")
            meta["test"] = name + ("_bidir" if m[2] else "")
        elif "#bytes" in line and (u := _UNIT.search(line)):
            columns, unit = _COLUMN.findall(line), u[1]
        elif columns and _ROW.match(line):
            rows.append(line.split())
        elif not columns and (found := _SETTING.findall(line)):
            meta.update({k.lower().replace(" ", "_"): v for k, v in found})
        elif _ERROR.search(line) and not _BENIGN.search(line):
            errors.append(line.strip()[:200])
    if not columns:
        if errors:
            return result(KIND, [], errors, problems, meta)
        raise fail(KIND, "no '#bytes ... BW average[Gb/sec|MB/sec]' result table")
    name = str(meta.get("test") or test or "ib_bw")
    meta["test"], meta["unit_printed"] = name, unit
    factor = 1.0 if unit == "Gb/sec" else MB_PER_S_IN_GBPS
    measurements = _measure(name, columns, rows, factor, meta, problems)
    return result(KIND, measurements, errors, problems, meta)


def _measure(
    name: str,
    columns: list[str],
    rows: list[list[str]],
    factor: float,
    meta: dict[str, Any],
    problems: list[str],
) -> list[Measurement]:
    avg_col = next(i for i, c in enumerate(columns) if c.startswith("BW average"))
    peak_col = next((i for i, c in enumerate(columns) if c.startswith("BW peak")), None)
    by_size: dict[int, tuple[float, float | None]] = {}
    for cells in rows:
        if len(cells) < len(columns):
            problems.append(
                f"row with {len(cells)} of {len(columns)} values: {' '.join(cells)[:80]}"
            )
            continue
        try:
            avg = float(cells[avg_col]) * factor
            peak = float(cells[peak_col]) * factor if peak_col is not None else None
        except ValueError:
            problems.append(f"unreadable row: {' '.join(cells)[:80]}")
            continue
        if not avg > 0 or avg == float("inf"):
            problems.append(f"{cells[0]} bytes: no average bandwidth ({cells[avg_col]})")
            continue
        # a zero peak (duration runs) or an unreadable one (nan, inf) is not measured
        known = peak is not None and 0 < peak < float("inf")
        by_size[int(cells[0])] = (round(avg, 3), round(peak, 3) if known and peak else None)
    if not by_size:
        problems.append("the result table has no row with a bandwidth")
        return []
    meta["sizes"] = sorted(by_size)
    top = max(by_size)
    avg, peak = by_size[top]
    detail = {"bytes": top}
    out = [Measurement(f"{name}.bw_avg", avg, "Gb/s", detail=detail)]
    if peak:
        out.append(Measurement(f"{name}.bw_peak", peak, "Gb/s", detail=detail))
    out += [
        Measurement(f"{name}.bw_avg@{size}", a, "Gb/s") for size, (a, _) in sorted(by_size.items())
    ]
    return out
