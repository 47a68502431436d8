"""Read what one node's history knows about a job into :class:`NodeFacts`.

Plain ``sqlite3`` in read-only mode (sqlite-utils costs 150 ms to import); the sample
aggregation runs in SQL where it can, so a day of 10 s samples of 8 GPUs stays fast.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import sqlite3
import statistics
from collections.abc import Iterator, Mapping
from typing import Any

from slurmhealth.diagnose.facts import GpuStats, JobFacts, NodeFacts, TaskFacts

HW_THROTTLE = {0x8: "hw_slowdown", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x20: "sw_thermal"}
MAX_SERIES = 300  # points per GPU kept for plots


def expand_hostlist(text: str) -> tuple[str, ...]:
    """``n[1-3,7],login1`` -> ``("n1", "n2", "n3", "n7", "login1")`` (Slurm's hostlist form)."""
    out: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]*)\])?(?:,|$)", text.strip()):
        prefix, ranges = m.group(1), m.group(2)
        if not prefix and not ranges:
            continue
        if ranges is None:
            out.append(prefix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if lo.isdigit() and (not hi or hi.isdigit()):
                width = len(lo)
                out.extend(f"{prefix}{i:0{width}d}" for i in range(int(lo), int(hi or lo) + 1))
    return tuple(out)


def connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    conn.row_factory = sqlite3.Row
    return conn


def _rows(conn: sqlite3.Connection, sql: str, *params: Any) -> list[dict[str, Any]]:
    out = []
    for row in conn.execute(sql, params):
        d = dict(row)
        for key in ("evidence", "detail", "gpus", "metrics"):
            if isinstance(d.get(key), str):
                with contextlib.suppress(ValueError):
                    d[key] = json.loads(d[key])
        out.append(d)
    return out


def job_facts(conn: sqlite3.Connection, job_id: str) -> JobFacts | None:
    rows = _rows(conn, "select * from jobs where job_id = ?", job_id)
    if not rows:
        return None
    r = rows[0]
    return JobFacts(
        job_id=job_id,
        user=r.get("user") or "",
        account=r.get("account") or "",
        partition=r.get("partition") or "",
        qos=r.get("qos") or "",
        priority=r.get("priority"),
        nodes=expand_hostlist(r.get("nodes") or "") or ((str(r["node"]),) if r.get("node") else ()),
        gpus=tuple(r.get("gpus") or ()),
        start_ts=r.get("start_ts"),
        end_ts=r.get("end_ts"),
        state=r.get("state") or "",
        exit_code=r.get("exit_code"),
    )


def _swings(values: list[float]) -> int:
    """How often utilisation crossed between idle (<10%) and busy (>90%)."""
    state, n = None, 0
    for v in values:
        now = "lo" if v < 10 else "hi" if v > 90 else None
        if now and state and now != state:
            n += 1
        state = now or state
    return n


def _gpu_stats(gpu: int, rows: list[sqlite3.Row]) -> GpuStats:
    ts = [r["ts"] for r in rows]
    util = [float(r["util"]) for r in rows if r["util"] is not None]
    power = [float(r["power"]) for r in rows if r["power"] is not None]
    steps = [b - a for a, b in itertools.pairwise(ts) if b > a]
    cap = 2 * statistics.median(steps) if steps else 0.0
    throttle: dict[str, float] = {}
    for i, r in enumerate(rows):
        mask = r["reasons"] or 0
        if not mask or i + 1 >= len(rows):
            continue
        dt = min(ts[i + 1] - ts[i], cap)
        for bit, name in HW_THROTTLE.items():
            if mask & bit:
                throttle[name] = throttle.get(name, 0.0) + dt
    first, last = rows[0], rows[-1]
    stride = max(1, len(rows) // MAX_SERIES)
    return GpuStats(
        gpu=gpu,
        uuid=last["uuid"],
        samples=len(rows),
        util_mean=statistics.fmean(util) if util else None,
        util_p5=sorted(util)[int(0.05 * (len(util) - 1))] if util else None,
        util_min=min(util) if util else None,
        util_max=max(util) if util else None,
        util_swings=_swings(util),
        mem_peak_bytes=_max(rows, "mem"),
        power_mean_w=statistics.fmean(power) if power else None,
        temp_max_c=_max(rows, "temp"),
        margin_min_c=_min(rows, "margin"),
        throttle_seconds={k: round(v, 1) for k, v in throttle.items()},
        pcie_gen_min=_min(rows, "gen"),
        pcie_width_min=_min(rows, "width"),
        nvlink_active_min=_min(rows, "links"),
        nvlink_errors_delta=max(0, int((last["nvl"] or 0) - (first["nvl"] or 0))),
        pcie_replays_delta=max(0, int((last["replay"] or 0) - (first["replay"] or 0))),
        series=tuple((r["ts"], r["util"], r["power"]) for r in rows[::stride]),
    )


def _max(rows: list[sqlite3.Row], key: str) -> Any:
    values = [r[key] for r in rows if r[key] is not None]
    return max(values) if values else None


def _min(rows: list[sqlite3.Row], key: str) -> Any:
    values = [r[key] for r in rows if r[key] is not None]
    return min(values) if values else None


_SAMPLE_SQL = """
select gpu, uuid, ts,
  json_extract(metrics, '$.utilization_gpu_pct') as util,
  json_extract(metrics, '$.power_w') as power,
  json_extract(metrics, '$.memory_used_bytes') as mem,
  json_extract(metrics, '$.temperature_c') as temp,
  json_extract(metrics, '$.margin_temperature_c') as margin,
  json_extract(metrics, '$.clock_event_reasons') as reasons,
  json_extract(metrics, '$.pcie_gen') as gen,
  json_extract(metrics, '$.pcie_width') as width,
  json_extract(metrics, '$.nvlink_active') as links,
  json_extract(metrics, '$.nvlink_errors') as nvl,
  json_extract(metrics, '$.pcie_replay_errors') as replay
from samples where job_id = ? and node = ? and gpu is not null order by gpu, ts
"""


def _by_gpu(rows: list[sqlite3.Row]) -> Iterator[tuple[int, list[sqlite3.Row]]]:
    current: list[sqlite3.Row] = []
    for r in rows:
        if current and r["gpu"] != current[0]["gpu"]:
            yield current[0]["gpu"], current
            current = []
        current.append(r)
    if current:
        yield current[0]["gpu"], current


def _task(conn: sqlite3.Connection, job_id: str, node: str) -> TaskFacts | None:
    rows = _rows(
        conn,
        "select ts, metrics from samples where job_id = ? and node = ? and gpu is null order by ts",
        job_id,
        node,
    )
    tasks = [r["metrics"] for r in rows if isinstance(r["metrics"], dict)]
    tasks = [t for t in tasks if t.get("kind") == "task"]
    if not tasks:
        return None
    last = tasks[-1]
    throughput = [t["samples_per_second"] for t in tasks if t.get("samples_per_second")]
    step_s = [t["step_seconds"] for t in tasks if t.get("step_seconds")]
    return TaskFacts(
        steps_total=int(last.get("steps_total") or 0),
        step_seconds_median=statistics.median(step_s) if step_s else None,
        samples_per_second_first=throughput[0] if throughput else None,
        samples_per_second_last=throughput[-1] if throughput else None,
        mfu_ratio=last.get("mfu_ratio"),
        comm_ratio=last.get("comm_ratio"),
        data_wait_ratio=last.get("data_wait_ratio"),
    )


def node_facts(
    conn: sqlite3.Connection, job_id: str, node: str, logs: Mapping[str, str] | None = None
) -> NodeFacts:
    """Everything this node's history holds about the job."""
    runs = _rows(conn, "select * from check_runs where job_id = ? and node = ? order by ts",
                 job_id, node)  # fmt: skip
    findings = _rows(conn, "select * from findings where job_id = ? and node = ? order by ts",
                     job_id, node)  # fmt: skip
    events = _rows(conn, "select * from events where job_id = ? and node = ? order by ts",
                   job_id, node)  # fmt: skip
    drains = _rows(conn, "select * from drains where job_id = ? and node = ? order by ts",
                   job_id, node)  # fmt: skip
    evidence = _rows(conn, "select * from evidence where job_id = ? and node = ? order by ts",
                     job_id, node)  # fmt: skip
    samples = list(conn.execute(_SAMPLE_SQL, (job_id, node)))
    gpus = tuple(_gpu_stats(gpu, rows) for gpu, rows in _by_gpu(samples))
    return NodeFacts(
        node=node,
        findings=tuple(findings),
        runs=tuple(runs),
        events=tuple(events),
        drains=tuple(drains),
        gpus=gpus,
        task=_task(conn, job_id, node),
        evidence=tuple(evidence),
        logs=dict(logs or {}),
    )
