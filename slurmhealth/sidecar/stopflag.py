"""A stop request that a signal handler may make.

``threading.Event.set()`` from a signal handler can deadlock: the handler runs in the main
thread between two bytecodes, and if that thread is inside ``Event.wait()`` re-taking the
Event's lock after its timeout (a stopped-then-continued process, SIGCONT and SIGTERM
together, hits exactly that), ``set()`` waits for a lock its own thread holds, forever. The
epilog then SIGKILLs the sidecar and its final flush is lost. :class:`StopFlag` takes no
lock: ``set()`` stores a flag and writes one byte to a pipe; ``wait()`` selects on it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal


class StopFlag:
    """``set``/``is_set``/``wait`` like ``threading.Event``, safe to ``set`` from a signal
    handler and from any thread; ``close`` frees its pipe."""

    def __init__(self) -> None:
        self._flag = False
        self._r, self._w = os.pipe()
        for fd in (self._r, self._w):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)

    def set(self) -> None:
        self._flag = True
        with contextlib.suppress(OSError):  # full (already woken) or closed: the flag stays
            os.write(self._w, b"x")

    def is_set(self) -> bool:
        return self._flag

    def wait(self, timeout: float | None = None) -> bool:
        """Until set or ``timeout`` seconds; whether it is set."""
        if not self._flag:
            with contextlib.suppress(OSError, ValueError):  # closed: behave as a sleep-less check
                select.select([self._r], [], [], timeout)
        return self._flag

    def on_signals(self, *signums: signal.Signals) -> None:
        """Set on each of ``signums`` (main thread only, as ``signal.signal`` requires)."""
        for signum in signums:
            signal.signal(signum, lambda *_: self.set())

    def close(self) -> None:
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._r = self._w = -1

    def __enter__(self) -> StopFlag:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
