"""What a sweep plans and measures, as plain frozen data (JSON in, JSON out)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

TESTS = ("nccl", "ib")
UNITS = {"nccl": "GB/s", "ib": "Gb/s"}


def unit_key(nodes: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """A test's nodes in one order (a pair n3,n1 is the pair n1,n3)."""
    return tuple(sorted(nodes))


@dataclass(frozen=True)
class Planned:
    """One planned job: ``nodes`` (one: the node alone; two: a pair) in ``round``;
    ``attempt`` 2 and up repeat a unit that looked slow."""

    nodes: tuple[str, ...]
    round: int
    attempt: int = 1
    tests: tuple[str, ...] = ("nccl",)


@dataclass(frozen=True)
class Result:
    """One test's outcome. ``value`` is the headline bandwidth (nccl: busbw of the largest
    message size, GB/s; ib: the slowest HCA's average, Gb/s); None when the job measured
    nothing (``error`` says why: the job failed, timed out, the output did not parse)."""

    test: str
    nodes: tuple[str, ...]
    round: int
    attempt: int
    value: float | None
    metric: str = ""
    job_id: str = ""
    error: str = ""
    hcas: Mapping[str, float] = field(default_factory=dict)
    ts: float = 0.0

    @property
    def unit(self) -> str:
        return UNITS.get(self.test, "")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["nodes"], out["hcas"] = list(self.nodes), dict(self.hcas)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Result:
        value = d.get("value")
        return cls(
            test=str(d.get("test", "nccl")),
            nodes=tuple(str(n) for n in d.get("nodes", ())),
            round=int(d.get("round", 0)),
            attempt=int(d.get("attempt", 1)),
            value=None if value is None else float(value),
            metric=str(d.get("metric", "")),
            job_id=str(d.get("job_id", "")),
            error=str(d.get("error", "")),
            hcas={str(k): float(v) for k, v in dict(d.get("hcas") or {}).items()},
            ts=float(d.get("ts", 0.0) or 0.0),
        )
