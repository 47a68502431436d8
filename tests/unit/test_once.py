"""A message once per run, its repeats counted: a process that runs the check 30 times on
30 fresh histories (as a benchmark does) says "kernel-log position rebuilt" once on stderr,
then "(x30)" at the end, and never again as a note under the answer."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from slurmhealth.cli import once

RUNS = 30
SCRIPT = """
import os, sys
from slurmhealth.cli import main
for i in range(%d):
    os.environ["SLURMHEALTH_DB"] = os.path.join(sys.argv[1], f"history{i}.db")
    try:
        main(["check"])
    except SystemExit:
        pass
"""


def test_many_identical_warnings_print_once_with_a_count(
    sim_env: Callable[..., dict[str, str]], tmp_path: Path
) -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT % RUNS, str(tmp_path)], env=sim_env(),
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rebuilt = [line for line in proc.stderr.splitlines() if "kernel-log position rebuilt" in line]
    assert len(rebuilt) == 2, proc.stderr  # the first, and the count at the end
    assert rebuilt[0].startswith("slurmhealth: WARNING: kernel-log position rebuilt")
    assert rebuilt[1].endswith(f"not acted on (x{RUNS})"), rebuilt[1]
    assert proc.stdout.count("OK on 8 GPUs, all passed") == RUNS
    assert "note:" not in proc.stdout  # stderr said it: not a second time under the answer


def test_flush_counts_through_the_same_handler() -> None:
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Keep()
    logger = logging.getLogger("slurmhealth.test_once")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        once.install(handler)
        for _ in range(5):
            logger.warning("disk %s full", "/var")
        logger.warning("another")
        assert lines == ["disk /var full", "another"] and once.shown("disk /var full")
        once.flush()
        assert lines[2:] == ["disk /var full (x5)"]
    finally:
        logger.removeHandler(handler)
        once.reset()
