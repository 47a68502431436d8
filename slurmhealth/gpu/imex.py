"""NVIDIA IMEX (Internode Memory Exchange), which multi-node NVLink jobs on GB200 NVL72 need:
the ``nvidia-imex`` daemon running on the node, and IMEX channels as character devices in
``/dev/nvidia-caps-imex-channels`` (``channel0``, ...; what ``nvidia-imex-ctl -N`` and the
jobs' CUDA use). Read only where the job's partition needs it (``[gpu] imex_partitions``).
"""

from __future__ import annotations

import os
import stat

from slurmhealth.model import ImexState

DAEMON = "nvidia-imex"
MAX_ENTRIES = 4096  # a directory or /proc larger than this is read this far


def read_imex(channel_dir: str, proc: str = "/proc") -> ImexState:
    """Whether the daemon runs (``/proc/PID/comm``) and which channels exist (never
    following a symlink); an unreadable /proc is unknown, never "not running"."""
    return ImexState(
        daemon_running=_daemon(proc), channels=_channels(channel_dir), channel_dir=channel_dir
    )


def _daemon(proc: str) -> bool | None:
    try:
        entries = [e for e in os.listdir(proc) if e.isdigit()][: MAX_ENTRIES * 16]
    except OSError:
        return None
    for entry in entries:
        try:
            with open(os.path.join(proc, entry, "comm"), "rb") as fh:
                if fh.read(64).strip() == DAEMON.encode():
                    return True
        except OSError:
            continue  # gone, or not ours to read
    return False


def _channels(channel_dir: str) -> tuple[str, ...]:
    try:
        names = sorted(os.listdir(channel_dir))[:MAX_ENTRIES]
    except OSError:
        return ()  # no channel directory: no channel
    out = []
    for name in names:
        try:
            st = os.lstat(os.path.join(channel_dir, name))
        except OSError:
            continue
        if name.startswith("channel") and stat.S_ISCHR(st.st_mode):
            out.append(name)
    return tuple(out)
