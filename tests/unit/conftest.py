"""Unit tests stay on their own files: a report never asks this machine's Slurm accounting
(the local test cluster's slurmdbd knows job ids of its own, 999 among them), except in the
tests that give it slurmdbd's recorded answers (the ``accounting`` fixture)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _no_machine_accounting(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    if "accounting" not in request.fixturenames:
        from slurmhealth.report import accounting

        monkeypatch.setattr(accounting, "read_accounting", lambda job_id: None)
    yield
