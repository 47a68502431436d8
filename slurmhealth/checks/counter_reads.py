"""The cumulative error counters a snapshot holds, per GPU (what the rate checks of
:mod:`slurmhealth.checks.counters` remember across runs): below the check engine, whose
context reads them once per run, and the check modules."""

from __future__ import annotations

from slurmhealth.model import NodeSnapshot


def counters_of(snapshot: NodeSnapshot) -> dict[str, dict[str, int]]:
    """Every cumulative error counter per GPU UUID: ``nvlink.<link>.replay``, ``.recovery``
    and ``.crc`` (flit + data CRC errors), ``pcie_replay`` and ``ecc_correctable``
    (volatile correctable ECC errors)."""
    out: dict[str, dict[str, int]] = {}
    for g in snapshot.gpus:
        if not g.uuid or not g.readable:
            continue
        values: dict[str, int] = {}
        for link in g.nvlinks or ():
            crc = [v for v in (link.crc_flit_errors, link.crc_data_errors) if v is not None]
            for name, value in (
                ("replay", link.replay_errors),
                ("recovery", link.recovery_errors),
                ("crc", sum(crc) if crc else None),
            ):
                if value is not None:
                    values[f"nvlink.{link.link}.{name}"] = value
        if g.pcie_replay_errors is not None:
            values["pcie_replay"] = g.pcie_replay_errors
        if g.ecc_volatile_correctable is not None:
            values["ecc_correctable"] = g.ecc_volatile_correctable
        if values:
            out[g.uuid] = values
    return out
