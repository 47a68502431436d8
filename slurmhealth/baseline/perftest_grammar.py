"""What perftest prints, as data: the test banner, the result-table headers and their units.

Taken from perftest's own print formats (``src/perftest_parameters.h`` and
``ctx_print_test_info`` in ``src/perftest_parameters.c``, linux-rdma/perftest):

- the banner is ``<verb> [<atomic type>] [Bidirectional] [Post List] BW|Latency
  [forwarding] [Multicast] Test``, the verb one of ``Send``, ``Send_imm``,
  ``RDMA_Write``, ``RDMA_Write_imm``, ``RDMA_Read``, ``Atomic`` (atomic types
  ``CMP_AND_SWAP``, ``FETCH_AND_ADD``); the settings block names the connection type
  (``RC``, ``UC``, ``UD``, ``RawEth``, ``XRC``, ``DC``, ``SRD``): ``RawEth`` is
  ``raw_ethernet_bw`` / ``raw_ethernet_lat``;
- bandwidth headers (``RESULT_FMT*``): ``#bytes [#sl] #iterations BW peak[U] BW
  average[U] MsgRate[Mpps] [BW Port1[U] MsgRate Port1[Mpps] BW Port2[U] MsgRate
  Port2[Mpps]] [CPU_Util[%]]``, ``U`` = ``MiB/sec`` (the default since perftest 24.07),
  ``MB/sec`` (the same 2^20 bytes, before) or ``Gb/sec`` (``--report_gbits``, 10^9 bits);
- latency headers (``RESULT_FMT_LAT``, ``RESULT_FMT_LAT_DUR``): ``#bytes #iterations
  t_min[usec] t_max[usec] t_typical[usec] [t_avg[usec] t_stdev[usec] 99% percentile[usec]
  99.9% percentile[usec]]`` (the bracketed five since perftest 3.x), and for duration runs
  ``#bytes #iterations t_avg[usec] [tps average]``.

Rows are printed with ``%-7lu`` sizes, ``%lu``/``PRIu64`` iteration counts and ``%.2lf``
(``%.6lf`` below 0.1 Gb/s) values; ``--output=bandwidth|message_rate|latency`` prints one
``%lf`` number and nothing else, neither the banner nor the unit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# bytes/s of one printed unit, times 8 / 1e9 = Gb/s (perftest: format_factor 0x100000 for
# MB/MiB, 125000000 bytes for Gb: "MiB=2^20 byte, while Gb=10^9 bits")
GBPS_PER_UNIT: Mapping[str, float] = {
    "MiB/sec": 1048576 * 8 / 1e9,
    "MB/sec": 1048576 * 8 / 1e9,
    "Gb/sec": 1.0,
}

BANNER = re.compile(
    r"^\s*(?P<verb>Send_imm|Send|RDMA_Write_imm|RDMA_Write|RDMA_Read|Atomic)"
    r"(?: (?P<atomic>CMP_AND_SWAP|FETCH_AND_ADD))?(?P<bidir> Bidirectional)?(?: Post List)?"
    r" (?P<tst>BW|Latency)(?: forwarding)?(?: Multicast)? Test\s*$"
)
_VERB = {
    "Send": "send",
    "Send_imm": "send",
    "RDMA_Write": "write",
    "RDMA_Write_imm": "write",
    "RDMA_Read": "read",
    "Atomic": "atomic",
}

# header tokens: printed text -> column name (None: kept out of the measurements)
_TOKENS: tuple[tuple[str, str | None], ...] = (
    (r"#bytes", "bytes"),
    (r"#sl", None),
    (r"#iterations", "iterations"),
    (r"BW peak\[(?P<u1>MiB/sec|MB/sec|Gb/sec)\]", "bw_peak"),
    (r"BW average\[(?P<u2>MiB/sec|MB/sec|Gb/sec)\]", "bw_avg"),
    (r"MsgRate\[Mpps\]", "msg_rate"),
    (r"BW Port1\[(?:MiB/sec|MB/sec|Gb/sec)\]", "bw_port1"),
    (r"MsgRate Port1\[Mpps\]", None),
    (r"BW Port2\[(?:MiB/sec|MB/sec|Gb/sec)\]", "bw_port2"),
    (r"MsgRate Port2\[Mpps\]", None),
    (r"t_min\[usec\]", "lat_min"),
    (r"t_max\[usec\]", "lat_max"),
    (r"t_typical\[usec\]", "lat_typical"),
    (r"t_avg\[usec\]", "lat_avg"),
    (r"t_stdev\[usec\]", "lat_stdev"),
    (r"99% percentile\[usec\]", "lat_p99"),
    (r"99\.9% percentile\[usec\]", "lat_p99_9"),
    (r"tps average", "tps"),
    (r"CPU_Util\[%\]", "cpu_util"),
)
_TOKEN = re.compile("|".join(f"(?P<t{i}>{p})" for i, (p, _) in enumerate(_TOKENS)))


class Header:
    """One result-table header: its columns (``None`` for those not measured) and unit."""

    __slots__ = ("columns", "latency", "unit")

    def __init__(self, columns: list[str | None], unit: str | None) -> None:
        self.columns = columns
        self.unit = unit  # the bandwidth unit as printed; None for latency tables
        self.latency = "bw_avg" not in columns

    def index(self, name: str) -> int | None:
        return self.columns.index(name) if name in self.columns else None

    @property
    def required(self) -> int:
        """Cells a row must have: every column but a trailing ``CPU_Util[%]``."""
        n = len(self.columns)
        return n - 1 if self.columns[-1] == "cpu_util" else n


class HeaderError(ValueError):
    """A ``#bytes`` line that is not one of perftest's result headers."""


def parse_header(line: str) -> Header:
    """The header ``line`` (it holds ``#bytes``) as columns; :class:`HeaderError` naming
    the text it could not read when any part of it is not one of perftest's columns."""
    columns: list[str | None] = []
    units: set[str] = set()
    pos = 0
    text = line.rstrip()
    for m in _TOKEN.finditer(text):
        gap = text[pos : m.start()].strip()
        if gap:
            raise HeaderError(gap[:60])
        i = int(next(k for k, v in m.groupdict().items() if v and k.startswith("t"))[1:])
        columns.append(_TOKENS[i][1])
        units.update(u for u in (m["u1"], m["u2"]) if u)
        pos = m.end()
    if text[pos:].strip():
        raise HeaderError(text[pos:].strip()[:60])
    if not columns or columns[0] != "bytes" or len(units) > 1:
        raise HeaderError(text.strip()[:60])
    if "bw_avg" not in columns and not {"lat_typical", "lat_avg"} & set(columns):
        raise HeaderError(text.strip()[:60])
    return Header(columns, units.pop() if units else None)


def tool_name(banner: re.Match[str], connection: str | None) -> str:
    """``ib_write_bw``, ``ib_atomic_lat``, ``raw_ethernet_bw``... from the banner and the
    settings block's connection type."""
    kind = "bw" if banner["tst"] == "BW" else "lat"
    if connection == "RawEth":
        return f"raw_ethernet_{kind}"
    return f"ib_{_VERB[banner['verb']]}_{kind}"
