"""Healthy, idle GPUs of the models a scenario can start from (``preset``): every field a
scenario may override, as a flat dict of dotted paths."""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

from slurmhealth.gpu.presets_more import MORE_PRESETS, more_model

_H100_BUS = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
_SWITCH_OF_LINK = [0] * 5 + [1] * 4 + [2] * 4 + [3] * 5  # DGX H100: 4 NVSwitches, 5/4/4/5


def preset_gpu(preset: str, node: str, index: int) -> dict[str, Any]:
    """Healthy, idle GPU of a given model, as a flat field dict."""
    bus = _H100_BUS[index] if index < len(_H100_BUS) else f"{0xE0 + index:02x}"
    base: dict[str, Any] = {
        "uuid": "GPU-" + str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, f"{node}/{preset}/{index}")),
        "serial": f"16549220{index:05d}",
        "pci_bus_id": f"00000000:{bus.upper()}:00.0",
        "minor_number": index,
        "persistence_mode": True,
        "temperature": 33 + index % 3,
        "margin_temperature": 52,
        "utilization_gpu": 0,
        "utilization_memory": 0,
        "memory_used_mib": 0,
        "mem_clock": 2619,
        "clock_event_reasons": ["gpu_idle"],
        "pcie_gen": 5,
        "pcie_gen_max": 5,
        "pcie_width": 16,
        "pcie_width_max": 16,
        "pcie_replay": 0,
        "ecc_enabled": True,
        "ecc_volatile_uncorrectable": 0,
        "ecc_volatile_correctable": 0,
        "ecc_aggregate_uncorrectable": 0,
        "remapped_rows_correctable": 0,
        "remapped_rows_uncorrectable": 0,
        "remap_pending": False,
        "remap_failure": False,
        "retired_pages_pending": False,
        "fabric_state": "completed",
        "fabric_status": "ok",
        "fabric_clique_id": 0,
        "fabric_cluster_uuid": "",
        "fabric_health": ["not_supported"],
        "mig_mode": False,
        "mig_devices": [],
        "processes": [],
        "lost": False,
        "reset_required": False,
        "hang": False,
        "hang_s": 600.0,
        "not_supported": [],
        "energy_j": 1.5e6 + index * 1000.0,
    }
    model, remote, version = _model(preset, node, index)
    base |= model
    for link, rem in enumerate(remote):
        p = f"nvlink.{link}."
        base |= {p + "state": "active", p + "remote_pci_bus_id": rem, p + "version": version}
        base |= {p + counter: 0 for counter in ("replay", "recovery", "crc_flit", "crc_data")}
    base |= {k: v for k, v in model.items() if k.startswith("nvlink.")}  # e.g. off by design
    return base


def _model(preset: str, node: str, index: int) -> tuple[dict[str, Any], list[str], int]:
    """What a GPU model changes in the healthy idle GPU: its fields, the PCI bus id at the far
    end of each NVLink, and the NVLink version."""
    base: dict[str, Any] = {}
    if preset == "h100-sxm":
        base |= {
            "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559, "power_usage_w": 71.0,
            "power_limit_w": 700.0, "sm_clock": 345, "sm_clock_max": 1980, "nvlink_count": 18,
        }  # fmt: skip
        switches = [f"00000000:{5 + s:02X}:00.0" for s in range(4)]
        remote = [switches[_SWITCH_OF_LINK[link]] for link in range(18)]
        version = 4
    elif preset == "a100-sxm4":
        base |= {
            "name": "NVIDIA A100-SXM4-80GB", "memory_total_mib": 81920, "power_usage_w": 60.0,
            "power_limit_w": 400.0, "sm_clock": 210, "sm_clock_max": 1410, "nvlink_count": 12,
            "pcie_gen": 4, "pcie_gen_max": 4, "mem_clock": 1593,
        }  # fmt: skip
        remote = [f"00000000:{0xC4 + link % 6:02X}:00.0" for link in range(12)]
        version = 3
    elif preset == "v100-sxm2":
        base |= {
            "name": "Tesla V100-SXM2-32GB", "memory_total_mib": 32768, "power_usage_w": 42.0,
            "power_limit_w": 300.0, "sm_clock": 135, "sm_clock_max": 1530, "nvlink_count": 6,
            "pcie_gen": 3, "pcie_gen_max": 3, "mem_clock": 877, "fabric_state": "not_supported",
            "not_supported": ["row_remap", "margin_temperature", "fabric", "mig"],
        }  # fmt: skip
        remote = [f"00000000:{_H100_BUS[(index + 1 + link) % 8].upper()}:00.0" for link in range(6)]
        version = 2
    else:
        return more_model(preset, node, index)
    return base, remote, version


PRESETS = ("h100-sxm", "a100-sxm4", "v100-sxm2", *MORE_PRESETS)
