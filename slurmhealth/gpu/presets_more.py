"""More GPU models a scenario can start from: Hopper variants (H200 SXM, H100 NVL), Blackwell
(B200 HGX, GB200 NVL72) and GPUs in MIG mode (A100/H100). Same shape as
:func:`slurmhealth.gpu.presets._model`: the fields the model changes, the PCI bus id at the far
end of each NVLink, the NVLink version."""

from __future__ import annotations

import uuid as uuidlib
from typing import Any

_HGX_BUS = ["18", "2a", "3a", "5d", "9a", "ab", "ba", "db"]
# GB200 compute tray: 2 Grace-Blackwell superchips, 4 GPUs, each in its own PCI domain
_GB200_BUS = ["00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0"]
NVL72_CLIQUE_ID = 32766  # the default NVLink partition's clique of an NVL72 rack
# a healthy fabric health mask: full bandwidth, no recovery, route healthy, configuration
# correct, partition assigned, fabric manager connected (see model.FABRIC_HEALTH_FIELDS)
HEALTHY_FABRIC = ["degraded_bw:full", "route_recovery:none", "route_unhealthy:healthy",
                  "access_timeout_recovery:none", "incorrect_configuration:none",
                  "partition_assigned:assigned", "gfm_state:connected"]  # fmt: skip
# MIG profiles: (profile, GPU instance id, memory MiB) as nvidia-smi mig -lgi shows them
H100_MIG_7X1G = [("1g.10gb", gi, 9856) for gi in (7, 8, 9, 10, 11, 12, 13)]
A100_MIG_MIXED = [("3g.40gb", 2, 40192), ("2g.20gb", 3, 19968), ("1g.10gb", 9, 9728),
                  ("1g.10gb", 10, 9728)]  # fmt: skip


def more_model(preset: str, node: str, index: int) -> tuple[dict[str, Any], list[str], int]:
    """What one of these models changes in the healthy idle GPU; KeyError if not one."""
    if preset in ("h200-sxm", "b200"):
        return _hgx(preset, index)
    if preset == "h100-nvl":
        return _h100_nvl(index)
    if preset == "gb200":
        return _gb200(node, index)
    if preset in ("h100-sxm-mig", "a100-sxm4-mig"):
        return _mig(preset, node, index)
    raise KeyError(preset)


def _hgx(preset: str, index: int) -> tuple[dict[str, Any], list[str], int]:
    """HGX baseboards: 18 NVLinks per GPU to the NVSwitches (4 on H200, 2 on B200)."""
    if preset == "h200-sxm":
        base = {
            "name": "NVIDIA H200", "memory_total_mib": 143771, "power_usage_w": 76.0,
            "power_limit_w": 700.0, "sm_clock": 345, "sm_clock_max": 1980,
        }  # fmt: skip
        switches, version = [f"00000000:{5 + s:02X}:00.0" for s in range(4)], 4
        remote = [switches[(0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 3)[n]]
                  for n in range(18)]  # fmt: skip
    else:
        base = {
            "name": "NVIDIA B200", "memory_total_mib": 183359, "power_usage_w": 140.0,
            "power_limit_w": 1000.0, "sm_clock": 120, "sm_clock_max": 1965, "mem_clock": 3996,
        }  # fmt: skip
        version = 5
        remote = [f"00000000:{0x05 + n // 9:02X}:00.0" for n in range(18)]
    base |= {"nvlink_count": 18, "fabric_health": HEALTHY_FABRIC}
    return base, remote, version


def _h100_nvl(index: int) -> tuple[dict[str, Any], list[str], int]:
    """H100 NVL: PCIe cards bridged in pairs, 12 NVLinks active of the 18 NVML reports
    (the other six are inactive by design), no NVSwitch fabric."""
    partner = _HGX_BUS[index ^ 1].upper() if index < 8 else "00"
    base: dict[str, Any] = {
        "name": "NVIDIA H100 NVL", "memory_total_mib": 95830, "power_usage_w": 62.0,
        "power_limit_w": 400.0, "sm_clock": 345, "sm_clock_max": 1785, "nvlink_count": 18,
        "fabric_state": "not_supported",
    }  # fmt: skip
    for link in range(12, 18):
        base[f"nvlink.{link}.state"] = "inactive"
    return base, [f"00000000:{partner}:00.0"] * 18, 4


def _gb200(node: str, index: int) -> tuple[dict[str, Any], list[str], int]:
    """A GB200 NVL72 compute tray's GPU: 18 NVLink5 links to the rack's NVSwitch trays,
    registered with the rack's fabric (one cluster UUID and clique per NVLink partition)."""
    base = {
        "name": "NVIDIA GB200", "memory_total_mib": 189471, "power_usage_w": 150.0,
        "power_limit_w": 1200.0, "sm_clock": 120, "sm_clock_max": 2062, "mem_clock": 3996,
        "nvlink_count": 18, "pci_bus_id": _GB200_BUS[index % 4], "pcie_gen_max": 5,
        "fabric_clique_id": NVL72_CLIQUE_ID,
        "fabric_cluster_uuid": str(uuidlib.uuid5(uuidlib.NAMESPACE_DNS, "nvl72-rack-0")),
        "fabric_health": HEALTHY_FABRIC,
    }  # fmt: skip
    remote = [f"00000000:{0x10 + n:02X}:00.0" for n in range(18)]  # switch trays, off-node
    return base, remote, 5


def _mig(preset: str, node: str, index: int) -> tuple[dict[str, Any], list[str], int]:
    """A100/H100 in MIG mode: H100 with seven 1g.10gb instances, A100 with a mixed layout
    (3g + 2g + 1g + 1g). NVLink is not used in MIG mode (links report inactive)."""
    if preset == "h100-sxm-mig":
        name, total, profiles, links, version = "NVIDIA H100 80GB HBM3", 81559, H100_MIG_7X1G, 18, 4
    else:
        name, total, profiles, links, version = (
            "NVIDIA A100-SXM4-80GB",
            81920,
            A100_MIG_MIXED,
            12,
            3,
        )
    base: dict[str, Any] = {
        "name": name, "memory_total_mib": total, "power_usage_w": 70.0,
        "power_limit_w": 700.0 if links == 18 else 400.0, "sm_clock": 345,
        "sm_clock_max": 1980 if links == 18 else 1410, "nvlink_count": links,
        "mig_mode": True, "utilization_gpu": 0,
        "mig_devices": [
            {"profile": p, "gi": gi, "ci": 0, "memory_mib": mib, "used_mib": 0}
            for p, gi, mib in profiles
        ],
    }  # fmt: skip
    if links == 12:
        base |= {"pcie_gen": 4, "pcie_gen_max": 4, "mem_clock": 1593}
    for link in range(links):
        base[f"nvlink.{link}.state"] = "inactive"
    return base, [f"00000000:{5 + link % 4:02X}:00.0" for link in range(links)], version


MORE_PRESETS = ("h200-sxm", "h100-nvl", "b200", "gb200", "h100-sxm-mig", "a100-sxm4-mig")
