"""Durations and points in time as operators type them (model layer: no I/O): the one
duration grammar, timeout(1)'s (a number, a fraction allowed, then ``s``, ``m``, ``h`` or
``d``; a bare number is seconds), for the CLI's options and the hook wrappers' timeouts
(``config.ranges.wrapper_timeout``) alike.

Both return ``None`` for text they cannot read; the caller names the option in its error.
"""

from __future__ import annotations

import re

_DURATION = re.compile(r"([0-9]+(?:\.[0-9]*)?)\s*([smhd]?)")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(text: str) -> float | None:
    """Seconds in ``600``, ``90s``, ``10m``, ``2h``, ``1.5d`` (a bare number is seconds)."""
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        return None
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def since_ts(text: str, now: float) -> float | None:
    """UTC seconds of an ISO date/time (UTC when it names no zone), else of a duration ago."""
    from datetime import UTC, datetime

    try:
        dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        ago = duration_s(text)
        return None if ago is None else now - ago
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()
