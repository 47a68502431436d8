"""The hooks' thin client: ``slurmhealth prolog`` and ``slurmhealth epilog`` ask the node
agent first. Standard library only (measured: ``python -X importtime -m slurmhealth
prolog``): no click, no NVML, no Prometheus client on the happy path.

:func:`hook_main` exits with the agent's answer (``os._exit``, once its lines are out), or
returns (after one loud warning line) when the hook must run in-process instead: no agent
socket, a socket or peer not root's, no acknowledgement within
:data:`~slurmhealth.agent.protocol.ACK_BOUND_S`, another protocol version, the connection
lost (the agent killed mid-decision), or no answer by the deadline the agent gave. The
in-process hook then keeps its budget from the wrapper's start, so the fallback decides
within the same prolog budget.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import sys
import time
from collections.abc import Mapping
from typing import Any

from slurmhealth.agent import protocol
from slurmhealth.hooks.wrapper_log import WrapperLog, child_env

MAX_WAIT_S = 7.0  # never past the prolog wrapper's default 8 s, whatever the agent says
DEFAULT_RUN_DIR = "/run/slurmhealth"
DEFAULT_CONFIG = "/etc/slurmhealth/config.toml"


class Unavailable(Exception):
    """Why the agent was not used (the in-process hook runs instead)."""


def _node(env: Mapping[str, str]) -> str:
    return env.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def run_dir(env: Mapping[str, str]) -> str:
    """The node's run dir as the hooks' config says (``SLURMHEALTH_RUN_DIR``, else the
    config file's ``[paths] run_dir``), read with tomllib only."""
    template = env.get("SLURMHEALTH_RUN_DIR", "")
    node = ""
    if not template:
        import tomllib

        try:
            with open(env.get("SLURMHEALTH_CONFIG") or DEFAULT_CONFIG, "rb") as fh:
                data = tomllib.load(fh)
        except (OSError, ValueError):
            data = {}
        paths, node_sec = data.get("paths"), data.get("node")
        template = paths.get("run_dir", "") if isinstance(paths, dict) else ""
        node = node_sec.get("name", "") if isinstance(node_sec, dict) else ""
        template = template if isinstance(template, str) else ""
    node = node if isinstance(node, str) and node else _node(env)
    return (template or DEFAULT_RUN_DIR).replace("{node}", node)


def _connect(path: str) -> socket.socket:
    """A connection to the agent at ``path``, after checking that root (or we) own it."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise Unavailable(f"no agent socket at {path}") from None
    except OSError as exc:
        raise Unavailable(f"{path}: {exc}") from None
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid not in (0, os.geteuid()):
        raise Unavailable(f"{path} is not a socket of root's")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(protocol.ACK_BOUND_S)
    try:
        sock.connect(path)
        if protocol.peer_uid(sock) not in (0, os.geteuid()):
            raise Unavailable(f"the process behind {path} is not root's")
    except OSError as exc:
        sock.close()
        raise Unavailable(f"{path}: {exc.strerror or exc}") from None
    except Unavailable:
        sock.close()
        raise
    return sock


def ask(path: str, op: str, env: Mapping[str, str]) -> dict[str, Any]:
    """The agent's answer to hook ``op`` with ``env``; raises :class:`Unavailable`."""
    t0 = time.monotonic()
    sock = _connect(path)
    try:
        reader = protocol.LineReader(sock)
        request = {"op": op, "env": protocol.hook_env(env),
                   "start_by": time.time() + protocol.ACK_BOUND_S}  # fmt: skip
        try:
            protocol.send(sock, request)
            ack = reader.read(t0 + protocol.ACK_BOUND_S)
            if not ack.get("ack"):
                raise Unavailable(f"the agent refused: {ack.get('error', 'no reason')}")
            wait = min(MAX_WAIT_S, float(ack.get("answer_within_s", MAX_WAIT_S)))
            answer = reader.read(time.monotonic() + wait)
        except protocol.ProtocolError as exc:
            raise Unavailable(f"agent: {exc}") from None
        except (OSError, TypeError, ValueError) as exc:
            raise Unavailable(f"agent: {exc}") from None
    finally:
        sock.close()
    if answer.get("exit_code") not in (0, 1) or "error" in answer:
        raise Unavailable(f"the agent could not decide: {answer.get('error', 'no exit code')}")
    return answer


def hook_main(op: str, env: Mapping[str, str] | None = None) -> WrapperLog:
    """Exit with the agent's decision for hook ``op``; return to fall back (loudly), with
    the lines the in-process hook is to write with its own (:mod:`hooks.wrapper_log`)."""
    env = os.environ if env is None else env
    lines = WrapperLog(env)
    if env.get("SLURMHEALTH_AGENT", "") == "off":
        return lines
    try:
        answer = ask(protocol.socket_path(run_dir(env)), op, env)
    except Unavailable as exc:
        who = f"job={env.get('SLURM_JOB_ID', '?')} node={_node(env)}"
        _line(lines, f"slurmhealth {op}[{who}]: WARNING: node agent not used ({exc}); "
                     "checking in-process")  # fmt: skip
        return lines
    for line in answer.get("log") or ():
        _line(lines, str(line))
    if op == "prolog" and answer["exit_code"] == 0 and isinstance(answer.get("sidecar"), dict):
        start_sidecar(answer["sidecar"], env, lines)
    sys.stdout.flush()
    sys.stderr.flush()
    lines.done()
    os._exit(int(answer["exit_code"]))  # decided: no interpreter tear-down on the job's path


def _line(lines: WrapperLog, text: str) -> None:
    sys.stderr.write(f"{text}\n")
    lines.add(text)


def start_sidecar(
    launch: Mapping[str, Any], env: Mapping[str, str], lines: WrapperLog
) -> int | None:
    """Start the job's sidecar as the agent described it (``cmd``, ``env``, ``pid_file``),
    detached in its own session like the in-process prolog does; its pid, or None."""
    import subprocess

    try:
        cmd = [str(a) for a in launch["cmd"]]
        extra = {str(k): str(v) for k, v in dict(launch["env"]).items()}
        pid_file, job_id = str(launch["pid_file"]), str(launch["job_id"])
        log_path = env.get("SLURMHEALTH_LOG_FILE") or os.devnull
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    start_new_session=True, close_fds=True, cwd="/",
                                    env={**child_env(env), **extra})  # fmt: skip
    except (OSError, KeyError, TypeError, ValueError) as exc:
        _line(lines, f"slurmhealth prolog: WARNING: sidecar not started: {exc}")
        return None
    try:  # before the job can end: the epilog reads it
        tmp = f"{pid_file}.tmp.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"{proc.pid}\n")
        os.replace(tmp, pid_file)
    except OSError as exc:
        _line(lines, f"slurmhealth prolog: WARNING: sidecar pid file not written: {exc}")
    deadline = time.monotonic() + 1.0  # until its command line shows (the epilog's test)
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with open(f"/proc/{proc.pid}/cmdline", "rb") as fh:
                if job_id.encode() in fh.read().split(b"\0"):
                    break
        except OSError:
            break
        time.sleep(0.001)
    if os.getpriority(os.PRIO_PROCESS, 0) < 0:  # beside the job, not ahead of it
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, proc.pid, 0)
    return proc.pid
