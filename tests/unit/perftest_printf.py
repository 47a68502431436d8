"""perftest's output, printed the way perftest prints it: its banner
(``ctx_print_test_info``), result headers (``RESULT_FMT*``) and row formats (``REPORT_FMT*``)
from ``src/perftest_parameters.h`` of linux-rdma/perftest (24.07 and later; ``MB`` for the
releases before it), filled with C printf semantics (``%-7lu``, ``%-7.2lf``, ``PRIu64``).
Tests use it to print one run every way perftest can; the parser is not built from it."""

from __future__ import annotations

import re

RESULT_LINE = "-" * 87
RESULT_FMT = " #bytes     #iterations    BW peak[{u}]    BW average[{u}]   MsgRate[Mpps]"
RESULT_FMT_PER_PORT = (
    RESULT_FMT + "   BW Port1[{u}]   MsgRate Port1[Mpps]   BW Port2[{u}]   MsgRate Port2[Mpps]"
)
RESULT_FMT_QOS = (
    " #bytes    #sl      #iterations    BW peak[{u}]    BW average[{u}]   MsgRate[Mpps]"
)
RESULT_FMT_LAT = (
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]"
    "    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
)
RESULT_FMT_LAT_OLD = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]"
RESULT_FMT_LAT_DUR = " #bytes        #iterations       t_avg[usec]    tps average"
RESULT_EXT_CPU_UTIL = "    CPU_Util[%]"

REPORT_FMT = " %-7lu    %-10lu       %-7.2lf            %-7.2lf\t\t     %-7.6lf"
REPORT_FMT_EXT = " %-7lu    %lu           %-7.6lf            %-7.6lf            %-7.6lf"
REPORT_FMT_PER_PORT = (
    " %-7lu    %-10lu     %-7.2lf            %-7.2lf\t\t   %-7.6lf        %-7.2lf"
    "            %-7.6lf              %-7.2lf            %-7.6lf"
)
REPORT_FMT_QOS = (
    " %-7lu    %d           %lu           %-7.2lf            %-7.2lf                  %-7.6lf"
)
REPORT_FMT_LAT = (
    " %-7lu %lu          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t"
    "%-7.2f \t\t%-7.2f"
)
REPORT_FMT_LAT_DUR = " %-7lu       %lu            %-7.2f        %-7.2f"
REPORT_EXT_CPU_UTIL = "\t    %-3.2f"

# bytes per printed unit (perftest's format_factor): 0x100000 for MB/MiB, 125000000 for Gb
FACTOR = {"MiB/sec": 0x100000, "MB/sec": 0x100000, "Gb/sec": 125_000_000}

_VERBS = {"write": "RDMA_Write", "read": "RDMA_Read", "send": "Send", "atomic": "Atomic"}


def cprintf(fmt: str, *args: float) -> str:
    """C printf for the conversions perftest's formats use (``l`` length modifiers)."""
    return (
        re.sub(
            r"%([-0-9.]*)l{0,2}([dufx])", lambda m: f"%{m[1]}{'d' if m[2] == 'u' else m[2]}", fmt
        )
        % args
    )


def banner(
    verb: str,
    tst: str = "BW",
    *,
    bidir: bool = False,
    atomic: str | None = None,
    connection: str = "RC",
    device: str = "mlx5_0",
) -> str:
    """``ctx_print_test_info``: the banner and the first settings lines."""
    words = [_VERBS[verb]] + ([atomic] if atomic else []) + (["Bidirectional"] if bidir else [])
    words += ["BW" if tst == "BW" else "Latency", "Test"]
    return "\n".join(
        [
            RESULT_LINE,
            "                    " + " ".join(words),
            f" Dual-port       : OFF\t\tDevice         : {device}",
            " Number of qps   : 1\t\tTransport type : IB",
            f" Connection type : {connection}\t\tUsing SRQ      : OFF",
            " TX depth        : 128",
            " Mtu             : 4096[B]",
            " Link type       : IB",
            RESULT_LINE,
        ]
    )


def bw_row(size: int, iters: int, peak_bps: float, avg_bps: float, mpps: float, unit: str) -> str:
    """One ``print_full_bw_report`` row: rates in bytes/s, printed in ``unit`` (``%.6lf``
    below 0.1 Gb/s, as perftest's ``inc_accuracy``)."""
    peak, avg = peak_bps / FACTOR[unit], avg_bps / FACTOR[unit]
    fmt = REPORT_FMT_EXT if unit == "Gb/sec" and avg < 0.1 else REPORT_FMT
    return cprintf(fmt, size, iters, peak, avg, mpps)


def bw_run(
    verb: str, rows: list[tuple[int, int, float, float, float]], unit: str, **kw: object
) -> str:
    """A whole bandwidth run: banner, header, rows (``(size, iters, peak B/s, avg B/s,
    Mpps)``) in ``unit``."""
    body = [bw_row(*r, unit=unit) for r in rows]
    return "\n".join([banner(verb, **kw), RESULT_FMT.format(u=unit), *body, RESULT_LINE]) + "\n"  # type: ignore[arg-type]
