"""The RDMA network as plain, frozen data: HCAs, their ports, and the PCIe paths that tie
them to GPUs. No I/O here; :mod:`slurmhealth.rdma.sysfs` fills it from the kernel's view.

Text formats are the kernel's own (``drivers/infiniband/core/sysfs.c``, documented in
the ABI file ``sysfs-class-infiniband``):

- ``state``: ``"<n>: <NAME>"`` with NAME one of NOP, DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER;
- ``phys_state``: ``"<n>: <Name>"``: 1 Sleep, 2 Polling, 3 Disabled, 4
  PortConfigurationTraining, 5 LinkUp, 6 LinkErrorRecovery, 7 Phy Test;
- ``rate``: ``"<Gb/s> Gb/sec (<width>X <speed>)"``, e.g. ``400 Gb/sec (4X NDR)``,
  ``2.5 Gb/sec (1X SDR)``, ``56 Gb/sec (4X FDR)`` (``ibstat`` prints the number alone);
- ``link_layer``: ``InfiniBand`` or ``Ethernet`` (RoCE);
- ``counters/*``: decimal; ``port_xmit_data`` and ``port_rcv_data`` count octets divided
  by 4 (4-byte words); a port without a performance agent reads ``N/A (no PMA)``.

``None`` always means unknown (a file missing or unreadable), never zero.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

PORT_ACTIVE = 4  # state "4: ACTIVE"
PHYS_LINK_UP = 5  # phys_state "5: LinkUp"

STATE_NAMES: Mapping[int, str] = {
    0: "NOP",
    1: "DOWN",
    2: "INIT",
    3: "ARMED",
    4: "ACTIVE",
    5: "ACTIVE_DEFER",
}
PHYS_STATE_NAMES: Mapping[int, str] = {
    1: "Sleep",
    2: "Polling",
    3: "Disabled",
    4: "PortConfigurationTraining",
    5: "LinkUp",
    6: "LinkErrorRecovery",
    7: "Phy Test",
}

ERROR_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "port_xmit_discards",
)
"""The ``counters/*`` files that count faults (IB PortCounters), as the checks judge them."""

DATA_WORD_BYTES = 4  # port_xmit_data / port_rcv_data unit: octets divided by 4

_STATE_RE = re.compile(r"\s*([0-9]{1,3})\s*:\s*(.*?)\s*")
_RATE_RE = re.compile(
    r"\s*([0-9]{1,6}(?:\.[0-9]{1,3})?)\s*(?:Gb/sec)?\s*(?:\(\s*([0-9]{1,2})X\s*([A-Za-z0-9]*)\s*\))?\s*"
)


def parse_state(text: str | None) -> tuple[int | None, str | None]:
    """``"4: ACTIVE"`` -> ``(4, "ACTIVE")``; text without the number keeps its name only."""
    if text is None or not text.strip():
        return None, None
    m = _STATE_RE.fullmatch(text)
    if m is None:
        return None, text.strip()[:64]
    return int(m[1]), m[2][:64] or None


@dataclass(frozen=True)
class Rate:
    """A port's data rate: ``gbps`` (active width times lane speed) and, when the text
    says, the width (lanes) and speed name (SDR ... NDR, XDR)."""

    gbps: float
    width: int | None = None
    speed: str | None = None

    @property
    def text(self) -> str:
        lanes = f" ({self.width}X {self.speed})" if self.width and self.speed else ""
        return f"{self.gbps:g} Gb/sec{lanes}"


def parse_rate(text: str | None) -> Rate | None:
    """``"400 Gb/sec (4X NDR)"`` or ``ibstat``'s ``"400"`` / ``"40 (FDR10)"`` -> :class:`Rate`."""
    if text is None:
        return None
    m = _RATE_RE.fullmatch(text)
    if m is None:
        fdr10 = re.fullmatch(r"\s*([0-9]{1,6})\s*\(\s*(FDR10)\s*\)\s*", text)
        return Rate(float(fdr10[1]), None, fdr10[2]) if fdr10 else None
    width = int(m[2]) if m[2] else None
    return Rate(float(m[1]), width, (m[3] or None) if width else None)


@dataclass(frozen=True)
class IbPort:
    """One port of an HCA (``/sys/class/infiniband/<hca>/ports/<port>/``)."""

    hca: str
    port: int
    state: int | None = None
    state_name: str | None = None
    phys_state: int | None = None
    phys_state_name: str | None = None
    rate: Rate | None = None
    link_layer: str | None = None  # "InfiniBand" | "Ethernet"
    counters: Mapping[str, int] = field(default_factory=dict)  # counters/*
    hw_counters: Mapping[str, int] = field(default_factory=dict)  # hw_counters/*
    netdevs: tuple[str, ...] = ()  # gid_attrs/ndevs/*: the RoCE net device(s)

    @property
    def name(self) -> str:
        """``mlx5_1/1``: how findings, drain reasons and reports name the port."""
        return f"{self.hca}/{self.port}"

    @property
    def active(self) -> bool | None:
        return None if self.state is None else self.state == PORT_ACTIVE

    @property
    def link_up(self) -> bool | None:
        return None if self.phys_state is None else self.phys_state == PHYS_LINK_UP

    def data_bytes(self) -> tuple[int | None, int | None]:
        """Transmitted and received bytes: ``port_xmit_data`` / ``port_rcv_data`` times 4."""
        tx, rx = self.counters.get("port_xmit_data"), self.counters.get("port_rcv_data")
        return (
            None if tx is None else tx * DATA_WORD_BYTES,
            None if rx is None else rx * DATA_WORD_BYTES,
        )


@dataclass(frozen=True)
class Hca:
    """One RDMA device (``/sys/class/infiniband/<name>``). ``pcie_path`` lists the PCI
    addresses from the root port down to the device itself (the resolved ``device`` link),
    which is how GPUs behind the same PCIe switch are found."""

    name: str
    ports: tuple[IbPort, ...] = ()
    pci_bus_id: str | None = None
    pcie_path: tuple[str, ...] = ()
    node_guid: str | None = None
    fw_ver: str | None = None
    board_id: str | None = None
    hca_type: str | None = None
    node_type: str | None = None
    netdevs: tuple[str, ...] = ()  # device/net/*: the PCI function's net devices
    numa_node: int | None = None


@dataclass(frozen=True)
class PciGpu:
    """An NVIDIA GPU as the PCI bus sees it (vendor 0x10de, display class)."""

    pci_bus_id: str
    pcie_path: tuple[str, ...]
    numa_node: int | None = None


@dataclass(frozen=True)
class RdmaSnapshot:
    """The node's RDMA devices at one moment. ``ts`` is UTC seconds since the epoch.
    ``peermem_loaded`` is whether ``nvidia_peermem`` (or the older ``nv_peer_mem``) is
    loaded: GPUDirect RDMA needs it; ``None`` = could not tell."""

    ts: float
    hcas: tuple[Hca, ...] = ()
    gpus: tuple[PciGpu, ...] = ()
    peermem_loaded: bool | None = None
    error: str | None = None

    def ports(self) -> list[IbPort]:
        return [p for h in self.hcas for p in h.ports]

    def hca(self, name: str) -> Hca | None:
        return next((h for h in self.hcas if h.name == name), None)


@dataclass(frozen=True)
class RdmaExpect:
    """What the node should have (config ``[rdma]``): zero / empty = not checked.

    ``devices`` names the fabric: ``mlx5_0`` (every port) or ``mlx5_0/1`` (one port); empty
    = every port whose link layer is ``link_layer`` (empty = any)."""

    hca_count: int = 0
    rate_gbps: float = 0.0
    gpudirect: bool = False
    link_layer: str = ""
    devices: tuple[str, ...] = ()

    def judged(self, port: IbPort) -> bool:
        """Whether ``port`` belongs to the fabric the checks judge."""
        if self.devices:
            return port.hca in self.devices or port.name in self.devices
        wanted = self.link_layer.lower()
        return not wanted or (port.link_layer or "").lower() == wanted


def shared_switch(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Whether two devices sit under a common PCI bridge (a PCIe switch port or the root
    port above one: ``nvidia-smi topo -m`` PIX/PXB), not only under the same host bridge."""
    return bool(a) and bool(b) and a[0] == b[0] and len(a) > 1 and len(b) > 1


def gpus_near(hca: Hca, gpus: tuple[PciGpu, ...], hcas: tuple[Hca, ...] = ()) -> tuple[str, ...]:
    """The PCI bus ids of the GPUs whose inter-node traffic ``hca`` carries, sorted: those
    behind the same PCIe switch (NCCL's PIX/PXB pairing); when none is (an HCA on a switch or
    root port without GPUs), those on its NUMA node (NCCL's NODE distance) that no HCA of
    ``hcas`` shares a switch with; else none."""
    same = sorted(g.pci_bus_id for g in gpus if shared_switch(hca.pcie_path, g.pcie_path))
    if same or hca.numa_node is None:
        return tuple(same)
    served = {g.pci_bus_id for g in gpus for h in hcas if shared_switch(h.pcie_path, g.pcie_path)}
    local = [g.pci_bus_id for g in gpus if g.numa_node == hca.numa_node]
    return tuple(sorted(b for b in local if b not in served))
