"""Each GPU index's last known identity (UUID, bus id, serial, name), kept in the history's
``kv`` so a GPU that is lost or hung can still be named (for the RMA ticket, the drain
reason and the report)."""

from __future__ import annotations

import dataclasses
from typing import Any

from slurmhealth.model import NodeSnapshot

INVENTORY_KEY = "gpu_inventory"
_IDENTITY = ("uuid", "pci_bus_id", "serial", "name")


def updated_inventory(previous: Any, snapshot: NodeSnapshot) -> dict[str, dict[str, Any]]:
    """Last known identity of each GPU index (UUID, bus id, serial), updated from readable
    GPUs, so a GPU that is lost or hung can still be named for the RMA ticket."""
    inv = dict(previous) if isinstance(previous, dict) else {}
    for g in snapshot.gpus:
        if g.readable and g.uuid:
            inv[str(g.index)] = {k: getattr(g, k) for k in _IDENTITY}
    return inv


def with_known_identity(snapshot: NodeSnapshot, inventory: Any) -> NodeSnapshot:
    if not isinstance(inventory, dict):
        return snapshot
    gpus = []
    for g in snapshot.gpus:
        known = inventory.get(str(g.index))
        if not g.readable and g.uuid is None and isinstance(known, dict):
            g = dataclasses.replace(
                g,
                uuid=known.get("uuid"),
                pci_bus_id=known.get("pci_bus_id"),
                serial=known.get("serial"),
                name=known.get("name"),
            )
        gpus.append(g)
    return dataclasses.replace(snapshot, gpus=tuple(gpus))
