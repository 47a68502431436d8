"""A soak of healthy simulated nodes: days of jobs with the noise healthy GPUs make.

Each node runs job after job (prolog, sometimes a ``slurmhealth check`` by hand while the
job runs, epilog) on a simulated clock, through the same code as the corpus
(:class:`tests.support.detection.SimNode`). Between and during jobs its GPUs do what healthy
GPUs do: correctable ECC errors trickle in, an NVLink replays now and then, PCIe replays at
a low rate, temperatures swing with the load, the SW power cap holds clocks under load, the
PCIe link drops to gen 1 when idle, and jobs hit application Xids (13, 31, 43, 45). Every
drain is a false drain. The scenario of each job is written afresh with the counters the
node has reached, so the simulator evaluates a handful of faults per read.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slurmhealth.config import GpuConfig
from slurmhealth.gpu.scenario import load_scenario
from slurmhealth.model import Severity
from slurmhealth.slurm import NodeInfo
from tests.support.corpus_common import PRESETS, SWITCHES, aer, scenario, sxid, xid_line
from tests.support.corpus_common import fault as set_fault
from tests.support.detection import NODE, Line, SimNode, case_config, toml_text

DAY = 86400.0
TOP_GEN = {"h100-sxm": 5, "a100-sxm4": 4, "v100-sxm2": 3}
LINKS = {"h100-sxm": 18, "a100-sxm4": 12, "v100-sxm2": 6}
APP = {13: "Graphics SM Warp Exception on (GPC 2, TPC 3, SM 1): Out Of Range Address",
       31: "Ch 00000010, intr 10000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ "
           "0x7f2a_12340000. Fault is of type FAULT_PDE ACCESS_TYPE_READ",
       43: "Ch 00000018", 45: "Ch 00000018"}  # fmt: skip


@dataclass
class SoakResult:
    nodes: int = 0
    days: float = 0.0
    runs: Counter[str] = field(default_factory=Counter)  # by phase
    drains: list[dict[str, Any]] = field(default_factory=list)
    alarms: list[dict[str, Any]] = field(default_factory=list)  # failing checks by hand
    warnings: Counter[str] = field(default_factory=Counter)  # by check
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "node_days": round(self.nodes * self.days, 1),
            "runs": dict(self.runs),
            "runs_total": sum(self.runs.values()),
            "drains": len(self.drains),
            "drain_details": self.drains[:20],
            "failing_checks_by_hand": len(self.alarms),
            "warnings_by_check": dict(sorted(self.warnings.items())),
            "wall_s": round(self.wall_s, 1),
        }


class _Gpus:
    """The cumulative error counters of a node's 8 GPUs and how fast each one grows."""

    def __init__(self, rng: random.Random, preset: str) -> None:
        self.preset = preset
        # most GPUs never see a correctable error; a few trickle (1 to 10 an hour)
        self.ecc_rate = [rng.choice([0.0] * 6 + [rng.uniform(1, 10) / 3600]) for _ in range(8)]
        self.pcie_rate = [rng.choice([0.0] * 5 + [rng.uniform(0.2, 2) / 3600]) for _ in range(8)]
        self.ecc = [0.0] * 8
        self.pcie = [0.0] * 8
        self.replays: dict[tuple[int, int], int] = {}

    def base(self) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        for g in range(8):
            out[g] = {
                "ecc_volatile_correctable": int(self.ecc[g]),
                "pcie_replay": int(self.pcie[g]),
            }
        for (g, link), n in self.replays.items():
            out[g][f"nvlink.{link}.replay"] = n
        return out

    def rates(self, at: float) -> list[dict[str, Any]]:
        out = []
        for g in range(8):
            per_s = {"ecc_volatile_correctable": self.ecc_rate[g], "pcie_replay": self.pcie_rate[g]}
            per_s = {k: v for k, v in per_s.items() if v}
            if per_s:
                out.append({"at": at, "gpu": g, "rate": per_s})
        return out

    def advance(self, seconds: float) -> None:
        for g in range(8):
            self.ecc[g] += self.ecc_rate[g] * seconds
            self.pcie[g] += self.pcie_rate[g] * seconds


def _job_faults(rng: random.Random, preset: str, start: float, end: float) -> list[dict[str, Any]]:
    """The job's load: busy GPUs, warm and power-capped, with the job's processes."""
    hot = rng.randint(55, 82)
    busy: dict[str, Any] = {
        "utilization_gpu": rng.randint(70, 100), "utilization_memory": rng.randint(20, 80),
        "memory_used_mib": 30000, "temperature": hot, "pcie_gen": TOP_GEN[preset],
        "clock_event_reasons": ["sw_power_cap"] if rng.random() < 0.5 else [],
    }  # fmt: skip
    if preset != "v100-sxm2":
        busy["margin_temperature"] = max(6, 88 - hot - rng.randint(0, 6))
    faults = [set_fault(start + 30, None, until=end - 10, **busy)]
    for g in range(8):
        procs = [{"pid": 40000 + g, "used_mib": 30000}]
        faults.append(set_fault(start + 30, g, until=end - 5, processes=procs))
    return faults


