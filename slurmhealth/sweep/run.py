"""``slurmhealth sweep``: what runs when. Plan the rounds, submit each round's jobs (bounded
concurrency, each with a time limit), read their outputs, judge, follow up on what looked
slow (a repeat, a fresh partner), judge again; store the record and the measurements in
this host's history; with ``drain`` take the node suspects out (the prolog's drain etiquette
and circuit breaker, reason ``slurmhealth: sweep: ...``). Internal trouble fails open: a
sweep whose tests mostly failed names nobody and drains nothing.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from slurmhealth.config import Config
from slurmhealth.errors import StoreError, UsageError
from slurmhealth.slurm import BatchJob, NodeInfo, SlurmBackend
from slurmhealth.sweep import ingest, plan, submit
from slurmhealth.sweep.model import Planned, Result
from slurmhealth.sweep.verdict import Verdict, judge

log = logging.getLogger("slurmhealth.sweep")
SCHEMA = "slurmhealth.sweep/1"
EVIDENCE_DAYS = 7.0
DRAIN_MIN_CONFIDENCE = 0.5


class SweepSlurm(submit.BatchSlurm, SlurmBackend, Protocol):
    def leaf_switches(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class Settings:
    nodes: tuple[str, ...]
    tests: tuple[str, ...] = ("nccl",)
    template: str = ""
    output_dir: str = ""
    partition: str = ""
    commands: Mapping[str, str] = field(default_factory=dict)  # test -> program
    gpus_per_node: int = 8
    hcas: tuple[str, ...] = ()
    time_min: int = 10
    max_jobs: int = 64
    rounds: int | None = None
    slow_fraction: float = 0.85
    drain: bool = False
    env: Mapping[str, str] = field(default_factory=dict)  # more for the job script

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": list(self.nodes), "tests": list(self.tests), "template": self.template,
                "output_dir": self.output_dir, "partition": self.partition,
                "commands": dict(self.commands), "gpus_per_node": self.gpus_per_node,
                "hcas": list(self.hcas), "time_min": self.time_min, "max_jobs": self.max_jobs,
                "rounds": self.rounds, "slow_fraction": self.slow_fraction,
                "drain": self.drain}  # fmt: skip


def new_id(now: float) -> str:
    """``20261202-151502-3fa9``: UTC time and 4 random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + "-" + secrets.token_hex(2)


