"""The GPU layer: one protocol, two NVML libraries behind it (real ``pynvml`` or simulator)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from slurmhealth.errors import GpuBackendError, UsageError

if TYPE_CHECKING:
    from slurmhealth.config import Config
    from slurmhealth.model import NodeSnapshot, XidEvent


class GpuBackend(Protocol):
    def devices(self) -> list[int]: ...

    def snapshot(self, indices: Sequence[int] | None = None) -> NodeSnapshot: ...

    def wait_xid(self, timeout_s: float) -> list[XidEvent]: ...

    @property
    def kernel_log_hint(self) -> str | None: ...

    def close(self) -> None: ...


def open_backend(cfg: Config) -> GpuBackend:
    """The backend the config asks for. Scenario and library errors are raised here."""
    from slurmhealth.gpu.nvml import NvmlBackend

    lib, clock = open_library(cfg)
    return NvmlBackend(lib, node=cfg.node_name, timeout_s=cfg.gpu.snapshot_timeout_s, clock=clock)


def open_library(cfg: Config) -> tuple[Any, Callable[[], float]]:
    """The NVML library the config asks for (``pynvml``, the simulator on a scenario, or the
    replay of the recording a scenario names) and the wall clock to read it by."""
    if cfg.gpu.backend != "sim":
        try:
            import pynvml
        except ImportError as exc:
            raise GpuBackendError(
                f"cannot import pynvml: {exc}", "pip install nvidia-ml-py"
            ) from None
        return pynvml, time.time
    from slurmhealth.gpu.scenario import load_scenario
    from slurmhealth.gpu.sim import SimulatedNvml

    if not cfg.gpu.sim_scenario:
        raise UsageError(
            "gpu.backend is 'sim' but no scenario is set "
            "(SLURMHEALTH_SIM_SCENARIO or gpu.sim_scenario)"
        )
    node = cfg.node_name
    scenario = load_scenario(cfg.gpu.sim_scenario)
    kernel_log = sim_kernel_log_path(cfg, scenario.name)
    if scenario.replay:
        from slurmhealth.gpu.replay import ReplayNvml, load_recording

        replay = ReplayNvml(
            load_recording(scenario.replay),
            kernel_log_path=kernel_log,
        )
        return replay, replay.clock
    lib = SimulatedNvml(scenario, node, epoch=cfg.gpu.sim_epoch, kernel_log_path=kernel_log)
    return lib, time.time


def sim_kernel_log_path(cfg: Config, scenario_name: str | None = None) -> str:
    """Where the simulated node writes its kernel log (its scenario clock and fault
    lifetimes sit beside it): ``gpu.sim_kernel_log``, else under the run dir."""
    from slurmhealth.gpu.sim import default_kernel_log

    if cfg.gpu.sim_kernel_log:
        return cfg.expand(cfg.gpu.sim_kernel_log)
    if scenario_name is None:
        from slurmhealth.gpu.scenario import load_scenario

        scenario_name = load_scenario(cfg.gpu.sim_scenario).name
    return default_kernel_log(scenario_name, cfg.node_name, cfg.expand(cfg.paths.run_dir))
