"""Backends over the simulated NVML for adapter tests: ``NvmlBackend(SimulatedNvml(...))``
built from scenario text, on a clock the test controls."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from slurmhealth.checks import CheckContext, counters, run_checks, window_of
from slurmhealth.gpu.nvml import NvmlBackend
from slurmhealth.gpu.scenario import load_scenario
from slurmhealth.gpu.sim import SimulatedNvml
from slurmhealth.model import Finding, NodeSnapshot

NODE = "gpu-node-01"
EPOCH = 1_700_000_000.0
# rates judged over whatever separates the two snapshots (thresholds a check lacks are unused)
SHORT_WINDOW = {"nvlink_errors": {"min_window_s": 1.0, "min_count": 1}}


def findings_since(first: NodeSnapshot, second: NodeSnapshot) -> list[Finding]:
    """The check catalog on ``second`` with counter rates measured since ``first``: the one
    place these tests build rate evidence."""
    history = counters.remember(counters.load(None), first, window_of(SHORT_WINDOW))
    return run_checks(CheckContext(snapshot=second, counter_history=history), SHORT_WINDOW)


class FakeClock:
    """Wall clock under test control; starts ``t`` seconds into the scenario."""

    def __init__(self, t: float = 10.0) -> None:
        self.now = EPOCH + t

    def __call__(self) -> float:
        return self.now

    def at(self, t: float) -> None:
        self.now = EPOCH + t


class SimBackends:
    """Makes backends from scenario text in ``tmp_path``; :meth:`close_all` closes them (and
    so releases calls a fault keeps hung)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.made: list[NvmlBackend] = []

    def __call__(
        self,
        text: str = "",
        *,
        lib_class: type[SimulatedNvml] = SimulatedNvml,
        clock: Callable[[], float] | None = None,
        timeout_s: float = 5.0,
        node: str = NODE,
    ) -> NvmlBackend:
        n = len(self.made)
        path = self.tmp_path / f"scenario{n}.toml"
        path.write_text(text)
        clk = clock or FakeClock()
        lib = lib_class(
            load_scenario(str(path)),
            node,
            epoch=EPOCH,
            kernel_log_path=str(self.tmp_path / f"kmsg{n}"),
            clock=clk,
        )
        backend = NvmlBackend(lib, node=node, timeout_s=timeout_s, clock=clk)
        self.made.append(backend)
        return backend

    def close_all(self) -> None:
        for backend in self.made:
            backend.close()
