"""The agent's wire protocol: one JSON object per line over a Unix stream socket, standard
library only (the thin client imports it before every job).

A request: ``{"v": 1, "op": "prolog" | "epilog" | "ping", "env": {...},
"start_by": UTC seconds}``. The agent answers at once ``{"v": 1, "ack": true}`` (or an
``error``), then, for a hook, ``{"v": 1, "exit_code": 0|1, "status": ..., "log": [...]}``.
``v`` is the sender's protocol version: a peer ignores fields it does not know; an agent
that gets a ``v`` newer than its own answers ``{"error": "version"}`` and the client falls
back to the in-process hook, so an old prolog with a new agent, or the reverse, keeps
working during an upgrade. A request whose ``start_by`` has passed when the agent reads it
is refused: its client has already fallen back.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

VERSION = 1
SOCKET_NAME = "agent.sock"
MAX_MESSAGE = 1 << 20  # one request or answer (the env of a job, the hook's log lines)
ACK_BOUND_S = 0.5  # the client falls back when the agent has not acknowledged by then
OPS = ("ping", "prolog", "epilog")
# what the hooks read from their environment (Slurm's and ours): the rest stays home
ENV_PREFIXES = ("SLURM_", "SLURMD_", "SLURMHEALTH_PROLOG_", "SLURMHEALTH_EPILOG_")


class ProtocolError(Exception):
    """A peer that broke the protocol (closed early, sent garbage, took too long)."""


def socket_path(run_dir: str) -> str:
    return os.path.join(run_dir, SOCKET_NAME)


def hook_env(environ: Any) -> dict[str, str]:
    """The part of a hook's environment the agent needs."""
    return {k: v for k, v in environ.items() if k.startswith(ENV_PREFIXES)}


def encode(message: dict[str, Any]) -> bytes:
    """One line; ``ensure_ascii`` carries what an environment held as invalid UTF-8
    (surrogate escapes) through unchanged."""
    return json.dumps({"v": VERSION, **message}, ensure_ascii=True).encode() + b"\n"


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(encode(message))


class LineReader:
    """Reads newline-ended JSON objects from ``sock``, each within a deadline."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def read(self, deadline: float) -> dict[str, Any]:
        """The next object; raises :class:`ProtocolError` at the deadline (monotonic), on
        EOF, on a line over :data:`MAX_MESSAGE` or one that is not a JSON object."""
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProtocolError("no answer in time")
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                raise ProtocolError("no answer in time") from None
            except OSError as exc:
                raise ProtocolError(f"connection lost: {exc}") from None
            if not chunk:
                raise ProtocolError("connection closed")
            self.buf += chunk
            if len(self.buf) > MAX_MESSAGE:
                raise ProtocolError("message too long")
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            msg = json.loads(line)
        except ValueError:
            raise ProtocolError("not JSON") from None
        if not isinstance(msg, dict):
            raise ProtocolError("not a JSON object")
        return msg


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end (SO_PEERCRED: pid, uid, gid)."""
    import struct

    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])
