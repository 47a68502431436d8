"""Series churn in Prometheus from per-job labels: ``[metrics] job_labels = "series"`` against
``"info"``, while jobs start and end on every node.

Usage: python benchmarks/metrics_churn.py [--nodes 200] [--rate short|long] [--job-labels
                                          series|info] [--compress 30] [--minutes 10.5]

Debian's Prometheus on loopback scrapes ``--nodes`` simulated node endpoints, all served by
one process (one HTTP server, one path per node), while each node runs one 8-GPU job after
another: ``short`` jobs last a minute (one per node per minute), ``long`` ones a day (one per
node per day), each node's jobs offset by a random phase. Each endpoint is what the node's
exporter serves, made by the project's own path: the job's ``SidecarCollector`` (simulated
8x H100 through the real NVML adapter, the 8 NDR HCAs of a generated sysfs tree read as the
sidecar reads them: jobs span two nodes, so their RDMA ports are exported), ``encode`` into
the state file's JSON, then the exporter's ``merged`` with the node's own series and the
per-GPU stats the epilog publishes after each job (``final_series``, served for
``final_linger_s`` = 300 s), rendered by ``exposition.render`` whenever the node's jobs or
published stats change (in between, the same body: values do not change within a job, so
the head's chunks compress better than a real fleet's; series counts are not affected).

Time is compressed by ``--compress`` C (default 30) so that a run of minutes stands for
hours: the real fleet is scraped every 60 s, the run every 60/C s (2 s); a job lasts 60/C s
(one scrape: a one-minute job at a 60 s scrape has one sample) or 86,400/C s; the stats
linger 300/C s; and Prometheus cuts its head into blocks of 2 h / C
(``--storage.tsdb.min-block-duration``, 4 min), so a series stays in the head as many
scrapes after its last sample as it would in real time (2-3 h); the queries' look-back (5
min) is 5 min / C too. The head then holds as many series as the real fleet's would (the
same jobs per block), and the same samples per series: head series, RSS and Go heap read as
they are; ``prometheus_tsdb_head_series_created_total`` grows C times faster than in real
time, so its rate per run second x 3600 / C is the real fleet's per hour. What compression
does not keep: samples per second are C times the real rate (CPU, not memory), and queries
over fixed spans (the report's 120 s slack, 15 min edges) cover C times more jobs' time.

The head is read every 10 s (5 real minutes) and the run lasts ``--minutes`` (10.5:
past the head's second cut at 6 and 10 min); reported: the median and the largest head
series after the first cut, series created per real hour over the second half, the largest
RSS and Go heap in use, and medians of 5 of each query below, all extrapolated to 1,000
nodes (linear in nodes: the series, the rate and the heap per series). Queries: the
dashboards' fleet utilisation by user, one job's GPU utilisation (the job-detail panel),
and the login-node report's per-GPU stats of a finished job computed from its series
(``PromSource.gpu_stats(final=False)``) and from its published stats. Not part of the test
run; a run prints one table row (``--json`` for the figures; ``--table A.json B.json ...``
prints the runs side by side, the 1,000-node heap from a fit of heap against head series
over all of them: Prometheus' fixed memory apart from what each series costs).
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.metrics_scale import RdmaTree, h100_snapshot, no_rdma  # noqa: E402
from slurmhealth import final_series  # noqa: E402
from slurmhealth.export_state import encode, merged  # noqa: E402
from slurmhealth.exposition import render  # noqa: E402
from slurmhealth.history.node_queries import LastCheck  # noqa: E402
from slurmhealth.metrics import SidecarCollector  # noqa: E402
from slurmhealth.model import NodeSnapshot  # noqa: E402
from slurmhealth.model_records import ExportState, Job  # noqa: E402
from slurmhealth.node_metrics import NodeFacts, node_families  # noqa: E402

REAL_SCRAPE_S, REAL_BLOCK_S, LINGER_S = 60.0, 7200.0, 300.0
JOB_S = {"short": 60.0, "long": 86400.0}
QUERIES = {
    "series": {
        "fleet util by user": "avg by (user) (slurmhealth_gpu_utilization_ratio"
        " * on (node, gpu) group_left (user) slurmhealth_job_gpu_info)",
        "one job's GPUs": "slurmhealth_gpu_utilization_ratio"
        ' * on (node, gpu) group_left (job_id) slurmhealth_job_gpu_info{job_id="JOB"}',
    },
}
QUERIES["info"] = QUERIES["series"]  # the dashboards' queries are the same in both modes
STATS = {"samples": 2, "util_mean": 80.0, "util_p5": 60.0, "util_min": 55.0,
         "util_max": 100.0, "util_swings": 0, "mem_peak_bytes": 7e10,
         "mem_total_bytes": 85e9, "power_mean_w": 550.0, "temp_max_c": 70.0,
         "margin_min_c": 15.0, "pcie_gen_min": 5, "pcie_width_min": 16,
         "nvlink_active_min": 18, "nvlink_errors_delta": 0, "pcie_replays_delta": 0}  # fmt: skip


def job_stats(job_id: int, gpu: int) -> dict[str, float]:
    """Stats that differ from job to job with the digits real ones have (a mean is rarely a
    round number): in ``info`` mode they are label text, which Prometheus keeps once per
    distinct string."""
    x = random.Random(job_id * 64 + gpu).random()
    return {
        "util_mean": 100 * x,
        "power_mean_w": 300 + 400 * x,
        "mem_peak_bytes": float(int(8e10 * x)),
        "util_p5": float(int(60 * x)),
        "temp_max_c": float(40 + int(40 * x)),
    }


class _Fixed:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Any:
        return iter(self.families)


class SimNode:
    """One node's jobs in sequence and its exporter's body at a compressed time."""

    def __init__(self, i: int, snap: NodeSnapshot, fleet: Fleet) -> None:
        self.name, self.fleet = f"sim-{i:04d}", fleet
        self.snap = NodeSnapshot(self.name, snap.ts, snap.gpus)
        self.phase = random.uniform(0, fleet.job_s)
        self.facts = NodeFacts(self.name, last_checks=[LastCheck("prolog", "ok", 1.7e9)],
                               runs={("prolog", "ok"): 1}, sidecars={"running": 1})  # fmt: skip
        self.k = -1
        self.live: list[dict[str, Any]] = []
        self.done: list[tuple[float, list[dict[str, Any]]]] = []  # (real end, families)
        self.rdma = fleet.rdma(self.snap)
        self.lock = threading.Lock()
        self.key: tuple[int, tuple[float, ...]] = (-1, ())
        self.cached = b""

    def job(self, k: int) -> Job:
        return Job(job_id=f"{k * 10_000 + int(self.name[4:])}", node=self.name,
                   user=f"user{k % 97}", account=f"acct{k % 13}", partition="gpu",
                   qos="normal", priority=4294901 - k % 1000,
                   nodes=f"{self.name},sim-peer")  # fmt: skip

    def body(self, real_t: float) -> bytes:
        with self.lock:
            k = int((real_t + self.phase) // self.fleet.job_s)
            if k != self.k:
                self._switch(k, real_t)
            self.done = [(t, f) for t, f in self.done if real_t - t <= LINGER_S]
            key = (k, tuple(t for t, _ in self.done))
            if key == self.key:  # the same jobs as the last scrape: the same body
                return self.cached
            fams = merged([self.live, *(f for _, f in reversed(self.done))])
            reg = CollectorRegistry(auto_describe=False)
            reg.register(_Fixed([*node_families(self.facts), *fams]))  # type: ignore[arg-type]
            self.key, self.cached = key, render(reg)
            return self.cached

    def _switch(self, k: int, real_t: float) -> None:
        if self.k >= 0:  # the epilog publishes the job's stats
            jid = int(self.job(self.k).job_id)
            gpus = [{**STATS, **job_stats(jid, g.index), "gpu": g.index, "uuid": g.uuid}
                    for g in self.snap.gpus]  # fmt: skip
            self.done.append((real_t, final_series.families(self.job(self.k), self.name, gpus,
                                                            self.fleet.job_labels)))  # fmt: skip
            self.fleet.ended.append((self.job(self.k).job_id, self.name, real_t))
        state = ExportState(self.job(k), self.snap, samples_total=1, rdma=self.rdma)
        collector = SidecarCollector(lambda: state, job_labels=self.fleet.job_labels)
        doc = json.loads(encode(collector.collect(), state.labels.job_id, 1, real_t))
        self.live, self.k = doc["families"], k
        self.fleet.started.append((state.labels.job_id, self.name, real_t))


class Fleet:
    def __init__(self, args: argparse.Namespace, rdma: Callable[[NodeSnapshot], Any]) -> None:
        self.job_s, self.compress, self.job_labels = (
            JOB_S[args.rate],
            args.compress,
            args.job_labels,
        )
        self.rdma = rdma
        self.t0 = time.time()
        self.started: list[tuple[str, str, float]] = []
        self.ended: list[tuple[str, str, float]] = []
        snap = h100_snapshot("sim")
        self.nodes = [SimNode(i, snap, self) for i in range(args.nodes)]

    def real(self, wall: float) -> float:
        """The simulated fleet's time at wall-clock ``wall``."""
        return (wall - self.t0) * self.compress

    def serve(self) -> ThreadingHTTPServer:
        fleet = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                try:
                    node = fleet.nodes[int(self.path.rsplit("/", 1)[-1])]
                except (ValueError, IndexError):
                    self.send_error(404)
                    return
                body = node.body(fleet.real(time.time()))
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


