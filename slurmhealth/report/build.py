"""The report of one job, built from its facts: pure (facts in, report out; no history,
no Slurm command, no HTTP, no file), so it is the same whichever source the facts came
from. The facts are gathered by :mod:`slurmhealth.report.gather`; :mod:`slurmhealth.report.render`
prints the result for people or as versioned JSON. Times are UTC seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from slurmhealth.checks.straggler import PEERS_BUSY_PCT, stragglers
from slurmhealth.diagnose.engine import verdict
from slurmhealth.diagnose.facts import Diagnosis, Facts, NodeFacts
from slurmhealth.model_records import Job
from slurmhealth.report.answer import Answer, DiagnosisGroup, answer, group_diagnoses
from slurmhealth.report.efficiency import Efficiency, TimelineEntry, collapse, efficiency

if TYPE_CHECKING:  # named for the annotations only: the gathering modules load nothing here
    from slurmhealth.report.incidents import Incident
    from slurmhealth.report.sources import NodeEvidence, PastIncident

SCHEMA = "slurmhealth.report/1"
BAD = ("fail", "critical")


@dataclass(frozen=True)
class Straggler:
    node: str
    gpu: int
    util_mean: float | None
    peer_median: float | None
    source: str  # event (the sidecar saw it) | stats (utilisation over the job)
    text: str


@dataclass(frozen=True)
class Report:
    job: Job
    verdict: str
    failure_ts: float | None
    window_s: float | None
    generated_ts: float
    nodes: tuple[NodeFacts, ...]  # per node: GPU stats, task metrics, rows
    sources: tuple[tuple[str, str, str], ...]  # (node, history | summary, path)
    timeline: tuple[TimelineEntry, ...]
    stragglers: tuple[Straggler, ...]
    diagnoses: tuple[Diagnosis, ...]
    evidence: tuple[NodeEvidence, ...]
    past_incidents: tuple[PastIncident, ...]
    searched: tuple[str, ...]  # every path looked at
    # the knowledge base (`slurmhealth incident add`): (why, incident), linked first
    known_incidents: tuple[tuple[str, Incident], ...] = ()
    answer: Answer | None = None  # verdict, whose fault, next steps
    efficiency: Efficiency | None = None
    groups: tuple[DiagnosisGroup, ...] = ()  # the diagnoses, one per rule and node
    moments: tuple[TimelineEntry, ...] = ()  # the timeline collapsed to what matters
    unreached: tuple[tuple[str, str], ...] = ()  # (source, why) of the sources not used

    @property
    def facts(self) -> Facts:
        return Facts(job=self.job, nodes=self.nodes)


class Read(NamedTuple):
    """What the gathering read besides the facts: where from, and what it matched."""

    sources: tuple[tuple[str, str, str], ...]
    evidence: tuple[NodeEvidence, ...]
    incidents: tuple[PastIncident, ...]
    searched: tuple[str, ...]
    known_incidents: tuple[tuple[str, Incident], ...] = ()


def assemble(
    facts: Facts,
    diagnoses: list[Diagnosis],
    read_from: Read,
    *,
    straggler_ratio: float,
    window_s: float | None,
    now: float,
) -> Report:
    """The report of ``facts``: verdict, timeline (within ``window_s`` of the failure, when
    both are known), stragglers (``straggler_ratio``: ``[sidecar] straggler_ratio``)."""
    timeline = _timeline(facts)
    failure = _failure_ts(timeline, facts.job)
    if window_s is not None and failure is not None:
        timeline = [e for e in timeline if abs(e.ts - failure) <= window_s]
    verdict_text = verdict(diagnoses, facts)
    return Report(
        job=facts.job,
        verdict=verdict_text,
        failure_ts=failure,
        window_s=window_s,
        generated_ts=now,
        nodes=facts.nodes,
        sources=read_from.sources,
        timeline=tuple(timeline),
        stragglers=tuple(_stragglers(facts, straggler_ratio)),
        diagnoses=tuple(diagnoses),
        evidence=read_from.evidence,
        past_incidents=read_from.incidents,
        searched=read_from.searched,
        known_incidents=read_from.known_incidents,
        answer=answer(verdict_text, diagnoses, facts),
        efficiency=efficiency(facts),
        groups=tuple(group_diagnoses(diagnoses)),
        moments=tuple(collapse(timeline)),
    )


def with_stored_verdict(report: Report, stored: Mapping[str, Any] | None) -> Report:
    """The report with the verdict ctld-epilog made at the job's end, from every node's full
    evidence (its AdminComment summary), where one was stored."""
    if not stored or not stored.get("v") or report.answer is None:
        return report
    ans = replace(
        report.answer,
        verdict=stored["v"],
        fault_class=stored["f"],
        confidence=stored["c"] if stored["c"] is not None else report.answer.confidence,
    )
    return replace(report, verdict=stored["v"], answer=ans)  # fmt: skip


def _timeline(facts: Facts) -> list[TimelineEntry]:
    job, out = facts.job, []

    def add(ts: Any, node: str | None, gpu: Any, kind: str, sev: Any, text: str) -> None:
        if ts is not None:
            out.append(TimelineEntry(float(ts), node, gpu, kind, str(sev or "info").lower(), text))

    add(job.start_ts, None, None, "job", "info", "job started")
    for nf in facts.nodes:
        n = nf.node
        for r in nf.runs:
            status, gpus = str(r.get("status") or "?"), r.get("gpus")
            text = f"{r.get('phase', 'check')} {status} on {len(gpus or ())} GPU(s)"
            text += f" in {float(r['duration_s']):.1f} s" if r.get("duration_s") else ""
            text += f": {r['error']}" if r.get("error") else ""
            add(r["ts"], n, None, "run", status if status in ("ok", "warn", "fail") else "", text)
        for f in nf.findings:
            text = f"{f.get('check_name')}: {f.get('message')}"
            text += f" (action {f['action']})" if f.get("action") else ""
            add(f["ts"], n, f.get("gpu"), "finding", f.get("severity"), text)
        for e in nf.events:
            text = f"{e.get('kind')}: {e.get('message')}"
            add(e["ts"], n, e.get("gpu"), "event", e.get("severity"), text)
        for d in nf.drains:
            text = f"{d.get('state')} by {d.get('actor')}: {d.get('reason')}"
            add(d["ts"], n, None, "drain", "fail" if d.get("state") == "drained" else "warn", text)
        t = nf.task
        first, last = (t.samples_per_second_first, t.samples_per_second_last) if t else (None, None)
        if first and last and abs(last - first) / first >= 0.1:
            ts = job.end_ts or max((s[0] for g in nf.gpus for s in g.series[-1:]), default=None)
            text = f"throughput {first:.4g} -> {last:.4g} samples/s ({last / first - 1:+.0%})"
            add(ts, n, None, "task", "warn", text)
    text = f"job ended: {job.state or '?'}" + (f", exit {job.exit_code}" if job.exit_code else "")
    add(job.end_ts, None, None, "job", "fail" if job.state == "failed" else "info", text)
    return sorted(out, key=lambda e: (e.ts, e.node or "", -1 if e.gpu is None else e.gpu))


def _failure_ts(timeline: list[TimelineEntry], job: Job) -> float | None:
    bad = [e.ts for e in timeline if e.severity in BAD and e.kind != "job"]
    if bad:
        return min(bad)
    return job.end_ts if job.end_ts is not None else (timeline[-1].ts if timeline else None)


def _stragglers(facts: Facts, ratio: float) -> list[Straggler]:
    """The sidecar's straggler events, and the GPUs whose mean utilisation over the job is a
    straggler by :func:`slurmhealth.checks.straggler.stragglers` among all the job's GPUs."""
    out: dict[tuple[str, int], Straggler] = {}
    for nf in facts.nodes:
        for e in nf.events:
            if e.get("kind") == "straggler" and e.get("gpu") is not None:
                key = (nf.node, int(e["gpu"]))
                out[key] = Straggler(nf.node, key[1], None, None, "event", str(e.get("message")))
    means = {
        (nf.node, g.gpu): g.util_mean
        for nf in facts.nodes
        for g in nf.gpus
        if g.util_mean is not None
    }
    for s in stragglers(means, ratio, PEERS_BUSY_PCT):
        (node, gpu), median = s.gpu, s.peers_median
        text = f"mean utilisation {s.value:.0f}% vs the peers' median {median:.0f}%"
        old = out.get(s.gpu)
        out[s.gpu] = Straggler(node, gpu, s.value, median, old.source if old else "stats", text)
    return [out[k] for k in sorted(out)]
