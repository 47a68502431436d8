"""The kernel log: GPU faults (Xids and the patterns without one) read from a cursor.

:mod:`.parse` splits lines (every time-prefix form) and parses Xid lines, :mod:`.patterns`
finds the faults that come without an Xid (imported only when a line might be one),
:mod:`.sources` reads ``/dev/kmsg``, ``journalctl -k``, ``dmesg`` or a file from a cursor.
"""

from slurmhealth.kernel_log.parse import (
    LogLine,
    format_kmsg_record,
    parse_line,
    parse_xid,
    split_line,
)
from slurmhealth.kernel_log.sources import KernelLogReader, ReadResult

__all__ = [
    "KernelLogReader",
    "LogLine",
    "ReadResult",
    "format_kmsg_record",
    "parse_line",
    "parse_xid",
    "split_line",
]
