"""Node-level series: what a node's one scrape target says whether or not a job runs.

Its health state, its last check per phase, slurmhealth's drain in force with the check
that caused it, prolog/epilog/healthcheck runs by result, drains by state, fail-opens by
cause (the hook wrappers' log: the one record that exists when slurmhealth itself cannot
start), the sidecars running, dead or stale, and whether the config loads.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from slurmhealth.errors import StoreError
from slurmhealth.history import node_queries
from slurmhealth.history.reader import open_reader

P = "slurmhealth_"
HEALTH_STATES = ("healthy", "degraded", "failing", "drained", "unknown")
_HEALTH_OF = {"ok": "healthy", "warn": "degraded", "fail": "failing"}
RESULT_VALUE = {"ok": 0.0, "warn": 1.0, "fail": 2.0}
_REASON_CHECK = re.compile(r"slurmhealth:\s*([A-Za-z0-9_.-]{1,64})")
_FAIL_OPEN = re.compile(rb"\s*(\d+(?:\.\d+)?)\s+(prolog|epilog)\s+([a-z_]{1,32})(?:\s|$)")
FAIL_OPEN_TAIL = 4 * 1024 * 1024  # bytes of the fail-open log read (the newest)


@dataclass
class NodeFacts:
    node: str
    config_valid: bool = True
    history_ok: bool = True
    last_checks: list[node_queries.LastCheck] = field(default_factory=list)
    runs: dict[tuple[str, str], int] = field(default_factory=dict)
    drains: dict[str, int] = field(default_factory=dict)
    drain: node_queries.DrainInForce | None = None
    fail_opens: Counter[tuple[str, str]] = field(default_factory=Counter)
    sidecars: dict[str, int] = field(default_factory=dict)  # running | dead | stale
    remediation: node_queries.RemediationState | None = None

    @property
    def health(self) -> str:
        if self.drain is not None:
            return "drained"
        newest = max(self.last_checks, key=lambda c: c.ts, default=None)
        if newest is None:
            return "unknown"
        return _HEALTH_OF.get(newest.status, "unknown")


def read_history(facts: NodeFacts, db_path: str) -> None:
    """Fill ``facts`` from the node's history; a history that cannot be read leaves
    ``history_ok`` False (an alert), never an exception out of a scrape."""
    if not os.path.exists(db_path):
        return  # no hook ran yet: nothing to say, nothing wrong
    reader = open_reader(db_path)
    if reader is None:
        facts.history_ok = False
        return
    try:
        facts.last_checks = node_queries.last_checks(reader, facts.node)
        facts.runs = node_queries.hook_run_counts(reader, facts.node)
        facts.drains = node_queries.drain_state_counts(reader, facts.node)
        facts.drain = node_queries.drain_in_force(reader, facts.node)
        facts.remediation = node_queries.remediation_state(reader, facts.node)
    except StoreError:
        facts.history_ok = False
    finally:
        reader.close()


def read_fail_opens(path: str) -> Counter[tuple[str, str]]:
    """Lines ``<unix time> <prolog|epilog> <cause> [job]`` the hook wrappers append when
    they fail open, counted by (hook, cause); the newest :data:`FAIL_OPEN_TAIL` bytes.
    A rotated log restarts the counters (Prometheus treats that as a counter reset)."""
    counts: Counter[tuple[str, str]] = Counter()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return counts
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        fh.seek(max(0, size - FAIL_OPEN_TAIL))
        data = fh.read(FAIL_OPEN_TAIL)
    lines = data.split(b"\n")
    if size > FAIL_OPEN_TAIL:
        lines = lines[1:]  # the first may be cut
    for line in lines:
        if m := _FAIL_OPEN.match(line):
            counts[(m.group(2).decode(), m.group(3).decode())] += 1
    return counts


def drain_check(reason: str) -> str:
    """The check a ``slurmhealth: <check> gpu<i> ...`` drain reason names, or ""."""
    m = _REASON_CHECK.search(reason)
    return m.group(1) if m else ""


def _g(name: str, doc: str, labels: tuple[str, ...]) -> GaugeMetricFamily:
    return GaugeMetricFamily(P + name, doc, labels=labels)


def _c(name: str, doc: str, labels: tuple[str, ...]) -> CounterMetricFamily:
    return CounterMetricFamily(P + name, doc, labels=labels)


def node_families(facts: NodeFacts) -> Iterator[Metric]:
    node = facts.node
    state = _g("node_health_state", "1 for the node's current health state (drained: by "
               "slurmhealth; else the newest check's result).", ("node", "state"))  # fmt: skip
    for s in HEALTH_STATES:
        state.add_metric((node, s), 1.0 if facts.health == s else 0.0)
    yield state
    yield from _check_families(facts)
    drained = _g("node_drained", "1 while slurmhealth's drain of the node is in force; "
                 "`check` is the check its reason names.", ("node", "check"))  # fmt: skip
    since = _g("node_drained_since_timestamp_seconds", "Unix time slurmhealth drained the "
               "node (only while drained).", ("node", "check"))  # fmt: skip
    if facts.drain is not None:
        check = drain_check(facts.drain.reason)
        drained.add_metric((node, check), 1.0)
        since.add_metric((node, check), facts.drain.ts)
    else:
        drained.add_metric((node, ""), 0.0)
    yield from (drained, since)
    drains = _c("node_drains", "drains rows by state: drained, suppressed (the circuit "
                "breaker held it back), resumed, ...", ("node", "state"))  # fmt: skip
    for s, n in sorted(facts.drains.items()):
        drains.add_metric((node, s), n)
    yield drains
    yield from _remediation_families(facts)
    yield from _process_families(facts)


def _remediation_families(facts: NodeFacts) -> Iterator[Metric]:
    node, state = facts.node, facts.remediation
    steps = _c("remediations", "Remediation steps (docs/remediation.md) by action (reset, "
               "validate, reboot, resume, service_required) and outcome.",
               ("node", "action", "outcome"))  # fmt: skip
    busy = _g("remediation_in_progress", "1 while a remediation step of the node is under "
              "way (a reboot not yet validated).", ("node",))  # fmt: skip
    service = _g("node_service_required", "1 while remediation gave up on the node: drained "
                 "\"slurmhealth: service required\" until a person repairs and resumes it.",
                 ("node",))  # fmt: skip
    for (action, outcome), n in sorted((state.counts if state else {}).items()):
        steps.add_metric((node, action, outcome), n)
    busy.add_metric((node,), 1.0 if state and state.in_progress else 0.0)
    service.add_metric((node,), 1.0 if state and state.service_required else 0.0)
    yield from (steps, busy, service)


def _check_families(facts: NodeFacts) -> Iterator[Metric]:
    node = facts.node
    ts = _g("node_last_check_timestamp_seconds", "Unix time of the newest check run, by "
            "phase (prolog, epilog, healthcheck, ...).", ("node", "phase"))  # fmt: skip
    result = _g("node_last_check_result", "The newest check run's result by phase: 0 ok, "
                "1 warn, 2 fail.", ("node", "phase"))  # fmt: skip
    for c in facts.last_checks:
        ts.add_metric((node, c.phase), c.ts)
        if c.status in RESULT_VALUE:
            result.add_metric((node, c.phase), RESULT_VALUE[c.status])
    runs = _c("hook_runs", "Check runs the node's history holds, by phase and result.",
              ("node", "phase", "status"))  # fmt: skip
    for (phase, status), n in sorted(facts.runs.items()):
        runs.add_metric((node, phase, status), n)
    yield from (ts, result, runs)


def _process_families(facts: NodeFacts) -> Iterator[Metric]:
    node = facts.node
    fail = _c("fail_opens", "Times a prolog/epilog wrapper let the job through unchecked, by "
              "cause: timeout, config (slurmhealth exited 2), crash, missing.",
              ("node", "hook", "cause"))  # fmt: skip
    for (hook, cause), n in sorted(facts.fail_opens.items()):
        fail.add_metric((node, hook, cause), n)
    sidecars = _g("sidecars", "Job sidecars on the node: running, dead (crashed: their "
                  "job's series are dropped), stale (alive but not writing).",
                  ("node", "state"))  # fmt: skip
    for s in ("running", "dead", "stale"):
        sidecars.add_metric((node, s), facts.sidecars.get(s, 0))
    config = _g("config_valid", "1 when the node's slurmhealth config loads; 0: every hook "
                "fails open until it is fixed (slurmhealth config check).", ("node",))  # fmt: skip
    config.add_metric((node,), 1.0 if facts.config_valid else 0.0)
    history = _g("history_readable", "1 when the node's history database can be read.",
                 ("node",))  # fmt: skip
    history.add_metric((node,), 1.0 if facts.history_ok else 0.0)
    yield from (fail, sidecars, config, history)
