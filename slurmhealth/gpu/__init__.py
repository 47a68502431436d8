"""The GPU layer: one protocol, two NVML libraries behind it (real ``pynvml`` or simulator)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

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

    node = cfg.node_name
    if cfg.gpu.backend == "sim":
        from slurmhealth.gpu.scenario import load_scenario
        from slurmhealth.gpu.sim import SimulatedNvml

        if not cfg.gpu.sim_scenario:
            raise UsageError(
                "gpu.backend is 'sim' but no scenario is set "
                "(SLURMHEALTH_SIM_SCENARIO or gpu.sim_scenario)"
            )
        scenario = load_scenario(cfg.gpu.sim_scenario)
        lib = SimulatedNvml(
            scenario,
            node,
            epoch=cfg.gpu.sim_epoch,
            kernel_log_path=cfg.expand(cfg.gpu.sim_kernel_log) if cfg.gpu.sim_kernel_log else "",
        )
        return NvmlBackend(lib, node=node, timeout_s=cfg.gpu.snapshot_timeout_s)
    try:
        import pynvml
    except ImportError as exc:
        raise GpuBackendError(f"cannot import pynvml: {exc}", "pip install nvidia-ml-py") from None
    return NvmlBackend(pynvml, node=node, timeout_s=cfg.gpu.snapshot_timeout_s)
