"""The sweep's verdict, a pure function of its results: which node, link or NVLink/GPU is
to blame, with the evidence (the pair table) and a confidence.

Per test (nccl, ib) each unit (a node alone, a pair) is judged against a reference:
``[baseline.pinned]`` when set, else for single-node tests the median over the nodes and for
pairs the median over the nodes of each node's typical pair: its *best* when it met fewer
than 4 partners (a node's best pair is slow only when the node itself is, so the reference
stays right when a bad node drags down most pairs of a small set), the median of its pairs
with 4 or more (the best of many is inflated by the noise). A unit is slow below
``slow_fraction`` of it; a failed test counts as 0.
Every attempt must be slow (``confirmed`` once repeated); slow once, fine once is ``flaky``.

- intra: a node slow alone (its NVLink/GPUs); its pairs are explained by it.
- node: slow with at least ``min_partners`` different partners and with most of the
  partners it met (pairs an accused node explains are left out, worst node first).
- link: a slow pair neither node explains; both nodes fine with other partners.

No suspect at all when most tests failed (the tool, not the nodes) or when the suspects
would hold more than half the nodes (a fabric-wide fault or a wrong reference).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from slurmhealth.sweep.model import UNITS, Result, unit_key

SLOW_FRACTION = 0.85
MIN_PARTNERS = 2
PARTNERS_FOR_MEDIAN = 4


@dataclass(frozen=True)
class UnitVerdict:
    """One unit (node alone or pair) of one test: every attempt, and how it reads."""

    test: str
    nodes: tuple[str, ...]
    values: tuple[float | None, ...]  # per attempt; None: measured nothing
    reference: float | None
    status: str  # ok | slow | flaky | failed | unjudged (no reference)
    job_ids: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    hcas: Mapping[str, float] = field(default_factory=dict)  # ib: the slowest attempt's

    @property
    def attempts(self) -> int:
        return len(self.values)

    @property
    def value(self) -> float | None:
        got = [v for v in self.values if v is not None]
        return statistics.median(got) if got else None

    @property
    def ratio(self) -> float | None:
        v = self.value
        return None if v is None or not self.reference else v / self.reference

    @property
    def confirmed(self) -> bool:
        return self.status in ("slow", "failed") and self.attempts >= 2

    def row(self) -> dict[str, Any]:
        """The evidence row: nodes, value, share of the reference, status, jobs."""
        r = self.ratio
        return {"test": self.test, "nodes": list(self.nodes), "value": _round(self.value),
                "unit": UNITS.get(self.test, ""), "reference": _round(self.reference),
                "ratio": None if r is None else round(r, 3), "status": self.status,
                "attempts": self.attempts, "values": [_round(v) for v in self.values],
                "job_ids": list(self.job_ids), "errors": list(self.errors),
                "hcas": {k: _round(v) for k, v in self.hcas.items()}}  # fmt: skip


@dataclass(frozen=True)
class Suspect:
    kind: str  # node | link | intra
    nodes: tuple[str, ...]
    tests: tuple[str, ...]
    confidence: float
    summary: str
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "nodes": list(self.nodes), "tests": list(self.tests),
                "confidence": self.confidence, "summary": self.summary,
                "evidence": dict(self.evidence)}  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    units: tuple[UnitVerdict, ...]
    suspects: tuple[Suspect, ...]
    references: Mapping[str, float]  # "nccl.intra" / "nccl.pair" / "ib.pair" -> value
    inconclusive: str = ""

    def partners(self) -> dict[str, set[str]]:
        """Every node's partners in any pair test."""
        met: dict[str, set[str]] = {}
        for u in self.units:
            if len(u.nodes) == 2:
                a, b = u.nodes
                met.setdefault(a, set()).add(b)
                met.setdefault(b, set()).add(a)
        return met

    def touched(self) -> set[str]:
        """Nodes in a unit that is slow or failed."""
        return {n for u in self.units if u.status in ("slow", "failed") for n in u.nodes}

    def to_dict(self) -> dict[str, Any]:
        return {"suspects": [s.to_dict() for s in self.suspects],
                "inconclusive": self.inconclusive or None,
                "references": dict(self.references),
                "units": [u.row() for u in self.units]}  # fmt: skip


