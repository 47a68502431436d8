"""Reliability tests on the real local Slurm cluster (`scripts/cluster up`): faults that
hit the prolog while it decides (a locked history, a slurmctld that does not answer) on a
bad node and on a healthy one. Marked `slurm` like tests/integration, whose `cluster` and
`healthy` fixtures they share (skipped without root or Slurm, failed with CI=true)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import Cluster, cluster, healthy

__all__ = ["Cluster", "cluster", "healthy"]

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.slurm)
