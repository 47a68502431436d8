"""Shared fixtures: an isolated environment for running slurmhealth on a simulated node."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support.skips import unavailable

# no per-example deadline anywhere: on a busy 2-core CI machine one slow example is load,
# not a bug (a deadline there is a wall-clock race)
settings.register_profile("slurmhealth", deadline=None)
settings.load_profile("slurmhealth")

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = REPO / "scenarios"


@pytest.fixture(autouse=True)
def _history_migrates_again() -> Iterator[None]:
    """A hook run in-process (CliRunner) tells History to leave migrations to the admin,
    for the rest of its process: each test starts as a fresh process would."""
    from slurmhealth.history import History

    yield
    History.defer_migrations = False
    History.close_at_exit = False


@pytest.fixture
def sim_env(tmp_path: Path) -> Callable[..., dict[str, str]]:
    """Environment for a `slurmhealth` process on a simulated node with its own history
    (and never this machine's Slurm accounting: a report reads this node's jobs only)."""
    (tmp_path / "config.toml").write_text("[report]\naccounting = false\n")

    def make(scenario: str | Path = "healthy", **extra: str) -> dict[str, str]:
        path = Path(scenario)
        if not path.suffix:
            path = SCENARIOS / f"{scenario}.toml"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURMHEALTH_", "SLURM"))}
        env.update(
            SLURMHEALTH_CONFIG=str(tmp_path / "config.toml"),
            SLURMHEALTH_GPU_BACKEND="sim",
            SLURMHEALTH_SIM_SCENARIO=str(path),
            SLURMHEALTH_SIM_KERNEL_LOG=str(tmp_path / "kmsg"),
            SLURMHEALTH_DB=str(tmp_path / "history.db"),
            SLURMHEALTH_NODE_NAME="node1",
        )
        env.update(extra)
        return env

    return make


def run_cli(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the real `slurmhealth` entry point in a new process."""
    return subprocess.run(
        [sys.executable, "-m", "slurmhealth", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="session")
def user() -> Iterator[str]:
    """An unprivileged user: the cluster's ``shuser``, else a throwaway one."""
    if os.geteuid() != 0:
        unavailable("needs root to act as another user")
    try:
        yield pwd.getpwnam("shuser").pw_name
        return
    except KeyError:
        pass
    name = f"shtest{os.getpid()}"
    subprocess.run(["useradd", "-M", "-s", "/bin/sh", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=False)