def judge(
    results: Iterable[Result],
    *,
    slow_fraction: float = SLOW_FRACTION,
    pinned: Mapping[str, float] | None = None,
    min_partners: int = MIN_PARTNERS,
    switches: Mapping[str, str] | None = None,
) -> Verdict:
    """The verdict over ``results`` (all tests, all attempts). ``pinned`` maps a metric
    (``all_reduce_perf.busbw@8589934592``) or ``test.intra`` / ``test.pair`` to a fixed
    reference; ``switches`` maps a node to its leaf switch (Slurm's topology) when known."""
    by_test: dict[str, list[Result]] = {}
    for r in results:
        by_test.setdefault(r.test, []).append(r)
    units: list[UnitVerdict] = []
    refs: dict[str, float] = {}
    suspects: list[Suspect] = []
    for test in sorted(by_test):
        mine, test_refs = _units(test, by_test[test], slow_fraction, pinned or {})
        units += mine
        refs.update(test_refs)
        suspects += _suspects(mine, min_partners, switches or {})
    nodes = {n for u in units for n in u.nodes}
    why = _inconclusive(units, suspects, nodes, refs)
    final = () if why else tuple(_switch_paths(_merge(suspects), units, switches or {}))
    return Verdict(tuple(units), final, refs, why)


def _switch_paths(
    suspects: list[Suspect], units: list[UnitVerdict], switches: Mapping[str, str]
) -> list[Suspect]:
    """Link suspects that share a pair of leaf switches (2 or more) name that path: a
    spine link or a switch port between them, not a node's cable."""

    def path(nodes: Sequence[str]) -> tuple[str, ...] | None:
        got = [switches.get(n) for n in nodes]
        return tuple(sorted(g for g in got if g)) if all(got) else None

    groups: dict[tuple[str, ...], int] = {}
    for s in suspects:
        key = path(s.nodes) if s.kind == "link" else None
        if key is not None:
            groups[key] = groups.get(key, 0) + 1
    out = []
    for s in suspects:
        key = path(s.nodes) if s.kind == "link" else None
        if key is None or groups[key] < 2:
            out.append(s)
            continue
        tested = {u.nodes for u in units if len(u.nodes) == 2 and path(u.nodes) == key}
        where = " and ".join(dict.fromkeys(key))
        note = f"{groups[key]} of {len(tested)} pairs tested between {where} slow: the switch path"
        found = {"switches": list(key), "slow_pairs": groups[key], "pairs_tested": len(tested)}
        evidence = {**s.evidence, "switch_path": found}
        out.append(Suspect(s.kind, s.nodes, s.tests, s.confidence, f"{s.summary}; {note}",
                           evidence))  # fmt: skip
    return out


def _units(
    test: str, results: list[Result], slow: float, pinned: Mapping[str, float]
) -> tuple[list[UnitVerdict], dict[str, float]]:
    groups: dict[tuple[str, ...], list[Result]] = {}
    for r in sorted(results, key=lambda r: (r.attempt, r.round, r.ts)):
        groups.setdefault(unit_key(r.nodes), []).append(r)
    refs: dict[str, float] = {}
    for kind, size in (("intra", 1), ("pair", 2)):
        ref = _reference(test, kind, [g for k, g in groups.items() if len(k) == size], pinned)
        if ref:
            refs[f"{test}.{kind}"] = ref
    out = []
    for key, tries in sorted(groups.items(), key=lambda kv: (len(kv[0]), kv[0])):
        ref = refs.get(f"{test}.{'intra' if len(key) == 1 else 'pair'}")
        values = tuple(r.value for r in tries)
        jobs = tuple(r.job_id for r in tries if r.job_id)
        errors = tuple(r.error for r in tries if r.error)
        status = _status(values, ref, slow)
        out.append(UnitVerdict(test, key, values, ref, status, jobs, errors, _worst_hcas(tries)))
    return out, refs


