"""What slurmhealth's series cost Prometheus: series and bytes per node, and Prometheus' own
memory scraping many nodes, extrapolated to 1,000 nodes.

Usage: python benchmarks/metrics_scale.py [--nodes 50] [--minutes 10] [--scrape 15]
                                          [--rdma ndr8|ndr4|roce8|none] [--skip-prometheus]

1. Series and bytes of one 8-GPU node's endpoint (the node's own series plus its jobs'),
   for 1 job on 8 GPUs and 8 jobs on 1 GPU each, in the default mode, with
   ``metrics.per_counter_rdma`` and with ``per_link_nvlink`` as well. GPUs come from the
   simulated healthy 8x H100 scenario through the real NVML adapter; the HCAs from a
   generated sysfs tree (``--rdma``, default ndr8: one NDR HCA per GPU) read as the sidecar
   reads it (``RdmaWatch.read`` with the job's GPUs, then ``job_ports``: a 1-GPU job shows
   the HCA behind its GPU); each job reports task metrics.
2. Debian's Prometheus on loopback scraping ``--nodes`` simulated node endpoints (default
   mode, 1 job on 8 GPUs, GPU values and RDMA bytes changing every scrape) every
   ``--scrape`` seconds for ``--minutes``; its head series, resident memory and Go heap,
   and the per-series cost extrapolated to 1,000 nodes. Not part of the test run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from slurmhealth.config import load_config  # noqa: E402
from slurmhealth.gpu import open_backend  # noqa: E402
from slurmhealth.history.node_queries import LastCheck  # noqa: E402
from slurmhealth.metrics.exposition import render, serve  # noqa: E402
from slurmhealth.metrics.job_series import SidecarCollector  # noqa: E402
from slurmhealth.metrics.node import NodeFacts, node_families  # noqa: E402
from slurmhealth.model import NodeSnapshot  # noqa: E402
from slurmhealth.model_records import ExportState, Job, TaskStats  # noqa: E402
from slurmhealth.rdma import simtree  # noqa: E402
from slurmhealth.rdma.model import RdmaSnapshot  # noqa: E402
from slurmhealth.sidecar.rdma import exports_rdma  # noqa: E402

TASK = TaskStats(12_000, 0.42, 1024.0, 4.2e6, 0.41, 0.12, 0.01, 1.7e9)
MODES = {"default": (False, False), "per-counter": (False, True), "per-link": (True, True)}
"""Mode name: (``per_link_nvlink``, ``per_counter_rdma``)."""
Rdma = Callable[[NodeSnapshot], RdmaSnapshot | None]


def h100_snapshot(node: str) -> NodeSnapshot:
    with tempfile.TemporaryDirectory() as tmp:
        env = {"SLURMHEALTH_CONFIG": os.devnull, "SLURMHEALTH_GPU_BACKEND": "sim",
               "SLURMHEALTH_SIM_SCENARIO": str(REPO / "scenarios" / "healthy.toml"),
               "SLURMHEALTH_SIM_KERNEL_LOG": f"{tmp}/kmsg", "SLURMD_NODENAME": node}  # fmt: skip
        backend = open_backend(load_config(os.devnull, env=env))
        try:
            return backend.snapshot(tuple(range(8)))
        finally:
            backend.close()


class RdmaTree:
    """A generated sysfs tree of ``preset``'s HCAs and the config that points ``[rdma]`` at
    it (every port judged); :meth:`job_ports` is what a job's sidecar exports."""

    def __init__(self, preset: str, tmp: str) -> None:
        simtree.write_tree(f"{tmp}/sys", simtree.preset(preset), 0.0)
        with open(f"{tmp}/config.toml", "w") as f:
            f.write(f'[rdma]\nsysfs_root = "{tmp}/sys"\n')
        self.cfg = load_config(f"{tmp}/config.toml", env={})

    def job_ports(self, job_snap: NodeSnapshot) -> RdmaSnapshot | None:
        """As the sidecar: its first read resolves the job's GPUs, then ``job_ports``."""
        from slurmhealth.sidecar.rdma import RdmaWatch, job_ports

        watch = RdmaWatch(self.cfg, job_snap.node)
        return job_ports(watch.read(job_snap), watch.expect)


def no_rdma(job_snap: NodeSnapshot) -> RdmaSnapshot | None:
    return None


def _grown(rdma: RdmaSnapshot | None, words: int) -> RdmaSnapshot | None:
    """``rdma`` with its data counters ``words`` further on (traffic between scrapes)."""
    if rdma is None:
        return None
    hcas = tuple(dataclasses.replace(h, ports=tuple(
        dataclasses.replace(p, counters={k: v + words if k.endswith("_data") else v
                                         for k, v in p.counters.items()})
        for p in h.ports)) for h in rdma.hcas)  # fmt: skip
    return dataclasses.replace(rdma, hcas=hcas)