def _kernel_noise(rng: random.Random, preset: str, start: float, end: float) -> Iterator[Line]:
    """Application Xids in some jobs; rare non-fatal NVSwitch and corrected AER reports."""
    if rng.random() < 0.04:
        g, at = rng.randrange(8), rng.uniform(start + 60, end - 60)
        code = rng.choice([13, 31, 43])
        yield Line(at, xid_line(preset, g, code, APP[code]))
        if code == 13:
            yield Line(at + 1, xid_line(preset, g, 45, APP[45]))
    if preset in SWITCHES and rng.random() < 0.003:
        at = rng.uniform(start, end)
        for text in sxid(SWITCHES[preset][0], 0, 20009, "Non-fatal", "RX Short Error Rate", 28):
            yield Line(at, text)
    if rng.random() < 0.005:
        at = rng.uniform(start, end)
        yield from (
            Line(at, t) for t in aer(preset, rng.randrange(8), "Corrected", "Physical Layer")
        )


def soak_node(root: Path, epoch: float, index: int, days: float, result: SoakResult) -> None:
    """Run one node for ``days`` simulated days; add what happened to ``result``."""
    rng = random.Random(index)
    preset = PRESETS[index % len(PRESETS)]
    gpus = _Gpus(rng, preset)
    node = SimNode(root, epoch)
    lines: list[Line] = []
    t = 0.0
    try:
        while t < days * DAY:
            length = rng.choice([rng.uniform(600, 3600), rng.uniform(3600, 12 * 3600)])
            gap = rng.uniform(2, 30) if rng.random() < 0.7 else rng.uniform(60, 4 * 3600)
            start, end = t, t + length
            faults = _job_faults(rng, preset, start, end) + gpus.rates(start)
            if rng.random() < 0.15:  # one NVLink replay somewhere, once in a while
                g, link = rng.randrange(8), rng.randrange(LINKS[preset])
                n = gpus.replays.get((g, link), 0) + 1
                at = rng.uniform(start, end + gap)
                count: dict[str, Any] = {f"nvlink__{link}__replay": n}
                faults.append(set_fault(at, g, **count))
                gpus.replays[(g, link)] = n
            lines += sorted(_kernel_noise(rng, preset, start, end), key=lambda ln: ln.at)
            idle = {"pcie_gen": 1} if preset != "v100-sxm2" else {}
            data = scenario(preset, all_gpus=idle, gpu=gpus.base(), faults=faults)
            steps = [("prolog", start), ("epilog", end)]
            if rng.random() < 0.05:
                steps.insert(1, ("check", rng.uniform(start + 60, end - 60)))
            _run_job(node, data, steps, lines, result)
            gpus.advance(length + gap)
            t = end + gap
    finally:
        node.close()


def _run_job(
    node: SimNode,
    data: dict[str, Any],
    steps: list[tuple[str, float]],
    lines: list[Line],
    result: SoakResult,
) -> None:
    path = node.root / "scenario.toml"
    path.write_text(toml_text(data))
    # the shipped snapshot deadline (the corpus shortens it so its hung GPUs cost 1 s)
    shipped = GpuConfig().snapshot_timeout_s
    cfg = case_config(node.root, path, node.epoch, {"gpu.snapshot_timeout_s": shipped})
    scn = load_scenario(str(path))
    for phase, at in steps:
        node.write_kernel(lines, at)
        step = node.run(cfg, scn, phase, at, range(8))
        result.runs[phase] += 1
        for f in step.findings:
            if Severity.parse(f["severity"]) == Severity.WARN:
                result.warnings[f["check"]] += 1
        where = {"node": str(node.root.name), "phase": phase, "t": round(at)}
        if step.drain_state == "drained":
            result.drains.append({**where, "reason": step.drain_reason})
            node.slurm.table[NODE] = NodeInfo(NODE, "idle")  # resumed: the soak goes on
        elif phase == "check" and step.status == "fail":
            result.alarms.append({**where, "findings": list(step.findings)})


def _one_node(root: Path, epoch: float, index: int, days: float) -> SoakResult:
    import logging

    result = SoakResult(nodes=1, days=days)
    logging.disable(logging.WARNING)  # the hooks' own warnings; the result counts them
    try:
        soak_node(root / f"node{index:03d}", epoch, index, days, result)
    finally:
        logging.disable(logging.NOTSET)
    return result


def soak(root: Path, epoch: float, nodes: int, days: float, jobs: int = 1) -> SoakResult:
    """``nodes`` healthy nodes for ``days`` simulated days each, ``jobs`` nodes at a time
    (each in a process of its own when ``jobs`` > 1)."""
    from concurrent.futures import ProcessPoolExecutor

    result = SoakResult(nodes=nodes, days=days)
    t0 = time.monotonic()
    args = [(root, epoch, i, days) for i in range(nodes)]
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            parts = list(pool.map(_one_node, *zip(*args, strict=True)))
    else:
        parts = [_one_node(*a) for a in args]
    for part in parts:
        result.runs.update(part.runs)
        result.warnings.update(part.warnings)
        result.drains += part.drains
        result.alarms += part.alarms
    result.wall_s = time.monotonic() - t0
    return result
