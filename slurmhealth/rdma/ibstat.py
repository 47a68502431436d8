"""``ibstat`` output (infiniband-diags) read into the same :class:`Hca` / :class:`IbPort`
data the sysfs reader gives, for evidence bundles and nodes where only the tool's output
was kept. Its format::

    CA 'mlx5_0'
        CA type: MT4129
        Number of ports: 1
        Firmware version: 28.39.1002
        Hardware version: 0
        Node GUID: 0x946dae0300f5a1b2
        System image GUID: 0x946dae0300f5a1b2
        Port 1:
                State: Active
                Physical state: LinkUp
                Rate: 400
                Base lid: 5
                LMC: 0
                SM lid: 1
                Capability mask: 0xa751e848
                Port GUID: 0x946dae0300f5a1b2
                Link layer: InfiniBand

``ibstat mlx5_0 1`` prints ``CA: 'mlx5_0'`` and the port block unindented; ``Rate`` is
``2.5`` for 1X SDR and ``<n> (FDR10)`` for FDR10; a state it cannot name is ``???``.
Never raises: lines it does not know are skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from slurmhealth.rdma.model import PHYS_STATE_NAMES, Hca, IbPort, parse_rate

PORT_STATES = {"Down": 1, "Initializing": 2, "Armed": 3, "Active": 4}  # ibstat's names
PHYS_STATES = {name.replace(" ", ""): n for n, name in PHYS_STATE_NAMES.items()}
KERNEL_STATE = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE"}

_CA_RE = re.compile(r"^(?:CA|Switch|Router|iWARP RNIC|\?\?\?):? '([^']{1,64})'\s*$")
_PORT_RE = re.compile(r"^Port ([0-9]{1,3}):\s*$")
_FIELD_RE = re.compile(r"^([A-Za-z][A-Za-z ]{0,40}):\s*(.*?)\s*$")


@dataclass
class _Ca:
    name: str
    fields: dict[str, str] = field(default_factory=dict)
    ports: list[IbPort] = field(default_factory=list)


def parse_ibstat(text: str) -> list[Hca]:
    """Every CA in ``ibstat`` output, in order, with its ports."""
    cas: list[_Ca] = []
    port: IbPort | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if m := _CA_RE.match(line):
            cas.append(_Ca(m[1]))
            port = None
        elif cas and (m := _PORT_RE.match(line)):
            port = IbPort(cas[-1].name, int(m[1]))
            cas[-1].ports.append(port)
        elif cas and (m := _FIELD_RE.match(line)):
            if port is None:
                cas[-1].fields[m[1]] = m[2]
            else:
                port = _port_field(port, m[1], m[2])
                cas[-1].ports[-1] = port
    return [_hca(ca) for ca in cas]


def _port_field(port: IbPort, key: str, value: str) -> IbPort:
    if key == "State":
        n = PORT_STATES.get(value)
        return replace(port, state=n, state_name=KERNEL_STATE.get(n or 0, value[:64]))
    if key == "Physical state":
        n = PHYS_STATES.get(value.replace(" ", ""))
        name = PHYS_STATE_NAMES.get(n or 0, value[:64])
        return replace(port, phys_state=n, phys_state_name=name)
    if key == "Rate":
        return replace(port, rate=parse_rate(value))
    if key == "Link layer":
        return replace(port, link_layer=value[:64] or None)
    return port


def _hca(ca: _Ca) -> Hca:
    guid = ca.fields.get("Node GUID")
    return Hca(
        name=ca.name,
        ports=tuple(ca.ports),
        node_guid=guid[:64] if guid else None,
        fw_ver=ca.fields.get("Firmware version") or None,
        hca_type=ca.fields.get("CA type") or None,
    )
