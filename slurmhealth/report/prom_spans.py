"""Which samples of a GPU's series are one job's, when the series carry no job labels
(``[metrics] job_labels = "info"``, docs/metrics.md): the arithmetic of ``report.prometheus``
for that mode, kept apart so that each module stays small.

In that mode a GPU's series run on across its jobs, and ``slurmhealth_job_gpu_info{job_id}``
says whose the GPU is. A job's samples on a node are those between its sidecar's first and
last scrape there (``slurmhealth_sidecar_samples_total{job_id}``, a job-level series: every
sample of a scrape has that scrape's time), on the GPUs its info series name. Each query
reads the window of each node with ``@`` (a term per node, joined with ``or``), so it reads
the job's samples only, exactly those the job's labels would have selected in the other
mode; a plot stride cut by the job's first or last scrape is read once more over its part.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial

from slurmhealth.prom_client import Call, Matrix, PromClient, Vector
from slurmhealth.report.prom_answers import Key, key_of

P = "slurmhealth_"
SLACK_S = 120.0  # the sidecar samples from the prolog to the epilog, around Slurm's times
EDGE_S = 900.0  # the job's first and last minutes: counters' ends, the sampling step


def quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def alternatives(values: Iterable[str]) -> str:
    """A PromQL regex literal matching exactly ``values``."""
    return quote("|".join(re.escape(v) for v in sorted(set(values))))


@dataclass(frozen=True)
class Span:
    """Where one part of a job's per-GPU series is: a selector (``sel``, the matchers
    inside ``{}``) and its range (``rng``) ending ``at`` (``" @ T"``; "" for the query's
    time), its last ``edge`` of that, and its first (ending ``first_at``). In the
    ``series`` mode one span holds every node (selected by ``job_id``); in ``info`` mode
    there is one per node, with its first and last scrape ``t0``, ``t1`` and GPUs."""

    sel: str
    rng: str
    at: str
    edge: str
    first_at: str
    node: str = ""
    t0: float = math.nan
    t1: float = math.nan
    gpus: frozenset[int] = frozenset()

    def m(self, series: str, extra: str = "") -> str:
        return f"{P}{series}{{{self.sel}{extra}}}"

    @property
    def all(self) -> str:
        return f"[{self.rng}]{self.at}"

    @property
    def last(self) -> str:
        return f"[{self.edge}]{self.at}"

    @property
    def first(self) -> str:
        return f"[{self.edge}]{self.first_at}"


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def node_span(node: str, gpus: Iterable[int], t0: float, t1: float, edge_s: float) -> Span:
    """The job's samples on ``node``: its ``gpus`` from ``t0`` to ``t1`` (both scrapes'
    times, included: Prometheus 2's ranges hold both ends)."""
    gpus = frozenset(gpus)
    sel = f"node={quote(node)},gpu=~{alternatives(str(g) for g in gpus)}"
    whole = _ms(t1 - t0)
    edge = min(whole, _ms(edge_s))
    return Span(sel, f"{whole}ms", f" @ {t1:.3f}", f"{edge}ms", f" @ {t0 + edge / 1000:.3f}",
                node, t0, t1, gpus)  # fmt: skip


def ends(first: Matrix, last: Matrix) -> dict[str, tuple[float, float]]:
    """Node -> the times of the job's first and last scrape there, from the samples of its
    ``sidecar_samples_total`` in the job's first and last minutes (a node missing from
    either: not here)."""
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    for found, pick, out in ((first, min, lo), (last, max, hi)):
        for labels, points in found:
            if points and (node := labels.get("node")):
                t = pick(ts for ts, _ in points)
                out[node] = pick(out.get(node, t), t)
    return {node: (lo[node], hi[node]) for node in lo.keys() & hi.keys() if lo[node] <= hi[node]}


def gpus_of(*answers: Vector) -> dict[str, set[int]]:
    """Node -> the GPUs the job's ``slurmhealth_job_gpu_info`` names."""
    out: dict[str, set[int]] = {}
    for vector in answers:
        for labels, _ in vector:
            if (key := key_of(labels)) is not None:
                out.setdefault(key[0], set()).add(key[1])
    return out


def clip(matrix: Matrix, spans: Iterable[Span]) -> Matrix:
    """The samples of ``matrix`` that are the job's: its GPUs, within each node's span."""
    by_node = {s.node: s for s in spans}
    out: Matrix = []
    for labels, points in matrix:
        key = key_of(labels)
        s = by_node.get(key[0]) if key is not None else None
        if s is not None and key is not None and key[1] in s.gpus:
            out.append((labels, [(t, v) for t, v in points if s.t0 <= t <= s.t1]))
    return out


def _stride_ends(s: Span, stride: int) -> tuple[float, float]:
    """The ends ``B`` of the plot strides holding the span's first and last scrape."""
    return ((math.floor(s.t0 / stride) + 1) * stride, (math.floor(s.t1 / stride) + 1) * stride)


def edge_expr(fn: str, series: str, spans: Iterable[Span], stride: int) -> str:
    """``fn`` over the job's part of the first and last plot stride of each node, labelled
    ``stride_end`` with the time the range query evaluates that stride at (1 ms before
    its end ``B``)."""
    terms = []
    for s in spans:
        b_first, b_last = _stride_ends(s, stride)
        parts = [(s.t0, min(s.t1, b_first - 0.001), b_first)]
        if b_last != b_first:
            parts.append((max(s.t0, b_last - stride), s.t1, b_last))
        for a, b, end in parts:
            inner = f"{fn}({s.m(series)}[{_ms(b - a)}ms] @ {b:.3f})"
            terms.append(f'label_replace({inner}, "stride_end", "{end - 0.001:.3f}", "", "")')
    return " or ".join(terms)