def _reference(
    test: str, kind: str, groups: list[list[Result]], pinned: Mapping[str, float]
) -> float | None:
    metrics = {r.metric for g in groups for r in g if r.metric}
    for key in (f"{test}.{kind}", *sorted(metrics)):
        if isinstance(pinned.get(key), int | float) and pinned[key] > 0:
            return float(pinned[key])
    of: dict[str, list[float]] = {}
    for g in groups:
        got = [r.value for r in g if r.value is not None and r.value > 0]
        for n in g[0].nodes if got else ():
            of.setdefault(n, []).append(statistics.median(got))
    # a node's typical value: its best with few partners (a bad partner may be half of
    # them), the median of them with 4 or more (the best of many is inflated by noise)
    typical = [
        max(v) if len(v) < PARTNERS_FOR_MEDIAN else statistics.median(v) for v in of.values()
    ]
    if len([g for g in groups if any(r.value for r in g)]) < 2:
        return None  # one unit is its own reference: unjudged without a pinned one
    return statistics.median(typical) if typical else None


def _status(values: Sequence[float | None], ref: float | None, slow: float) -> str:
    if all(v is None for v in values):
        return "failed"
    if ref is None:
        return "unjudged"
    low = [v is None or v < slow * ref for v in values]
    return "slow" if all(low) else "flaky" if any(low) else "ok"


def _worst_hcas(tries: list[Result]) -> dict[str, float]:
    with_hcas = [r for r in tries if r.hcas]
    return dict(min(with_hcas, key=lambda r: min(r.hcas.values())).hcas) if with_hcas else {}


def _bad(u: UnitVerdict) -> bool:
    return u.status in ("slow", "failed")


def _suspects(
    units: list[UnitVerdict], min_partners: int, switches: Mapping[str, str]
) -> list[Suspect]:
    pairs = [u for u in units if len(u.nodes) == 2]
    of: dict[str, list[UnitVerdict]] = {}
    for p in pairs:
        for n in p.nodes:
            of.setdefault(n, []).append(p)
    out = [_intra(u, of.get(u.nodes[0], [])) for u in units if len(u.nodes) == 1 and _bad(u)]
    explained = {id(p) for s in out for p in of.get(s.nodes[0], [])}
    accused = {s.nodes[0] for s in out}
    while True:
        best = _worst_node(of, explained, accused, min_partners)
        if best is None:
            break
        node, slow, share = best
        mine = [p for p in of[node] if id(p) not in explained]
        out.append(_node(node, slow, share, mine))
        explained |= {id(p) for p in mine}
        accused.add(node)
    for p in pairs:
        if _bad(p) and id(p) not in explained:
            out.append(_link(p, of, switches))
    return out


def _worst_node(
    of: Mapping[str, list[UnitVerdict]], explained: set[int], accused: set[str], min_partners: int
) -> tuple[str, int, float] | None:
    """The node with the largest share of slow partners, when it qualifies (only nodes in
    a slow pair can)."""
    found = []
    candidates = {n for ps in of.values() for p in ps if _bad(p) for n in p.nodes}
    for node in sorted(candidates - accused):
        mine = [p for p in of[node] if id(p) not in explained]
        slow = sum(1 for p in mine if _bad(p))
        if mine and slow >= min_partners and slow / len(mine) > 0.5:
            found.append((slow / len(mine), slow, node))
    if not found:
        return None
    share, slow, node = min(found, key=lambda f: (-f[0], -f[1], f[2]))
    return node, slow, share


def _intra(u: UnitVerdict, mine: list[UnitVerdict]) -> Suspect:
    node = u.nodes[0]
    conf = 0.9 if u.confirmed else 0.6
    return Suspect("intra", u.nodes, (u.test,), conf,
                   f"{node} alone: {_share(u)} (NVLink/GPUs)",
                   {"unit": u.row(), "pairs": [p.row() for p in mine]})  # fmt: skip


def _node(node: str, slow: int, share: float, mine: list[UnitVerdict]) -> Suspect:
    bad = [p for p in mine if _bad(p)]
    confirmed = sum(1 for p in bad if p.confirmed) >= min(2, len(bad))
    conf = round(share * min(1.0, slow / 3) * (1.0 if confirmed else 0.7), 2)
    partners = ", ".join(f"{_other(p, node)} {_share(p)}" for p in bad)
    return Suspect("node", (node,), (mine[0].test,), conf,
                   f"{node}: slow with {slow} of {len(mine)} partners ({partners})",
                   {"pairs": [p.row() for p in mine]})  # fmt: skip


