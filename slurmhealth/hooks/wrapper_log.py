"""The prolog's and epilog's log lines, written to syslog and the wrappers' log file by the
hook itself instead of by its wrapper. Standard library only: the agent's thin client uses
it too.

The wrappers (``slurmhealth-prolog``, ``slurmhealth-epilog``) used to pass the hook's stderr
on after every run: ``logger -t slurmhealth -f`` for syslog, then ``date`` and ``awk`` to
stamp each line into ``SLURMHEALTH_LOG_FILE``: three or four processes on every job start
and end. Now the wrapper names itself in ``SLURMHEALTH_LOG_TAG``; a hook that sees it keeps
its lines (:meth:`WrapperLog.add`), writes them the wrapper's way when it has decided
(:meth:`WrapperLog.done`: the same stamp, tag and ``|``, syslog identifier ``slurmhealth``)
and then reports the stage ``logged`` on the wrapper's stage fd. A hook that never gets
there (killed at the timeout, crashed, an older release during an upgrade) reports no such
stage, and the wrapper passes its stderr on as before: each line is logged once, by one of
the two.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import time
from collections.abc import Mapping
from typing import Any, TextIO

TAG_ENV = "SLURMHEALTH_LOG_TAG"  # the wrapper's tag: "slurmhealth-prolog[job=.. node=..]"
STAGE_FD_ENV = "SLURMHEALTH_STAGE_FD"  # where the wrapper reads the stage we are in
LOG_FILE_ENV = "SLURMHEALTH_LOG_FILE"
LOGGED = "logged"  # the last stage of a hook that wrote its own lines
SYSLOG_SOCKET = "/dev/log"
_USER = 1  # syslog facility "user", as logger(1) uses by default
_SEVERITY = {"ERROR": 3, "CRITICAL": 2, "WARNING": 4, "INFO": 6, "DEBUG": 7}
_NOTICE = 5
_MAX_LINE = 4096
_MAX_LINES = 200


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without the wrapper's channels to this process (its stage fd, its tag): a
    sidecar or after-work started from a hook must not write into the wrapper's files."""
    return {k: v for k, v in env.items() if k not in (TAG_ENV, STAGE_FD_ENV)}


def _severity(line: str) -> int:
    for word, level in _SEVERITY.items():
        if f": {word}: " in line:
            return level
    return _NOTICE


class WrapperLog:
    """The hook's lines for syslog and the wrappers' log file (inactive, and keeping
    nothing, when no wrapper asked: ``SLURMHEALTH_LOG_TAG`` unset)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.tag = env.get(TAG_ENV, "")
        self.path = env.get(LOG_FILE_ENV, "")
        fd_text = env.get(STAGE_FD_ENV, "")
        self.stage_fd = int(fd_text) if fd_text.isdigit() else None
        self.lines: list[tuple[float, str]] = []

    @property
    def active(self) -> bool:
        return bool(self.tag) and self.stage_fd is not None

    def add(self, line: str) -> None:
        if self.active and len(self.lines) < _MAX_LINES:
            self.lines.append((time.time(), line.rstrip("\n")[:_MAX_LINE]))

    def tee(self, stream: TextIO) -> TextIO:
        """``stream`` (stderr) writing each whole line to these lines as well."""
        return _Tee(stream, self)  # type: ignore[return-value]

    def done(self) -> None:
        """Write the lines kept, then report the stage ``logged`` (never raises)."""
        if not self.active or not self._stage_fd_is_a_file():
            return
        self._to_file()
        self._to_syslog()
        with contextlib.suppress(OSError):
            os.write(self.stage_fd, f"{LOGGED} 0.00\n".encode())  # type: ignore[arg-type]
        self.lines = []

    def _stage_fd_is_a_file(self) -> bool:
        """The wrapper's stage fd is a regular file it opened for us (not some descriptor
        of ours that happens to have that number)."""
        try:
            mode = os.fstat(self.stage_fd).st_mode  # type: ignore[arg-type]
        except OSError:
            return False
        return stat.S_ISREG(mode) and os.get_inheritable(self.stage_fd)  # type: ignore[arg-type]

    def _to_file(self) -> None:
        if not self.path or not self.lines:
            return
        text = "".join(
            f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(ts))} {self.tag}: | {line}\n"
            for ts, line in self.lines
        )
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        with contextlib.suppress(OSError):
            fd = os.open(self.path, flags, 0o644)
            try:
                os.write(fd, text.encode(errors="replace"))
            finally:
                os.close(fd)

    def _to_syslog(self) -> None:
        if not self.lines or not os.path.exists(SYSLOG_SOCKET):
            return
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.connect(SYSLOG_SOCKET)
            for _ts, line in self.lines:
                pri = _USER * 8 + _severity(line)
                s.send(f"<{pri}>slurmhealth: {line}".encode(errors="replace"))


class _Tee:
    def __init__(self, stream: TextIO, lines: WrapperLog) -> None:
        self._stream, self._lines, self._part = stream, lines, ""

    def write(self, text: str) -> int:
        *whole, self._part = (self._part + text).split("\n")
        for line in whole:
            self._lines.add(line)
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
