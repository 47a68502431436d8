"""The prolog's optional short bandwidth test runs only when the last one is too old."""

from __future__ import annotations

import time
from pathlib import Path

from slurmhealth.baseline import store
from slurmhealth.config import load_config
from slurmhealth.hooks.validate import prolog_bench

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "baseline" / "nvbandwidth_h2d_d2h.txt"


def _cfg(tmp_path: Path, max_age: float):  # type: ignore[no-untyped-def]
    (tmp_path / "c.toml").write_text(
        f"""
[paths]
db = "{tmp_path}/{{node}}.db"
[baseline]
prolog_bench_max_age_s = {max_age}
prolog_bench_kind = "nvbandwidth"
prolog_bench_command = "cat {FIXTURE}"
prolog_bench_timeout_s = 5
"""
    )
    return load_config(str(tmp_path / "c.toml"), env={}, flags={})


def test_runs_when_due_then_not_again(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, 3600)
    now = time.time()
    first = prolog_bench(cfg, "n1", "NVIDIA H100 80GB HBM3", now=now)
    assert first is not None and first.stored > 0
    rows = store.rows(cfg, node="n1", kind="nvbandwidth")
    assert rows and {r["label"] for r in rows} == {"prolog"}
    assert prolog_bench(cfg, "n1", "NVIDIA H100 80GB HBM3", now=now + 60) is None  # fresh
    assert prolog_bench(cfg, "n1", "NVIDIA H100 80GB HBM3", now=now + 7200) is not None  # old


def test_off_by_default(tmp_path: Path) -> None:
    assert prolog_bench(_cfg(tmp_path, 0), "n1", None, now=time.time()) is None
