"""The kernel log: GPU faults (Xids and the patterns without one) read from a cursor.

:mod:`.parse` splits lines (every time-prefix form) and parses Xid lines, :mod:`.patterns`
finds the faults that come without an Xid, :mod:`.sources` reads ``/dev/kmsg``,
``journalctl -k``, ``dmesg`` or a file from a stored cursor.
"""

from slurmhealth.kernel_log.parse import (
    LogLine,
    format_kmsg_record,
    parse_line,
    parse_xid,
    split_line,
)
from slurmhealth.kernel_log.patterns import EventJoiner, parse_event, parse_events
from slurmhealth.kernel_log.sources import KernelLogReader, ReadResult

__all__ = [
    "EventJoiner",
    "KernelLogReader",
    "LogLine",
    "ReadResult",
    "format_kmsg_record",
    "parse_event",
    "parse_events",
    "parse_line",
    "parse_xid",
    "split_line",
]
