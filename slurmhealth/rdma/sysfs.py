"""Read the kernel's view of the node's RDMA devices from sysfs (``ibstat`` /
``ibv_devinfo`` / ``perfquery`` read the same values through other paths).

- ``<root>/class/infiniband/<hca>/``: ``node_guid``, ``fw_ver``, ``board_id``, ``hca_type``,
  ``node_type``, the ``device`` link (the PCI function, whose resolved path gives the PCIe
  chain), ``device/net/*`` (its net devices), ``device/numa_node``;
- ``<root>/class/infiniband/<hca>/ports/<n>/``: ``state``, ``phys_state``, ``rate``,
  ``link_layer``, ``counters/*``, ``hw_counters/*``, ``gid_attrs/ndevs/*`` (RoCE);
- ``<root>/bus/pci/devices/*``: NVIDIA GPUs (``vendor`` 0x10de, ``class`` 0x03xxxx);
- ``<root>/module/nvidia_peermem`` (or ``nv_peer_mem``): GPUDirect RDMA.

``root`` is ``/sys`` on a node; tests and the demo pass a generated tree
(:mod:`slurmhealth.rdma.simtree`). A file that is missing or unreadable is ``None`` (unknown);
reading never raises for one odd file, and a missing ``class/infiniband`` is a node without
RDMA devices.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from slurmhealth.model import normalize_pci_bus_id
from slurmhealth.rdma.model import (
    Hca,
    IbPort,
    PciGpu,
    RdmaSnapshot,
    parse_rate,
    parse_state,
)

MAX_FILE_BYTES = 4096  # every attribute is one short line
MAX_ENTRIES = 512  # HCAs, ports, counters per directory: bounded whatever the tree holds
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")
NVIDIA_VENDOR = "0x10de"


def read_rdma(
    root: str = "/sys",
    *,
    hw_counters: bool = True,
    counters: Iterable[str] | None = None,
    gpu_pci_bus_ids: Iterable[str] | None = None,
    ts: float | None = None,
) -> RdmaSnapshot:
    """Every RDMA device under ``root`` with its ports and counters, the NVIDIA GPUs on the
    PCI bus and whether ``nvidia_peermem`` is loaded.

    Each ``counters/*`` read is a query to the HCA's firmware: ``counters`` names the ones
    to read (e.g. :data:`~slurmhealth.rdma.model.ERROR_COUNTERS` for the checks; None = all),
    ``hw_counters=False`` skips the driver's ``hw_counters/*``. ``gpu_pci_bus_ids`` (the
    GPUs NVML listed) resolves only those instead of scanning every PCI device."""
    now = time.time() if ts is None else ts
    wanted = None if counters is None else frozenset(counters)
    base = os.path.join(root, "class", "infiniband")
    try:
        names = sorted(os.listdir(base))[:MAX_ENTRIES]
    except FileNotFoundError:
        names = []
    except OSError as exc:
        return RdmaSnapshot(now, error=f"cannot list {base}: {exc.strerror or exc}")
    hcas = tuple(_hca(root, os.path.join(base, n), n, hw_counters, wanted) for n in names)
    return RdmaSnapshot(now, hcas, _gpus(root, gpu_pci_bus_ids), _peermem(root))


def _text(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_FILE_BYTES)
    except OSError:
        return None
    return data.decode("utf-8", "replace").strip()


def _int(path: str) -> int | None:
    text = _text(path)
    return int(text) if text is not None and text.isascii() and text.isdigit() else None


def _numa(path: str) -> int | None:
    """``numa_node``: the node's number; ``-1`` (no NUMA affinity) and unreadable: None."""
    text = _text(path)
    return int(text) if text and text.isascii() and text.isdigit() else None


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))[:MAX_ENTRIES]
    except OSError:
        return []


def _hca(root: str, path: str, name: str, hw: bool, wanted: frozenset[str] | None) -> Hca:
    device = os.path.join(path, "device")
    chain = pcie_chain(root, device)
    ports = [p for p in _listdir(os.path.join(path, "ports")) if p.isdigit()]
    return Hca(
        name=name,
        ports=tuple(_port(os.path.join(path, "ports", p), name, int(p), hw, wanted) for p in ports),
        pci_bus_id=chain[-1] if chain else None,
        pcie_path=chain,
        node_guid=_text(os.path.join(path, "node_guid")),
        fw_ver=_text(os.path.join(path, "fw_ver")),
        board_id=_text(os.path.join(path, "board_id")),
        hca_type=_text(os.path.join(path, "hca_type")),
        node_type=_text(os.path.join(path, "node_type")),
        netdevs=tuple(_listdir(os.path.join(device, "net"))),
        numa_node=_numa(os.path.join(device, "numa_node")),
    )


def _port(path: str, hca: str, number: int, hw: bool, wanted: frozenset[str] | None) -> IbPort:
    state, state_name = parse_state(_text(os.path.join(path, "state")))
    phys, phys_name = parse_state(_text(os.path.join(path, "phys_state")))
    ndevs = os.path.join(path, "gid_attrs", "ndevs")
    netdevs = {t for i in _listdir(ndevs) if (t := _text(os.path.join(ndevs, i)))}
    return IbPort(
        hca=hca,
        port=number,
        state=state,
        state_name=state_name,
        phys_state=phys,
        phys_state_name=phys_name,
        rate=parse_rate(_text(os.path.join(path, "rate"))),
        link_layer=_text(os.path.join(path, "link_layer")),
        counters=_counters(os.path.join(path, "counters"), wanted),
        hw_counters=_counters(os.path.join(path, "hw_counters")) if hw else {},
        netdevs=tuple(sorted(netdevs)),
    )


def _counters(path: str, wanted: frozenset[str] | None = None) -> dict[str, int]:
    """Every decimal counter file in ``path`` (of ``wanted``, when given); ``N/A (no PMA)``
    and the ``lifespan`` setting are not counters."""
    out: dict[str, int] = {}
    names = _listdir(path) if wanted is None else sorted(wanted)
    for name in names:
        if name != "lifespan" and (value := _int(os.path.join(path, name))) is not None:
            out[name] = value
    return out


def pcie_chain(root: str, device: str) -> tuple[str, ...]:
    """The PCI addresses from the root port down to ``device`` (a link into
    ``<root>/devices/pci<domain>:<bus>/...``), normalised; empty when it does not resolve."""
    real = os.path.realpath(device)
    devices = os.path.realpath(os.path.join(root, "devices"))
    if not real.startswith(devices + os.sep):
        return ()
    out = []
    for part in real[len(devices) + 1 :].split(os.sep):
        try:
            out.append(normalize_pci_bus_id(part))
        except ValueError:
            continue  # "pci0000:17" (the host bridge), "platform", ...
    return tuple(out)


def _gpus(root: str, buses: Iterable[str] | None) -> tuple[PciGpu, ...]:
    base = os.path.join(root, "bus", "pci", "devices")
    out = []
    for name in _listdir(base) if buses is None else sorted(_sysfs_names(buses)):
        path = os.path.join(base, name)
        if _text(os.path.join(path, "vendor")) != NVIDIA_VENDOR:
            continue
        if not (_text(os.path.join(path, "class")) or "").startswith("0x03"):
            continue  # NVSwitches (0x0680) and audio functions are not GPUs
        chain = pcie_chain(root, path)
        if chain:
            out.append(PciGpu(chain[-1], chain, _numa(os.path.join(path, "numa_node"))))
    return tuple(out)


def _sysfs_names(buses: Iterable[str]) -> set[str]:
    """NVML's ``00000000:18:00.0`` as sysfs names it: ``0000:18:00.0``."""
    out = set()
    for bus in buses:
        try:
            out.add(normalize_pci_bus_id(bus))
        except ValueError:
            continue
    return out


def _peermem(root: str) -> bool | None:
    module = os.path.join(root, "module")
    if not os.path.isdir(module):
        return None
    return any(os.path.isdir(os.path.join(module, m)) for m in PEERMEM_MODULES)
