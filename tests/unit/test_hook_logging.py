"""The sidecar's log: UTC timestamps in its file (SLURMHEALTH_LOG_FILE, where the prolog
points its stderr) and every line in syslog too, with the job and the node."""

from __future__ import annotations

import io
import logging
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmhealth.hooks import entry as hooks


@pytest.fixture
def stderr() -> Iterator[io.StringIO]:
    """The root logger's stderr handler, as ``slurmhealth``'s main sets it up."""
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    out = io.StringIO()
    stream = logging.StreamHandler(out)
    root.handlers[:] = [stream]
    try:
        yield out
    finally:
        for h in root.handlers:
            if h not in handlers and h is not stream:
                h.close()
        root.setLevel(level)
        root.handlers[:] = handlers


@pytest.fixture
def syslog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A syslog socket of our own (``/dev/log`` stands for it)."""
    path = tmp_path / "log"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2)
    monkeypatch.setattr(hooks, "SYSLOG_SOCKET", str(path))
    yield sock
    sock.close()


def test_sidecar_lines_carry_a_utc_time_and_reach_syslog(
    stderr: io.StringIO, syslog: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    hooks.hook_logging("sidecar", node="n7")
    logging.getLogger("slurmhealth.sidecar").warning("GPU 3 Xid 79")
    line = stderr.getvalue()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ slurmhealth sidecar\[job=4242 "
                        r"node=n7\]: WARNING: GPU 3 Xid 79\n", line), line  # fmt: skip
    sent = syslog.recv(4096).decode()
    # <facility daemon (3) * 8 + warning (4)>, the identifier the wrappers' logger uses
    assert sent.startswith("<28>slurmhealth: slurmhealth-sidecar[job=4242 node=n7]: WARNING: ")
    assert sent.rstrip("\x00").endswith("GPU 3 Xid 79")


def test_hook_lines_have_no_time_of_their_own_and_no_second_syslog(
    stderr: io.StringIO, syslog: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prolog's stderr goes through its wrapper, which stamps it and sends it to syslog."""
    monkeypatch.setenv("SLURM_JOB_ID", "17")
    hooks.hook_logging("prolog", node="n1")
    logging.getLogger("slurmhealth.hooks").info("ok")
    assert stderr.getvalue() == "slurmhealth prolog[job=17 node=n1]: INFO: ok\n"
    syslog.settimeout(0.2)
    with pytest.raises(TimeoutError):
        syslog.recv(4096)
