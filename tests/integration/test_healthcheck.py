"""`slurmhealth healthcheck` run by slurmd itself as HealthCheckProgram: a GPU that breaks on
an idle node is drained within one interval, with the prolog's reason; a healthy node is
left alone; nothing is ever resumed by it."""

from __future__ import annotations

import contextlib
import re
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tests.integration.conftest import Cluster

SLURM_CONF = Path("/etc/slurm/slurm.conf")
INTERVAL_S = 5
NVLINK_DOWN_ON_N3 = """
name = "n3-nvlink-down"
[nodes.n3.gpu.3]
nvlink.7.state = "inactive"
"""


def _set_interval(seconds: int) -> None:
    text = SLURM_CONF.read_text()
    new = re.sub(r"(?m)^HealthCheckInterval=\d+$", f"HealthCheckInterval={seconds}", text)
    assert new != text or f"HealthCheckInterval={seconds}" in text, "no HealthCheckInterval line"
    SLURM_CONF.write_text(new)
    subprocess.run(["scontrol", "reconfigure"], check=True, timeout=60)
    deadline = time.monotonic() + 30
    while f"= {seconds} sec" not in _shown_interval():
        assert time.monotonic() < deadline, _shown_interval()
        time.sleep(0.5)


def _shown_interval() -> str:
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    return next((ln for ln in out.splitlines() if ln.startswith("HealthCheckInterval")), "")


@contextlib.contextmanager
def _healthcheck_every(seconds: int) -> Iterator[None]:
    """slurmd runs the HealthCheckProgram of the cluster's slurm.conf every ``seconds``
    (off again on exit: the other tests' scenarios must not race a check of its own)."""
    _set_interval(seconds)
    try:
        yield
    finally:
        _set_interval(0)


def _runs(db: Path, since: float) -> list[tuple[str, str]]:
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
        sql = "select phase, status from check_runs where phase = 'healthcheck' and ts >= ?"
        return [tuple(r) for r in conn.execute(sql, (since,))]


def test_gpu_breaking_on_an_idle_node_is_drained_within_one_interval(healthy: Cluster) -> None:
    t0 = time.time()
    with _healthcheck_every(INTERVAL_S):
        time.sleep(2 * INTERVAL_S + 2)  # two rounds on a healthy cluster: nothing drained
        assert healthy.sinfo_reasons() == {}
        for node in ("n1", "n2", "n3"):
            assert ("healthcheck", "ok") in _runs(healthy.node_db(node), t0), node

        healthy.set_scenario(NVLINK_DOWN_ON_N3)
        broke = time.monotonic()
        while "n3" not in healthy.sinfo_reasons():
            # one interval, plus slurmd's own scheduling and the check's run on a busy host
            assert time.monotonic() - broke < INTERVAL_S + 10, healthy.node_states()
            time.sleep(0.2)
        reasons = healthy.sinfo_reasons()
        assert set(reasons) == {"n3"}
        assert reasons["n3"].startswith("slurmhealth: nvlink_inactive gpu3 NVLink 7"), reasons
        # the run drains first and records the run with its drain just after: wait for it
        deadline = time.monotonic() + 30
        while ("healthcheck", "fail") not in (seen := _runs(healthy.node_db("n3"), t0)):
            assert time.monotonic() < deadline, seen
            time.sleep(0.2)

        healthy.set_scenario("healthy")  # repaired: the health check resumes nothing
        time.sleep(2 * INTERVAL_S + 2)
        assert "n3" in healthy.sinfo_reasons()
