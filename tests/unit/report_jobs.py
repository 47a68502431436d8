"""Jobs for the report's tests, written into node histories as the hooks and the sidecar
write them: a 24-hour 2-node job whose GPU 3 on n2 throttles every hour, and a healthy job
that held 8 GPUs at 0% for its whole run. Both belong to the user running the tests."""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Any

from slurmhealth.config import Config, load_config
from slurmhealth.history.rows import sample_columns
from tests.unit.test_report import event_row, job_row, run_row, task_row, write

DAY_T0 = 1_700_006_400.0  # 2023-11-15T00:00:00Z
HOUR = 3600.0
ME = getpass.getuser()


def samples(node: str, job: str, t0: float, n: int, step: float, util: float) -> list[Any]:
    rows = []
    for i in range(n):
        for gpu in range(8):
            metrics = {"utilization_gpu_pct": util, "power_w": 77.0 if util == 0 else 640.0,
                       "memory_used_bytes": 2**30, "temperature_c": 60.0,
                       "margin_temperature_c": 25.0, "clock_event_reasons": 0}  # fmt: skip
            rows.append(("samples", {"ts": t0 + i * step, "node": node, "job_id": job,
                                     "gpu": gpu, "uuid": f"GPU-{node}-{gpu}",
                                     "metrics": metrics, **sample_columns(metrics)}))  # fmt: skip
    return rows


def config(tmp: Path) -> Config:
    tmp.mkdir(parents=True, exist_ok=True)
    dbs, evidence = tmp / "db", tmp / "evidence"
    (tmp / "config.toml").write_text(
        f'[node]\nname = "n1"\n[paths]\ndb = "{dbs}/{{node}}.db"\nevidence_dir = "{evidence}"\n'
    )
    return load_config(str(tmp / "config.toml"), env={})


def day_job(tmp: Path, job: str = "77") -> Config:
    """24 hours on n[1-2], 5-minute samples; n2 GPU 3 throttles (a warn event) every hour,
    an info event each hour on every node; completed."""
    cfg = config(tmp)
    for node in ("n1", "n2"):
        db = tmp / "db" / f"{node}.db"
        row = job_row(job, node, ME, nodes="n[1-2]", start_ts=DAY_T0, state="running")
        write(db, ("check_runs", run_row(f"p{node}", DAY_T0, node, job, "prolog", "ok")), job=row)
        write(db, *samples(node, job, DAY_T0, 288, 300.0, 90.0))
        events = [("events", event_row(DAY_T0 + h * HOUR + 120, node, job, None, "heartbeat",
                                       "info", f"sidecar alive, {h * 12} samples"))
                  for h in range(24)]  # fmt: skip
        if node == "n2":
            events += [("events", event_row(DAY_T0 + h * HOUR + 60, node, job, 3, "throttle",
                                            "warn", f"GPU 3 hw_thermal slowdown {70 + h % 5} C"))
                       for h in range(24)]  # fmt: skip
        write(db, *events, ("samples", task_row(DAY_T0 + 60, node, job, 900.0, 10)),
              ("samples", task_row(DAY_T0 + 86000, node, job, 880.0, 170000)))  # fmt: skip
        end = job_row(job, node, ME, nodes="n[1-2]", end_ts=DAY_T0 + 86400, state="completed",
                      exit_code="0:0")  # fmt: skip
        write(db, ("check_runs", run_row(f"e{node}", DAY_T0 + 86400, node, job, "epilog", "ok")),
              job=end)  # fmt: skip
    return cfg


def idle_job(tmp: Path, job: str = "34") -> Config:
    """One hour on n1 holding 8 GPUs at 0%, completed, no fault anywhere."""
    cfg = config(tmp)
    db = tmp / "db" / "n1.db"
    row = job_row(job, "n1", ME, nodes="n1", start_ts=DAY_T0, state="running")
    write(db, ("check_runs", run_row("p1", DAY_T0, "n1", job, "prolog", "ok")), job=row)
    write(db, *samples("n1", job, DAY_T0, 61, 60.0, 0.0))
    end = job_row(job, "n1", ME, nodes="n1", end_ts=DAY_T0 + HOUR, state="completed",
                  exit_code="0:0")  # fmt: skip
    write(db, ("check_runs", run_row("e1", DAY_T0 + HOUR, "n1", job, "epilog", "ok")), job=end)
    return cfg