def _link(
    p: UnitVerdict, of: Mapping[str, list[UnitVerdict]], switches: Mapping[str, str]
) -> Suspect:
    a, b = p.nodes
    fine = {x: [q for q in of[x] if q is not p and not _bad(q)] for x in (a, b)}
    conf = min(1.0, (len(fine[a]) + len(fine[b])) / 4) * (1.0 if p.confirmed else 0.7)
    note = ""
    if not fine[a] or not fine[b]:
        conf *= 0.5
        lone = ", ".join(x for x in (a, b) if not fine[x])
        note = f"; {lone} met no other partner that was fine: may be the node"
    near = {id(q): q for q in [*of[a], *of[b]]}
    evidence: dict[str, Any] = {"pair": p.row(), "pairs": [q.row() for q in near.values()]}
    if p.hcas:
        evidence["hcas"] = {k: _round(v) for k, v in sorted(p.hcas.items(), key=lambda kv: kv[1])}
    if a in switches or b in switches:
        evidence["switches"] = {a: switches.get(a), b: switches.get(b)}
    where = _path(a, b, p, switches)
    fines = f"{a} fine with {len(fine[a])}, {b} with {len(fine[b])} other partners"
    return Suspect("link", p.nodes, (p.test,), round(conf, 2),
                   f"link {a}-{b}{where}: {_share(p)}; {fines}{note}", evidence)  # fmt: skip


def _path(a: str, b: str, p: UnitVerdict, switches: Mapping[str, str]) -> str:
    hca = f" HCA {min(p.hcas, key=lambda k: p.hcas[k])}" if p.hcas else ""
    sa, sb = switches.get(a), switches.get(b)
    if sa and sb:
        return f"{hca} (switch {sa})" if sa == sb else f"{hca} (switches {sa} - {sb})"
    return hca


def _merge(suspects: list[Suspect]) -> list[Suspect]:
    """One suspect per (kind, nodes) over the tests, most confident first."""
    merged: dict[tuple[str, tuple[str, ...]], Suspect] = {}
    for s in suspects:
        key = (s.kind, s.nodes)
        old = merged.get(key)
        if old is None:
            merged[key] = s
            continue
        ev = {**old.evidence, **{f"{t}.{k}": v for t in s.tests for k, v in s.evidence.items()}}
        merged[key] = Suspect(s.kind, s.nodes, (*old.tests, *s.tests),
                              max(old.confidence, s.confidence),
                              f"{old.summary}; {s.summary}", ev)  # fmt: skip
    order = {"intra": 0, "node": 1, "link": 2}
    return sorted(merged.values(), key=lambda s: (-s.confidence, order[s.kind], s.nodes))


def _inconclusive(
    units: list[UnitVerdict], suspects: list[Suspect], nodes: set[str], refs: Mapping[str, float]
) -> str:
    if not units:
        return "no test ran"
    failed = sum(1 for u in units if u.status == "failed")
    if failed * 2 > len(units):
        return (f"{failed} of {len(units)} tests measured nothing: the test program or the "
                "job setup, not the nodes (see the errors)")  # fmt: skip
    if not refs:
        return "no reference: no test measured a bandwidth"
    blamed = {n for s in suspects if s.kind != "link" for n in s.nodes}
    if len(nodes) >= 4 and len(blamed) * 2 > len(nodes):
        return (f"{len(blamed)} of {len(nodes)} nodes look slow: a fabric-wide fault or a "
                "wrong reference, not single nodes")  # fmt: skip
    return ""


def _other(p: UnitVerdict, node: str) -> str:
    return p.nodes[1] if p.nodes[0] == node else p.nodes[0]


def _share(u: UnitVerdict) -> str:
    r = u.ratio
    if r is None:
        return "measured nothing"
    return f"{u.value:.1f} {UNITS.get(u.test, '')} = {r:.0%} of {u.reference:.1f}"


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)