class NodeEndpoint:
    """One node's exposition: its own series and its jobs' (``layout``: GPUs per job;
    ``mode``: a key of :data:`MODES`; ``rdma``: the job's ports from its snapshot)."""

    def __init__(self, node: str, snap: NodeSnapshot, layout: list[int], mode: str,
                 rdma: Rdma = no_rdma, jitter: bool = False,
                 job_nodes: str = "") -> None:  # fmt: skip
        self.node, self.jitter = node, jitter
        self.facts = NodeFacts(node, last_checks=[LastCheck("prolog", "ok", 1.7e9),
                                                  LastCheck("epilog", "ok", 1.7e9)],
                               runs={("prolog", "ok"): 120, ("epilog", "ok"): 119},
                               sidecars={"running": len(layout)})  # fmt: skip
        self.jobs: list[SidecarCollector] = []
        first = 0
        for n, count in enumerate(layout):
            job_id = f"{abs(hash(node)) % 10**6}{n:02d}"
            labels = Job(job_id=job_id, node=node, user=f"user{n}", account="acct",
                         partition="gpu", qos="normal", priority=4294901,
                         nodes=job_nodes or node)  # fmt: skip
            # [metrics] rdma_series = multi_node (the default): a job on one node has none
            ports = rdma if exports_rdma("multi_node", labels.nodes) else no_rdma
            job_snap = dataclasses.replace(snap, node=node, gpus=snap.gpus[first : first + count])
            first += count
            state = ExportState(labels, job_snap, event_counts={("straggler", 0): 1},
                                task=TASK, samples_total=100, started_ts=1.7e9,
                                rdma=ports(job_snap))  # fmt: skip
            per_link, per_counter = MODES[mode]
            self.jobs.append(SidecarCollector(self._state(state), per_link_nvlink=per_link,
                                              per_counter_rdma=per_counter))  # fmt: skip

    def _state(self, state: ExportState) -> Callable[[], ExportState]:
        def get() -> ExportState:
            if not self.jitter or state.snapshot is None:
                return state
            gpus = tuple(dataclasses.replace(g, utilization_gpu_pct=random.randint(60, 100),
                                             power_w=random.uniform(400, 700),
                                             temperature_c=random.randint(40, 80))
                         for g in state.snapshot.gpus)  # fmt: skip
            snap = dataclasses.replace(state.snapshot, gpus=gpus)
            now = int(time.time())
            return dataclasses.replace(state, snapshot=snap, samples_total=now,
                                       rdma=_grown(state.rdma, now * 10**6))  # fmt: skip

        return get

    def collect(self) -> Iterator[Metric]:
        yield from node_families(self.facts)
        for job in self.jobs:
            yield from job.collect()

    def registry(self) -> CollectorRegistry:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)  # type: ignore[arg-type]
        return registry


