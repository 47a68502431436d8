"""prolog/slurmhealth-prolog, the shell wrapper slurmd runs, over a stand-in slurmhealth:
it passes its timeout and start time down, reads the stage slurmhealth reports, and on a
timeout says how far slurmhealth got before failing open."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

WRAPPER = Path(__file__).resolve().parents[2] / "prolog" / "slurmhealth-prolog"


def _wrapper(
    tmp_path: Path, body: str, timeout_s: str = "1", hook: str = "prolog"
) -> tuple[int, str]:
    fake = tmp_path / "slurmhealth"
    fake.write_text(f"#!/bin/sh\n{body}\n")
    fake.chmod(0o755)
    log = tmp_path / "wrapper.log"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "SLURMHEALTH_ENV_FILE": str(tmp_path / "absent"),
        "SLURMHEALTH_BIN": str(fake),
        "SLURMHEALTH_PROLOG_TIMEOUT": timeout_s,
        "SLURMHEALTH_EPILOG_TIMEOUT": timeout_s,
        "SLURMHEALTH_LOG_FILE": str(log),
        "SLURM_JOB_ID": "77",
        "SLURMD_NODENAME": "n1",
        "TMPDIR": str(tmp_path),
    }
    wrapper = WRAPPER.parents[1] / hook / f"slurmhealth-{hook}"
    proc = subprocess.run([str(wrapper)], env=env, capture_output=True, text=True, timeout=30)
    return proc.returncode, log.read_text() if log.exists() else ""


def test_a_timeout_names_the_stage_slurmhealth_was_in(tmp_path: Path) -> None:
    body = 'echo "job facts 0.10" >&3; echo "gpu snapshot 0.31" >&3; exec sleep 30'
    t0 = time.monotonic()
    rc, log = _wrapper(tmp_path, body)
    assert rc == 0 and time.monotonic() - t0 < 10  # fails open, after the 1 s timeout
    assert "timed out after 1s in stage 'gpu snapshot' (entered at 0.31 s); failing open" in log
    assert list(tmp_path.glob("slurmhealth-prolog.*")) == []  # its temporary files are gone


def test_a_timeout_before_any_stage_says_so(tmp_path: Path) -> None:
    rc, log = _wrapper(tmp_path, "exec sleep 30")
    assert rc == 0 and "before slurmhealth reported a stage" in log


def test_slurmhealth_gets_the_wrapper_timeout_and_its_start_time(tmp_path: Path) -> None:
    out = tmp_path / "seen"
    body = f'echo "$SLURMHEALTH_PROLOG_TIMEOUT $SLURMHEALTH_PROLOG_STARTED" > {out}; exit 1'
    before = time.time()
    rc, log = _wrapper(tmp_path, body, timeout_s="6")
    assert rc == 1 and "node unhealthy" in log  # exit 1 passes through: the job is requeued
    timeout, started = out.read_text().split()
    assert timeout == "6" and before - 1 <= float(started) <= time.time()


STAMPED = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ slurmhealth-HOOK\[job=77 node=n1\]: \| "


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_a_hook_that_logged_its_lines_itself_is_not_logged_again(tmp_path: Path, hook: str) -> None:
    # what slurmhealth does when the wrapper names itself: its lines, stamped, then "logged"
    body = (f'[ "$SLURMHEALTH_LOG_TAG" = "slurmhealth-{hook}[job=77 node=n1]" ] || exit 5\n'
            'echo "2026-01-01T00:00:00Z $SLURMHEALTH_LOG_TAG: | one: INFO: ok" '
            '>>"$SLURMHEALTH_LOG_FILE"\n'
            'echo "one: INFO: ok" >&2; echo "logged 0.00" >&3; exit 0')  # fmt: skip
    rc, log = _wrapper(tmp_path, body, hook=hook)
    assert rc == 0
    assert log.count("one: INFO: ok") == 1, log
    assert list(tmp_path.glob(f"slurmhealth-{hook}.*")) == []


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
@pytest.mark.parametrize(
    "body",
    ['echo "one: INFO: ok" >&2; exit 0',  # an older release: no "logged" stage
     'echo "one: INFO: ok" >&2; echo "gpu snapshot 0.20" >&3; exec sleep 30'],  # killed
)  # fmt: skip
def test_a_hook_that_did_not_log_gets_its_stderr_logged_by_the_wrapper(
    tmp_path: Path, body: str, hook: str
) -> None:
    rc, log = _wrapper(tmp_path, body, hook=hook)
    assert rc == 0
    assert re.search(STAMPED.replace("HOOK", hook) + "one: INFO: ok$", log, re.M), log