def usable_nodes(slurm: SlurmBackend, wanted: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """The nodes a test job can run on, and the others with why (drained, down, unknown)."""
    known: dict[str, NodeInfo] = {n.name: n for n in slurm.nodes()}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise UsageError(f"--nodes: not nodes of this cluster: {', '.join(unknown[:10])}")
    skipped = {}
    for n in wanted:
        state = known[n].state
        if known[n].drained or state.startswith(("down", "fail")) or state.endswith("*"):
            skipped[n] = f"{state}" + (f": {known[n].reason}" if known[n].reason else "")
    return [n for n in wanted if n not in skipped], skipped


def run_sweep(
    cfg: Config,
    settings: Settings,
    slurm: SweepSlurm,
    waiter: submit.Waiter | None = None,
    progress: Callable[[str], None] = lambda _line: None,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """Run the sweep; the record that is stored and printed (``--json``)."""
    started = clock()
    nodes, skipped = usable_nodes(slurm, settings.nodes)
    if len(nodes) < 2:
        raise UsageError(f"a sweep needs at least 2 usable nodes, got {len(nodes)}"
                         + (f" (skipped: {', '.join(skipped)})" if skipped else ""))  # fmt: skip
    sweep_id = new_id(started)
    outdir = submit.make_output_dir(os.path.join(settings.output_dir, sweep_id))
    switches = slurm.leaf_switches()
    pinned = _pinned(cfg)

    def measure(batch: list[Planned]) -> list[Result]:
        return _run_round(settings, slurm, batch, sweep_id, outdir, waiter, clock)

    def judge_all(results: list[Result]) -> Verdict:
        return judge(results, slow_fraction=settings.slow_fraction, switches=switches,
                     pinned=pinned)  # fmt: skip

    driven = plan.drive(nodes, settings.tests, settings.rounds, measure, judge_all, progress)
    results, jobs, rounds = driven.results, driven.jobs, driven.rounds
    verdict = _with_history(cfg, driven.verdict, clock())
    record = {"schema": SCHEMA, "id": sweep_id, "started": started, "ended": clock(),
              "settings": settings.to_dict(), "nodes": nodes, "skipped": skipped,
              "switches": switches, "jobs": jobs, "rounds": rounds,
              "output_dir": outdir, "results": [r.to_dict() for r in results],
              **verdict.to_dict()}  # fmt: skip
    record["drains"] = _drains(cfg, slurm, verdict, sweep_id) if settings.drain else []
    _store(cfg, sweep_id, record, results, outdir)
    return record


def _run_round(
    settings: Settings,
    slurm: SweepSlurm,
    batch: list[Planned],
    sweep_id: str,
    outdir: str,
    waiter: submit.Waiter | None,
    clock: Callable[[], float],
) -> list[Result]:
    jobs = [_batch_job(settings, t, sweep_id, outdir) for t in batch]
    outcomes = submit.run_jobs(slurm, jobs, settings.max_jobs, waiter or submit.Waiter())
    now = clock()
    out = []
    for t, o in zip(batch, outcomes, strict=True):
        out += ingest.results_of(t, o.job_id, o.state, o.text, o.error, now)
    return out


def _batch_job(settings: Settings, t: Planned, sweep_id: str, outdir: str) -> BatchJob:
    tag = "-".join(t.nodes)
    env = {"SWEEP_TESTS": " ".join(t.tests), "SWEEP_GPUS": str(settings.gpus_per_node),
           **({"SWEEP_NCCL": settings.commands["nccl"]} if "nccl" in settings.commands else {}),
           **({"SWEEP_IB": settings.commands["ib"]} if "ib" in settings.commands else {}),
           **({"SWEEP_HCAS": " ".join(settings.hcas)} if settings.hcas else {}),
           **settings.env}  # fmt: skip
    return BatchJob(
        script=settings.template,
        nodes=t.nodes,
        name=f"slurmhealth-sweep-{sweep_id}",
        time_min=settings.time_min,
        output=os.path.join(outdir, f"r{t.round}-a{t.attempt}-{tag}-%j.out"),
        partition=settings.partition,
        gpus_per_node=settings.gpus_per_node,
        tasks_per_node=settings.gpus_per_node if len(t.nodes) > 1 else 1,
        env=env,
    )


def _pinned(cfg: Config) -> dict[str, float]:
    """``[baseline.pinned]`` numbers ("kind.metric" or "metric" keys, both kept)."""
    out: dict[str, float] = {}
    for key, value in cfg.baseline.pinned.items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = float(value)
            out[key.split(".", 1)[1] if key.startswith(("nccl.", "perftest.")) else key] = value
    return out


def _with_history(cfg: Config, verdict: Verdict, now: float) -> Verdict:
    """Each node or intra suspect with the warnings and failures its own history holds
    from the last days (its GPUs, its HCAs): read only, fail open."""
    suspects = []
    for s in verdict.suspects:
        seen: list[dict[str, Any]] = []
        for node in s.nodes:
            seen += [{"node": node, **f} for f in _findings(cfg, node, now)]
        suspects.append(replace(s, evidence={**s.evidence, "history": seen}) if seen else s)
    return replace(verdict, suspects=tuple(suspects))


def _findings(cfg: Config, node: str, now: float) -> list[dict[str, Any]]:
    from slurmhealth.history.read import Reader, history_paths
    from slurmhealth.history.sweeps import node_findings

    since = now - EVIDENCE_DAYS * 86400
    for path in history_paths(cfg, [node], discover=False):
        try:
            with Reader(path) as db:
                found = node_findings(db, node, since)
        except StoreError as exc:
            log.warning("%s: %s", path, exc)
            continue
        if found:
            return found
    return []


def _drains(
    cfg: Config, slurm: SweepSlurm, verdict: Verdict, sweep_id: str
) -> list[dict[str, Any]]:
    """Drain each node and intra suspect (confidence >= 0.5; a link is never drained: both
    of its nodes are fine with others), one at a time through the circuit breaker."""
    from slurmhealth.hooks.drain import drain_node

    out = []
    for s in verdict.suspects:
        if s.kind == "link" or s.confidence < DRAIN_MIN_CONFIDENCE:
            continue
        node = s.nodes[0]
        reason = f"slurmhealth: sweep: {s.kind} {s.summary}"
        outcome = drain_node(cfg, slurm, node, [], reason=reason)
        row = {"node": node, "state": outcome.state, "reason": outcome.reason,
               "detail": outcome.detail}  # fmt: skip
        out.append(row)
        _record_drain(cfg, node, row, sweep_id)
    return out


def _record_drain(cfg: Config, node: str, row: Mapping[str, Any], sweep_id: str) -> None:
    from slurmhealth.history import History, records
    from slurmhealth.history.rows import drain_row

    try:
        with History.for_node(cfg, node) as history:
            history.write(records.batch([records.drain(drain_row(
                time.time(), node, str(row["state"]), str(row["reason"]), "slurmhealth sweep",
                {"note": row["detail"], "sweep": sweep_id}))]))  # fmt: skip
    except (StoreError, OSError) as exc:
        log.error("%s: the drain could not be recorded: %s", node, exc)


def _store(
    cfg: Config, sweep_id: str, record: Mapping[str, Any], results: list[Result], outdir: str
) -> None:
    from slurmhealth.history import History
    from slurmhealth.history.sweeps import add_sweep

    rows = ingest.baseline_rows(results, sweep_id, source=outdir + " ")
    try:
        with History.for_node(cfg) as history:
            history.refuse_newer()
            add_sweep(history, sweep_id, record, rows)
    except (StoreError, OSError) as exc:
        log.error("sweep %s: not stored in the history: %s", sweep_id, exc)
