"""Each message once per run: a log handler's filter that lets the first of a kind through,
counts the repeats and says how many there were at the end (``... (x200)``).

A run is one process: one command, or a benchmark that runs the hooks 200 times in-process.
The filter also remembers what stderr already carried, so a command's output does not print
the same text again as a note (:func:`shown`).
"""

from __future__ import annotations

import atexit
import logging
from collections import Counter
from collections.abc import Iterable

_SEEN: Counter[tuple[int, str, str]] = Counter()  # (level, logger, message) -> times logged
_SHOWN: set[str] = set()  # messages a handler printed this run
_INSTALLED: list[tuple[logging.Handler, OncePerRun]] = []


class OncePerRun(logging.Filter):
    """Passes a record the first time its (level, logger, message) is seen; counts the rest."""

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.levelno, record.name, record.getMessage())
        _SEEN[key] += 1
        if _SEEN[key] > 1:
            return False
        _SHOWN.add(key[2])
        return True


def install(handler: logging.Handler) -> None:
    """Add the filter to ``handler``; the repeats' counts are written through it at exit
    (or at :func:`flush`)."""
    if any(h is handler for h, _f in _INSTALLED):
        return
    flt = OncePerRun()
    handler.addFilter(flt)
    if not _INSTALLED:
        atexit.register(flush)
    _INSTALLED.append((handler, flt))


def install_on_root(skip: Iterable[logging.Handler] = ()) -> None:
    """:func:`install` on every handler of the root logger (``logging.basicConfig``'s) but
    those in ``skip`` (a host program's, e.g. pytest's capture)."""
    theirs = list(skip)
    for handler in logging.getLogger().handlers:
        if not any(handler is h for h in theirs):
            install(handler)


def shown(message: str) -> bool:
    """Whether a log handler already printed ``message`` in this run."""
    return message in _SHOWN


def flush() -> None:
    """One line per message logged more than once: the message and ``(xN)``, N in all."""
    repeats = [(key, n) for key, n in _SEEN.items() if n > 1]
    _SEEN.clear()
    for (level, name, message), n in repeats:
        record = logging.LogRecord(name, level, __file__, 0, "%s (x%d)", (message, n), None)
        for handler, flt in _INSTALLED:
            handler.removeFilter(flt)
            try:
                if record.levelno >= handler.level:
                    handler.handle(record)
            finally:
                handler.addFilter(flt)


def reset() -> None:
    """Forget every message and handler (a test's run of its own)."""
    for handler, flt in _INSTALLED:
        handler.removeFilter(flt)
    _INSTALLED.clear()
    _SEEN.clear()
    _SHOWN.clear()