def per_node_figures(snap: NodeSnapshot, rdma: Rdma) -> list[dict[str, Any]]:
    rows = []
    # the 8-GPU job spans two nodes (its ports are exported), the 1-GPU jobs are single-node
    for jobs, layout, span in ((1, [8], "gpu-a[01-02]"), (8, [1] * 8, "")):
        for mode in MODES:
            reg = NodeEndpoint("gpu-a01", snap, layout, mode, rdma, job_nodes=span).registry()
            samples = [s for fam in reg.collect() for s in fam.samples]
            ports = {(s.labels["job_id"], s.labels["hca"], s.labels["port"])
                     for s in samples if s.name.startswith("slurmhealth_rdma_")}  # fmt: skip
            rdma_series = sum(1 for s in samples if s.name.startswith("slurmhealth_rdma_"))
            body = render(reg)
            rows.append({"jobs": jobs, "mode": mode, "series": len(samples),
                         "series_per_gpu": round(len(samples) / 8, 1), "ports": len(ports),
                         "rdma_series": rdma_series,
                         "bytes": len(body), "bytes_per_gpu": len(body) // 8})  # fmt: skip
    return rows


def prom_value(base: str, expr: str) -> float:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as resp:
        result = json.load(resp)["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def prometheus_memory(
    snap: NodeSnapshot, rdma: Rdma, nodes: int, minutes: float, scrape: int
) -> dict[str, Any]:
    from tests.prometheus_util import start_prometheus

    servers = [serve(NodeEndpoint(f"sim-{i:03d}", snap, [8], "default", rdma, jitter=True,
                                  job_nodes="sim-[000-063]").registry(), "127.0.0.1", [0])
               for i in range(nodes)]  # fmt: skip
    targets = ", ".join(f'"127.0.0.1:{s.server_address[1]}"' for s in servers)
    config = f"""
global:
  scrape_interval: {scrape}s
scrape_configs:
  - job_name: prometheus
    static_configs:
      - targets: ["PROM"]
  - job_name: slurmhealth
    honor_labels: true
    static_configs:
      - targets: [{targets}]
"""
    with tempfile.TemporaryDirectory() as tmp:
        import socket

        with socket.socket() as s:  # Prometheus scrapes itself: find its port first
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        base, stop = _start(Path(tmp), config.replace("PROM", f"127.0.0.1:{port}"), port,
                            start_prometheus)  # fmt: skip
        try:
            t0 = time.monotonic()
            while time.monotonic() - t0 < minutes * 60:
                time.sleep(5)
            own = '{job="prometheus"}'
            out = {
                "nodes": nodes, "minutes": minutes, "scrape_s": scrape,
                "head_series": prom_value(base, "prometheus_tsdb_head_series"),
                "rss_bytes": prom_value(base, f"process_resident_memory_bytes{own}"),
                "heap_inuse_bytes": prom_value(base, f"go_memstats_heap_inuse_bytes{own}"),
                "samples_per_s": prom_value(
                    base, "rate(prometheus_tsdb_head_samples_appended_total[2m])"
                ),
            }  # fmt: skip
        finally:
            stop()
            for s in servers:
                s.shutdown()
                s.server_close()
    return out


def _start(tmp: Path, config: str, port: int, start: Any) -> tuple[str, Callable[[], None]]:
    """tests.prometheus_util.start_prometheus on a port chosen before (self-scrape)."""
    import tests.prometheus_util as pu

    pu._free_port = lambda: port  # type: ignore[assignment]
    base: str
    base, stop = start(tmp, config, timeout=60)
    return base, stop


def print_node_figures(snap: NodeSnapshot, rdma: Rdma, preset: str) -> None:
    hcas = "no HCAs" if preset == "none" else f"HCAs of the {preset} tree"
    print(f"one 8x H100 node's endpoint (node series + jobs' series, {hcas}):")
    for r in per_node_figures(snap, rdma):
        shape = "1 two-node job " if r["jobs"] == 1 else "8 one-node jobs"
        print(f"  {shape}, {r['mode']:11}: {r['series']:5d} series "
              f"({r['series_per_gpu']} per GPU; RDMA {r['rdma_series']} on {r['ports']} "
              f"job port(s)), {r['bytes'] / 1024:6.1f} KiB per scrape "
              f"({r['bytes_per_gpu']} B per GPU)")  # fmt: skip


def print_prometheus(m: dict[str, Any], nodes: int, minutes: float, scrape: int) -> None:
    per_node = m["head_series"] / nodes
    print(f"Prometheus 2.x scraping {nodes} simulated nodes every {scrape} s for "
          f"{minutes:g} min (default mode, 1 job on 8 GPUs per node):")  # fmt: skip
    print(f"  head series {m['head_series']:.0f} (~{per_node:.0f} per node incl. Prometheus' own), "
          f"{m['samples_per_s']:.0f} samples/s")  # fmt: skip
    rss, heap = m["rss_bytes"] / 2**20, m["heap_inuse_bytes"] / 2**20
    print(f"  RSS {rss:.0f} MiB, Go heap in use {heap:.0f} MiB")
    heap_per_series = m["heap_inuse_bytes"] / max(1.0, m["head_series"])
    rss_per_series = m["rss_bytes"] / max(1.0, m["head_series"])
    series_1000 = per_node * 1000
    print(f"  1,000 nodes: ~{series_1000:.0f} head series, ~{series_1000 / scrape:.0f} "
          f"samples/s; at this run's {heap_per_series / 1024:.1f} KiB heap "
          f"({rss_per_series / 1024:.1f} KiB RSS) per series: ~"
          f"{series_1000 * heap_per_series / 2**30:.1f} GiB heap, ~"
          f"{series_1000 * rss_per_series / 2**30:.1f} GiB RSS (upper bounds: Prometheus' "
          "fixed memory is counted per series here)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--scrape", type=int, default=15)
    ap.add_argument("--rdma", default="ndr8", choices=(*simtree.PRESETS, "none"),
                    help="the node's HCAs: a simtree preset, or none")  # fmt: skip
    ap.add_argument("--skip-prometheus", action="store_true")
    args = ap.parse_args()
    snap = h100_snapshot("gpu-a01")
    with tempfile.TemporaryDirectory() as tmp:
        rdma = no_rdma if args.rdma == "none" else RdmaTree(args.rdma, tmp).job_ports
        print_node_figures(snap, rdma, args.rdma)
        if args.skip_prometheus:
            return
        m = prometheus_memory(snap, rdma, args.nodes, args.minutes, args.scrape)
    print_prometheus(m, args.nodes, args.minutes, args.scrape)


if __name__ == "__main__":
    main()
