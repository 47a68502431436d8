"""Small pieces of the report's data collection."""

from __future__ import annotations

from slurmhealth.report.collect import _swings
from slurmhealth.slurm import expand_hostlist


def test_swings_count_idle_busy_crossings_only() -> None:
    assert _swings([0, 50, 95, 95, 5, 50, 3, 99]) == 3  # mid values don't reset the state
    assert _swings([]) == 0 and _swings([50, 60, 70]) == 0 and _swings([5, 5, 95]) == 1


def test_hostlists() -> None:
    assert expand_hostlist("n[1-3],login1") == ("n1", "n2", "n3", "login1")
    assert expand_hostlist("gpu[08-10,12]") == ("gpu08", "gpu09", "gpu10", "gpu12")
    assert expand_hostlist("") == ()