def fix_strides(matrix: Matrix, edges: Vector, spans: Iterable[Span], stride: int) -> Matrix:
    """A range query's strides (``matrix``) kept to the job's: its GPUs, its strides, the
    first and last of each node's replaced by their part that is the job's (``edges``)."""
    by_node = {s.node: s for s in spans}
    exact: dict[tuple[Key, int], float] = {}
    for labels, value in edges:
        if (key := key_of(labels)) is not None:
            exact[(key, round(float(labels["stride_end"]) * 1000))] = value
    out: Matrix = []
    for labels, points in clip_keys(matrix, by_node):
        key = key_of(labels)
        assert key is not None  # (clip_keys kept only GPUs)
        lo, hi = (round(b * 1000) - 1 for b in _stride_ends(by_node[key[0]], stride))
        kept = []
        for t, v in points:
            ms = round(t * 1000)
            if ms in (lo, hi):
                if (key, ms) in exact:
                    kept.append((t, exact[(key, ms)]))
            elif lo < ms < hi:
                kept.append((t, v))
        out.append((labels, kept))
    return out


def clip_keys(matrix: Matrix, by_node: Mapping[str, Span]) -> Matrix:
    out: Matrix = []
    for labels, points in matrix:
        key = key_of(labels)
        if key is not None and key[0] in by_node and key[1] in by_node[key[0]].gpus:
            out.append((labels, points))
    return out


@dataclass(frozen=True)
class Window:
    """One job's selector and times: evaluated ``at`` its end (plus slack) over ``span``.
    ``sel`` selects its per-GPU series, ``job`` its job-level ones (the same ``job_id``
    unless its series carry no job labels: then ``spans`` says where the job's samples
    are, node by node, and ``sel`` names those nodes, prom_spans)."""

    sel: str
    start: float
    end: float
    at: float
    span: str  # the range of the whole window, e.g. "605040s"
    stride: int  # seconds per plot point (whole rollup buckets)
    job: str = ""
    job_id: str = ""
    spans: tuple[Span, ...] = ()

    def m(self, series: str, extra: str = "") -> str:
        return f"{P}{series}{{{self.sel}{extra}}}"

    def jm(self, series: str) -> str:
        return f"{P}{series}{{{self.job}}}"

    def parts(self) -> tuple[Span, ...]:
        if self.spans:
            return self.spans
        early = f" @ {self.start - SLACK_S + EDGE_S:.3f}"
        return (Span(self.sel, self.span, "", f"{EDGE_S:.0f}s", early),)

    def each(self, term: Callable[[Span], str]) -> str:
        """``term`` of each part of the job's series, joined with ``or``."""
        return " or ".join(term(s) for s in self.parts())

    def on(self, nodes: Iterable[str], inside: bool) -> Window:
        """The window's series on ``nodes`` only (``inside``), or on every other node."""
        nodes = set(nodes)
        if not nodes:
            return self
        op = "=~" if inside else "!~"
        node = f",node{op}{alternatives(nodes)}"
        spans = tuple(s for s in self.spans if (s.node in nodes) == inside)
        return dataclasses.replace(self, sel=self.sel + node, job=self.job + node, spans=spans)

    def strides(self) -> tuple[float, float]:
        """The first and last times to evaluate a stride's ``[stride - 1 ms]`` range at:
        1 ms before each stride's end ``B``, so each covers ``[B - stride, B)`` (ms
        timestamps), the history's rollup buckets when the stride is one: each sample in
        exactly one, a sample on a bucket's edge in the bucket it starts. Reported at ``B``
        (:func:`stride_end`)."""
        first = (math.floor((self.start - SLACK_S) / self.stride) + 1) * self.stride
        return first - 0.001, (math.floor(self.at / self.stride) + 1) * self.stride - 0.001


def attribute(client: PromClient, w: Window, deadline: float) -> Window:
    """``w`` as it is when the job's per-GPU series carry its labels, else with the
    spans of its samples, node by node: where its sidecars' first and
    last scrapes were, on the GPUs its ``slurmhealth_job_gpu_info`` names."""
    edge = f"[{EDGE_S:.0f}s]"
    early = f"{edge} @ {w.start - SLACK_S + EDGE_S:.3f}"
    info = f"{P}job_gpu_info{{{w.job}}}"
    calls: dict[str, Call] = {
        "labelled": partial(client.query, f"count(last_over_time({w.m('gpu_up')}{edge}"
                            f") or last_over_time({w.m('gpu_up')}{early}))", w.at),
        "first": partial(client.query_samples, f"{w.jm('sidecar_samples_total')}{early}",
                         w.at),
        "last": partial(client.query_samples, f"{w.jm('sidecar_samples_total')}{edge}",
                        w.at),
        "gpus": partial(client.query, f"last_over_time({info}{edge}) or "
                        f"last_over_time({info}{early})", w.at),
    }  # fmt: skip
    found = client.gather(calls, deadline)
    gpus = gpus_of(found["gpus"])
    if found["labelled"] or not gpus:
        return w
    found_ends = ends(found["first"], found["last"])
    missing = gpus.keys() - found_ends.keys()  # a node's sidecar began or ended mid-job
    if missing:
        whole = f"{w.jm('sidecar_samples_total')}[{w.span}]"
        whole = whole.replace("}", f",node=~{alternatives(missing)}}}", 1)
        every = client.gather({"n": partial(client.query_samples, whole, w.at)}, deadline)["n"]
        found_ends.update(ends(every, every))
    spans = tuple(node_span(node, gpus[node], *found_ends[node], EDGE_S)
                  for node in sorted(gpus.keys() & found_ends.keys()))  # fmt: skip
    if not spans:
        return w
    sel = f"node=~{alternatives(s.node for s in spans)}"
    return dataclasses.replace(w, sel=sel, spans=spans)