def prom_config(port: int, self_port: int, nodes: int, scrape_s: float) -> str:
    targets = "\n".join(
        f'      - targets: ["127.0.0.1:{port}"]\n        labels: {{__metrics_path__: "/n/{i}"}}'
        for i in range(nodes)
    )
    return (f"global:\n  scrape_interval: {scrape_s:g}s\n  scrape_timeout: {scrape_s:g}s\n"
            f"scrape_configs:\n  - job_name: prometheus\n    static_configs:\n"
            f'      - targets: ["127.0.0.1:{self_port}"]\n'
            f"  - job_name: slurmhealth\n    honor_labels: true\n    static_configs:\n"
            f"{targets}\n")  # fmt: skip


def value(base: str, expr: str) -> float:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=30) as resp:
        result = json.load(resp)["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def timed(call: Callable[[], Any], n: int = 5) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def query_latency(base: str, fleet: Fleet) -> dict[str, float]:
    from slurmhealth.report.prometheus import PromSource

    now = time.time()
    # a job that ended a few scrapes ago: its stats are published, its samples scraped
    done = [(j, n, t) for j, n, t in fleet.ended if fleet.real(now) - t > 3 * REAL_SCRAPE_S]
    job_id, _, real_end = done[-1]
    start = next(t for j, _, t in fleet.started if j == job_id)
    wall = [fleet.t0 + t / fleet.compress for t in (start, real_end)]
    out: dict[str, float] = {"job": float(job_id), "start": wall[0], "end": wall[1]}
    for name, expr in QUERIES[fleet.job_labels].items():
        promql = expr.replace("JOB", job_id)
        out[name] = timed(lambda e=promql: value(base, e))  # type: ignore[misc]
    source = PromSource(base, 60)
    for label, final in (("report, from series", False), ("report, published", True)):
        got: dict[str, Any] = {}

        def report(final: bool = final, got: dict[str, Any] = got) -> None:
            got.update(source.gpu_stats(job_id, wall[0], wall[1], final=final))

        try:
            out[label] = timed(report)
        except Exception as exc:  # the table says so
            print(f"{label}: {type(exc).__name__}: {exc}", file=sys.stderr)
            out[label] = float("nan")
        out[f"{label} GPUs"] = sum(len(g) for g in got.values())
    return out


def head(base: str) -> dict[str, float]:
    own = '{job="prometheus"}'
    return {"series": value(base, "prometheus_tsdb_head_series"),
            "created": value(base, "prometheus_tsdb_head_series_created_total"),
            "rss": value(base, f"process_resident_memory_bytes{own}"),
            "heap": value(base, f"go_memstats_heap_inuse_bytes{own}"),
            "t": time.time()}  # fmt: skip


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    from tests.prometheus_util import start_prometheus

    rdma = no_rdma if args.rdma == "none" else RdmaTree(args.rdma, str(tmp)).job_ports
    fleet = Fleet(args, rdma)
    server = fleet.serve()
    with socket.socket() as s:  # Prometheus scrapes itself: its port first
        s.bind(("127.0.0.1", 0))
        self_port = s.getsockname()[1]
    scrape_s = REAL_SCRAPE_S / args.compress
    block = f"{max(1, round(REAL_BLOCK_S / args.compress))}s"
    import tests.prometheus_util as pu

    pu._free_port = lambda: self_port  # type: ignore[assignment]
    config = prom_config(server.server_address[1], self_port, args.nodes, scrape_s)
    blocks = (f"--storage.tsdb.min-block-duration={block}",
              f"--storage.tsdb.max-block-duration={block}",
              f"--query.lookback-delta={max(1, round(300 / args.compress))}s")  # fmt: skip
    base, stop = start_prometheus(tmp, config, timeout=60, extra_args=blocks)
    readings = []
    try:
        end = time.time() + args.minutes * 60
        while time.time() < end:
            time.sleep(min(10.0, max(0.0, end - time.time())))
            readings.append(head(base))
        latency = query_latency(base, fleet)
        own = value(base, 'count({job="prometheus"})')  # Prometheus' own series
        slow = value(base, 'max(scrape_duration_seconds{job="slurmhealth"})')
    finally:
        stop()
        server.shutdown()
    starts = [fleet.t0 + t / args.compress for _, _, t in fleet.started]
    return summarise(args, readings, latency, slow, float(REAL_BLOCK_S / args.compress),
                     starts, own)  # fmt: skip


def summarise(
    args: argparse.Namespace, readings: list[dict[str, float]], latency: dict[str, float],
    slow: float, block_s: float, starts: list[float], own: float = 0.0,
) -> dict[str, Any]:  # fmt: skip
    t0 = readings[0]["t"] - 10
    steady = [r for r in readings if r["t"] - t0 > 1.6 * block_s] or readings[-3:]
    half = [r for r in readings if r["t"] - t0 > args.minutes * 30]
    rate = (half[-1]["created"] - half[0]["created"]) / max(1.0, half[-1]["t"] - half[0]["t"])
    per_hour = rate * 3600 / args.compress
    # the jobs that started in the window (wall-clock times), per real hour
    started = sum(1 for t in starts if half[0]["t"] < t <= half[-1]["t"])
    jobs_per_hour = started / max(1.0, half[-1]["t"] - half[0]["t"]) * 3600 / args.compress
    scale = 1000 / args.nodes
    series = statistics.median(r["series"] for r in steady)
    heap, rss = max(r["heap"] for r in steady), max(r["rss"] for r in steady)
    return {
        "job_labels": args.job_labels, "rate": args.rate, "nodes": args.nodes,
        "compress": args.compress, "minutes": args.minutes, "max_scrape_s": slow,
        "head_series": series, "head_series_max": max(r["series"] for r in steady),
        "created_per_hour": per_hour, "jobs_per_hour": jobs_per_hour,
        "created_per_job": per_hour / max(1e-9, jobs_per_hour),
        "rss_bytes": rss, "heap_bytes": heap,
        "own_series": own,
        "at_1000": {"head_series": (series - own) * scale + own,
                    "created_per_hour": per_hour * scale,
                    "heap_bytes": heap * scale, "rss_bytes": rss * scale},
        "latency_s": latency, "readings": readings,
    }  # fmt: skip


_NOT_SHOWN = ("job", "start", "end", "report, from series GPUs", "report, published GPUs")


HEADER = (
    "| job_labels | jobs | nodes | head series | created / h | per job | RSS / heap | "
    "1,000 nodes: head series | created / h | heap | fleet util by user | one job's GPUs | "
    "report, from series | report, published |\n" + "| --- " * 14 + "|"
)


def heap_fit(runs: list[dict[str, Any]]) -> tuple[float, float]:
    """Go heap = base + per-series x head series, least squares over ``runs`` (one run:
    no base)."""
    xs, ys = [r["head_series"] for r in runs], [r["heap_bytes"] for r in runs]
    if len(runs) < 2 or len(set(xs)) < 2:
        return 0.0, sum(ys) / max(1.0, sum(xs))
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    k = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return my - k * mx, k


def row(m: dict[str, Any], fit: tuple[float, float]) -> str:
    lat, a = m["latency_s"], m["at_1000"]
    heap = fit[0] + fit[1] * a["head_series"]
    ms = " | ".join(f"{lat[k] * 1000:.0f} ms" for k in lat if k not in _NOT_SHOWN)
    return (f"| {m['job_labels']} | {m['rate']} | {m['nodes']} | {m['head_series']:,.0f} "
            f"(max {m['head_series_max']:,.0f}) | {m['created_per_hour']:,.0f} | "
            f"{m['created_per_job']:.1f} | {m['rss_bytes'] / 2**20:.0f} / "
            f"{m['heap_bytes'] / 2**20:.0f} MiB | {a['head_series']:,.0f} | "
            f"{a['created_per_hour']:,.0f} | {heap / 2**30:.2f} GiB | {ms} |")  # fmt: skip


def table(paths: list[str]) -> str:
    """The runs' rows side by side; the 1,000-node heap from the fit over all of them."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    own = max(r.get("own_series", 0.0) for r in runs)  # a run without: the others' count
    for r in runs:
        if not r.get("own_series"):
            r["at_1000"]["head_series"] = (r["head_series"] - own) * 1000 / r["nodes"] + own
    fit = heap_fit(runs)
    lines = [HEADER, *(row(m, fit) for m in runs)]
    lines.append(f"\nGo heap ~ {fit[0] / 2**20:.0f} MiB + {fit[1] / 1024:.2f} KiB per head series")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--rate", choices=tuple(JOB_S), default="short")
    ap.add_argument("--job-labels", choices=("series", "info"), default="series")
    ap.add_argument("--compress", type=float, default=30.0)
    ap.add_argument("--minutes", type=float, default=10.5)
    ap.add_argument("--rdma", default="ndr8", help="a simtree preset, or none")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--keep", help="copy Prometheus' data dir here (to query it again)")
    ap.add_argument("--table", nargs="+", metavar="JSON", help="print the runs' table, no run")
    args = ap.parse_args()
    if args.table:
        print(table(args.table))
        return
    random.seed(7)
    with tempfile.TemporaryDirectory() as tmp:
        m = run(args, Path(tmp))
        if args.keep:
            import shutil

            shutil.copytree(Path(tmp) / "tsdb", args.keep)
    if args.json:
        Path(args.json).write_text(json.dumps(m, indent=1))

    print(HEADER)
    print(row(m, heap_fit([m])))


if __name__ == "__main__":
    main()
