"""Which tests run when: each node alone, then pairs in rounds, then the follow-ups.

A round is a perfect matching (the circle method of a round-robin tournament): every node
is in exactly one pair per round (with an odd count one node sits the round out), so a round
takes one test's time however many nodes there are. ``R`` rounds give each node ``R``
different partners with ``R * N / 2`` pair jobs, against ``N * (N - 1) / 2`` for every pair.
Follow-ups repeat each unit that looked slow (nothing is accused on one measurement) and
give an endpoint of a slow pair a fresh partner when it has met too few to tell a bad node
from a bad link.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from slurmhealth.sweep.model import Planned, Result, unit_key
from slurmhealth.sweep.verdict import Verdict

DEFAULT_MAX_ROUNDS = 5
MAX_STAGES = 4  # the base plan, repeats and fresh partners, their repeats, a link's third
MIN_PARTNERS = 3  # an endpoint of a slow pair with fewer gets a fresh partner
REPEATS_PER_NODE = 2  # confirmed slow pairs that make a node suspect beyond doubt


def default_rounds(n: int) -> int:
    """Rounds for ``n`` nodes: every pair when that is at most :data:`DEFAULT_MAX_ROUNDS`
    rounds, else that many (each node then meets 5 partners; 4 in a round it sits out)."""
    if n < 2:
        return 0
    return min(n - 1 if n % 2 == 0 else n, DEFAULT_MAX_ROUNDS)


def matching_rounds(nodes: Sequence[str], rounds: int) -> list[list[tuple[str, str]]]:
    """``rounds`` perfect matchings of ``nodes`` (circle method), no pair twice: at most
    ``N - 1`` rounds for an even ``N``, ``N`` for an odd one (a bye each round)."""
    ring: list[str | None] = list(nodes)
    if len(ring) % 2:
        ring.append(None)  # the bye
    n = len(ring)
    out: list[list[tuple[str, str]]] = []
    for _ in range(min(rounds, n - 1)):
        pairs = []
        for i in range(n // 2):
            a, b = ring[i], ring[n - 1 - i]
            if a is not None and b is not None:
                pairs.append((a, b) if a < b else (b, a))
        out.append(pairs)
        ring = [ring[0], ring[-1], *ring[1:-1]]  # keep the first, rotate the rest
    return out


def base_plan(
    nodes: Sequence[str], tests: Sequence[str], rounds: int | None = None
) -> list[list[Planned]]:
    """Round 0: every node alone (nccl: its NVLink busbw; ib has no single-node test);
    rounds 1..R: the matchings, each pair job running every test asked for."""
    ordered = sorted(dict.fromkeys(nodes))
    count = default_rounds(len(ordered)) if rounds is None else rounds
    plan: list[list[Planned]] = []
    if "nccl" in tests:
        plan.append([Planned((n,), 0, 1, ("nccl",)) for n in ordered])
    for r, pairs in enumerate(matching_rounds(ordered, count), 1):
        plan.append([Planned(p, r, 1, tuple(tests)) for p in pairs])
    return plan


def pack(tests: Iterable[Planned], first_round: int) -> list[list[Planned]]:
    """``tests`` in rounds where no node is in two tests (greedy, in the order given)."""
    rounds: list[tuple[set[str], list[Planned]]] = []
    for t in tests:
        for busy, batch in rounds:
            if busy.isdisjoint(t.nodes):
                busy.update(t.nodes)
                batch.append(t)
                break
        else:
            rounds.append((set(t.nodes), [t]))
    return [
        [Planned(t.nodes, first_round + i, t.attempt, t.tests) for t in batch]
        for i, (_, batch) in enumerate(rounds)
    ]


def _repeats(verdict: Verdict) -> list[tuple[str, tuple[str, ...], int]]:
    """The units to measure again: each slow once, and slow twice once more unless a node
    of the pair already looks bad (:func:`_looks_bad`): an accusation of a link or of a node
    alone rests on three slow runs (two dips in a row can be other jobs' traffic). Once a
    node has :data:`REPEATS_PER_NODE` repeats, its other slow pairs wait: repeats of one
    node's pairs cannot run side by side, and its case is made."""
    bad = _looks_bad(verdict)
    scheduled: dict[str, int] = {}  # repeats of each node's pairs, run or to run
    for u in verdict.units:
        for n in u.nodes if len(u.nodes) == 2 and u.attempts >= 2 else ():
            scheduled[n] = scheduled.get(n, 0) + 1
    out = []
    for u in verdict.units:
        if u.status != "slow" or u.attempts >= 3:
            continue
        pair = len(u.nodes) == 2
        if (
            pair
            and any(n in bad for n in u.nodes)
            and (u.confirmed or max(scheduled.get(n, 0) for n in u.nodes) >= REPEATS_PER_NODE)
        ):
            continue
        for n in u.nodes if pair else ():
            scheduled[n] = scheduled.get(n, 0) + 1
        out.append((u.test, u.nodes, u.attempts + 1))
    return out


def _looks_bad(verdict: Verdict) -> set[str]:
    """Nodes slow with most of their partners (the verdict's node rule, before repeats)."""
    slow: dict[str, int] = {}
    met: dict[str, int] = {}
    for u in verdict.units:
        if len(u.nodes) == 2:
            for n in u.nodes:
                met[n] = met.get(n, 0) + 1
                slow[n] = slow.get(n, 0) + (u.status in ("slow", "failed"))
    return {n for n, k in slow.items() if k >= 2 and k * 2 > met[n]}


def followups(verdict: Verdict, nodes: Sequence[str], first_round: int) -> list[list[Planned]]:
    """The next stage: a repeat of every unit that looked slow once (attempt + 1), and for
    each endpoint of a slow pair that met fewer than :data:`MIN_PARTNERS` partners a pair
    with a node it has not met whose own tests were all fine. [] when nothing is left."""
    wanted: dict[tuple[tuple[str, ...], int], set[str]] = {}
    for test, key, attempt in _repeats(verdict):
        wanted.setdefault((key, attempt), set()).add(test)
    met = verdict.partners()
    healthy = [n for n in sorted(dict.fromkeys(nodes)) if n not in verdict.touched()]
    load: dict[str, int] = {}
    for u in verdict.units:
        if len(u.nodes) != 2 or u.status != "slow":
            continue
        for x in u.nodes:
            if len(met.get(x, ())) >= MIN_PARTNERS:
                continue
            fresh = [y for y in healthy if y != x and y not in met.get(x, set())]
            if not fresh:
                continue
            y = min(fresh, key=lambda n: (load.get(n, 0), n))
            load[y] = load.get(y, 0) + 1
            met.setdefault(x, set()).add(y)
            met.setdefault(y, set()).add(x)
            wanted.setdefault((unit_key((x, y)), 1), set()).add(u.test)
    tests = [Planned(k, 0, a, tuple(sorted(ts))) for (k, a), ts in sorted(wanted.items())]
    return pack(tests, first_round)


@dataclass(frozen=True)
class Driven:
    results: list[Result]
    verdict: Verdict
    jobs: int
    rounds: int


def drive(
    nodes: Sequence[str],
    tests: Sequence[str],
    rounds: int | None,
    measure: Callable[[list[Planned]], list[Result]],
    judge: Callable[[list[Result]], Verdict],
    progress: Callable[[str], None] = lambda _line: None,
) -> Driven:
    """The sweep's loop: the base plan round by round (``measure`` runs one round's tests),
    judge, then the follow-ups until none is left or :data:`MAX_STAGES` stages ran. The
    same loop drives Slurm jobs (``run``) and the simulation (benchmarks/sweep_sim.py)."""
    results: list[Result] = []
    stage = base_plan(nodes, tests, rounds)
    jobs = count = 0
    for _ in range(MAX_STAGES):
        for batch in stage:
            count += 1
            jobs += len(batch)
            what = "alone" if len(batch[0].nodes) == 1 else "pairs"
            progress(f"round {batch[0].round}: {len(batch)} job(s), {what}")
            results += measure(batch)
        verdict = judge(results)
        last = max((t.round for batch in stage for t in batch), default=0)
        stage = followups(verdict, nodes, last + 1)
        if not stage:
            break
    return Driven(results, verdict, jobs, count)
