"""The one reader for files a job's user could have touched (slurmhealth/access/safe_read.py), and
a grep of the package that keeps every other read of such a path going through it."""

from __future__ import annotations

import ast
import os
import threading
from pathlib import Path

import pytest

from slurmhealth.access import safe_read

PACKAGE = Path(__file__).resolve().parents[2] / "slurmhealth"

# every builtin open() in the package, by module: how many, and why root may use it there
# (a path no job's user can write: root's own folders, /proc, sysfs, the caller's own
# files). A new one must go through safe_read (or user_open) or be added here with a reason.
PLAIN_OPEN_ALLOWED: dict[str, tuple[int, str]] = {
    "sidecar/procs.py": (2, "/proc/PID/environ and cmdline: the kernel's files"),
    "config/__init__.py": (
        1,
        "the config file: root's system config, or a user's own as that user",
    ),
    "metrics/export_state.py": (2, "/proc cmdline; pid files in the root-owned run dir"),
    "report/incidents.py": (2, "incident files root writes in its own root-owned folder"),
    "cli/report.py": (1, "the output file the caller names, written with the caller's rights"),
    "cli/baseline.py": (1, "a benchmark output the caller names, read with the caller's rights"),
    "cli/app.py": (1, "os.devnull"),
    "gpu/replay.py": (2, "the simulator's replay files (tests and demos)"),
    "gpu/sim.py": (4, "the simulator's scenario state and kernel log, /proc/uptime"),
    "gpu/recording.py": (1, "a recording the admin asked for"),
    "gpu/scenario.py": (1, "a scenario file the admin names"),
    "job.py": (1, "the client library: runs in the job, as the job's user"),
    "rdma/sysfs.py": (1, "sysfs (the kernel's files)"),
    "rdma/simtree.py": (2, "the simulator's generated sysfs trees"),
    "sidecar/presence.py": (1, "/proc cmdline"),
    "sidecar/lifecycle.py": (4, "root's log file; /proc; pid and mapping files in root's dirs"),
    "evidence/registry.py": (1, "/proc/uptime, /proc/loadavg, /proc/driver/nvidia/version"),
    "evidence/kernel.py": (2, "/proc/uptime; an fd already opened"),
    "kernel_log/sources.py": (2, "the kernel log files root's config names"),
    "metrics/web_config.py": (1, "the exporter's web-config file root's config names"),
    "gpu/imex.py": (1, "/proc/PID/comm (the kernel's files)"),
    "agent/client.py": (3, "the hook's config (root's), root's log file, /proc/PID/cmdline"),
    "hooks/finish.py": (3, "root's log file; journal entries in the root-only (0700) run dir"),
    "checks/packaged.py": (1, "the tables shipped in the package's own (root's) folder"),
    "gpu/sim_lifetime.py": (2, "the simulator's own reset/reboot record beside its kernel log"),
}
# where the files a job's user can touch are read: no builtin open() at all
USER_FACING = ("report/sources.py", "report/build.py", "evidence/summary.py",
               "evidence/bundle.py", "evidence/sources.py", "access/trust.py", "sidecar/task.py",
               "sidecar/files.py")  # fmt: skip


def _plain_opens(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(), str(path))
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name) and node.func.id == "open"]  # fmt: skip


def test_no_plain_open_where_a_users_file_may_be_read() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = _plain_opens(path)
        if lines:
            found[str(path.relative_to(PACKAGE))] = lines
    for module in USER_FACING:
        assert module not in found, (
            f"{module}:{found.get(module)}: use slurmhealth.access.safe_read"
        )
    unexpected = {m: lines for m, lines in found.items()
                  if len(lines) > PLAIN_OPEN_ALLOWED.get(m, (0, ""))[0]}  # fmt: skip
    assert not unexpected, (
        f"plain open() at {unexpected}: read a path a job's user may touch with "
        "slurmhealth.access.safe_read (or user_open), or list it in PLAIN_OPEN_ALLOWED with why"
    )


def test_reads_a_regular_file_whole_or_its_tail(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    assert safe_read.read_bytes(str(path), 10) == b"0123456789"
    assert safe_read.read_bytes(str(path), 4, tail=True) == b"6789"
    with pytest.raises(safe_read.Unsafe, match="over the 4-byte limit"):
        safe_read.read_bytes(str(path), 4)


def test_a_symlink_to_dev_zero_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "summary.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(safe_read.Unsafe, match=r"cannot open .*symbolic links"):
        safe_read.read_json(str(link), safe_read.SUMMARY_MAX)
    with pytest.raises(safe_read.Unsafe, match="is not a regular file"):
        safe_read.read_bytes("/dev/zero", 1 << 30)  # a device named directly


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "summary.json"
    os.mkfifo(fifo)
    done = threading.Event()
    errors: list[str] = []

    def read() -> None:
        try:
            safe_read.read_json(str(fifo), 1024)
        except safe_read.Unsafe as exc:
            errors.append(str(exc))
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(10.0), "the read blocked on the FIFO"
    assert errors == [f"{fifo} is not a regular file"]


def test_owner_and_hard_links_are_checked_on_the_open_file(tmp_path: Path) -> None:
    path = tmp_path / "a"
    path.write_text("{}")
    os.link(path, tmp_path / "b")
    with pytest.raises(safe_read.Unsafe, match="2 hard links"):
        safe_read.read_bytes(str(path), 10, single_link=True)
    with pytest.raises(safe_read.Unsafe, match=f"not uid {os.geteuid() + 1}"):
        safe_read.read_bytes(str(path), 10, uid=os.geteuid() + 1)


def test_a_parse_error_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text("{\n  not json at all\n" + "[" * 100_000)
    with pytest.raises(safe_read.Unsafe) as exc:
        safe_read.read_json(str(path), 1 << 20)
    assert "\n" not in str(exc.value) and str(exc.value).startswith(f"{path}: not JSON")
    notes: list[str] = []
    assert safe_read.read_json_or_none(str(path), 1 << 20, notes) is None and len(notes) == 1
