"""The stop request of the sidecar and the exporter: set from a signal handler without a
lock (``threading.Event.set`` there deadlocked a SIGCONT+SIGTERM'd sidecar in CI)."""

from __future__ import annotations

import signal
import threading
import time

from slurmhealth.sidecar.stopflag import StopFlag


def test_a_signal_wakes_a_long_wait_at_once() -> None:
    with StopFlag() as flag:
        flag.on_signals(signal.SIGALRM)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            t0 = time.monotonic()
            assert flag.wait(60) is True
            assert time.monotonic() - t0 < 30  # woken, not timed out
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)


def test_another_thread_wakes_it_and_it_stays_set() -> None:
    with StopFlag() as flag:
        assert flag.wait(0.01) is False and not flag.is_set()
        threading.Timer(0.1, flag.set).start()
        assert flag.wait(60) is True
        assert flag.wait(60) is True and flag.is_set()  # no second wait


def test_set_never_blocks_however_often_it_is_called() -> None:
    with StopFlag() as flag:
        for _ in range(100_000):  # far more than a pipe buffer holds
            flag.set()
        assert flag.is_set()


def test_a_closed_flag_still_answers() -> None:
    flag = StopFlag()
    flag.close()
    flag.set()
    assert flag.wait(0.01) is True
