"""Small pieces of the report's data collection."""

from __future__ import annotations

from pathlib import Path

from slurmhealth.history import Batch, History
from slurmhealth.history.read import Reader
from slurmhealth.slurm import expand_hostlist
from slurmhealth.summary.collect import node_facts


def _swings(tmp_path: Path, values: list[float], step: float = 10.0) -> int:
    """Swings the report counts for one GPU sampled every ``step`` s with ``values``."""
    path = tmp_path / f"swings-{len(list(tmp_path.iterdir()))}.db"
    rows = [("samples", {"ts": 1_000_000.0 + i * step, "node": "n1", "job_id": "1", "gpu": 0,
                         "util_pct": v}) for i, v in enumerate(values)]  # fmt: skip
    with History(path) as h:
        h.write(Batch())
        for row in rows:  # one interval per write, as the sidecar's buffer does
            h.write(Batch(inserts=[row]))
    with Reader(path) as r:
        gpus = node_facts(r, "1", "n1").gpus
    return gpus[0].util_swings if gpus else 0


def test_swings_count_idle_busy_crossings_only(tmp_path: Path) -> None:
    values = [0, 50, 95, 95, 5, 50, 3, 99]
    assert _swings(tmp_path, values) == 3  # mid values don't reset the state
    assert _swings(tmp_path, values, step=200.0) == 3  # the same across rollup buckets
    assert _swings(tmp_path, []) == 0 and _swings(tmp_path, [50, 60, 70]) == 0
    assert _swings(tmp_path, [5, 5, 95]) == 1


def test_hostlists() -> None:
    assert expand_hostlist("n[1-3],login1") == ("n1", "n2", "n3", "login1")
    assert expand_hostlist("gpu[08-10,12]") == ("gpu08", "gpu09", "gpu10", "gpu12")
    assert expand_hostlist("") == ()
