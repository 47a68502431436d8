"""Generated sysfs trees in the kernel's own format, for tests and the demo (the RDMA
counterpart of the simulated NVML library): :func:`preset` builds a healthy node,
:func:`fault` breaks one port or HCA, :func:`write_tree` writes the tree as it reads at
scenario time ``t`` (counters that grow are rewritten by calling it again with a later ``t``).

The tree holds what :func:`slurmhealth.rdma.sysfs.read_rdma` reads: ``devices/pci*/...``
(root port, PCIe switch upstream and downstream ports, the GPUs and HCAs below them),
``bus/pci/devices/*`` and ``class/infiniband/<hca>/device`` as relative symlinks into it,
ports with ``state``/``phys_state``/``rate``/``link_layer``/``counters``/``hw_counters``,
RoCE ports' ``gid_attrs/ndevs``, and ``module/nvidia_peermem`` when loaded.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from slurmhealth.rdma.model import ERROR_COUNTERS, PHYS_STATE_NAMES, STATE_NAMES

GPU_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)  # as the GPU simulator's presets
IB_HW_COUNTERS = (
    "duplicate_request", "implied_nak_seq_err", "local_ack_timeout_err", "out_of_buffer",
    "out_of_sequence", "packet_seq_err", "req_cqe_error", "resp_cqe_error",
    "rnr_nak_retry_err", "rx_atomic_requests", "rx_read_requests", "rx_write_requests",
)  # fmt: skip
ROCE_HW_COUNTERS = (
    *IB_HW_COUNTERS,
    "np_cnp_sent", "np_ecn_marked_roce_packets", "roce_adp_retrans", "rp_cnp_handled",
)  # fmt: skip
DATA_COUNTERS = ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets")


@dataclass
class PortSpec:
    state: int = 4  # ACTIVE
    phys_state: int = 5  # LinkUp
    rate: str = "400 Gb/sec (4X NDR)"
    link_layer: str = "InfiniBand"
    counters: dict[str, int] = field(default_factory=dict)  # values at t = 0
    growth: dict[str, float] = field(default_factory=dict)  # counter -> per second
    flaps: tuple[float, ...] = ()  # scenario times of link flaps (link_downed += 1 each)
    netdevs: tuple[str, ...] = ()  # RoCE: gid_attrs/ndevs


@dataclass
class HcaSpec:
    name: str
    pci_bus_id: str
    switch: int  # index into NodeSpec.switches
    ports: dict[int, PortSpec]
    hca_type: str = "MT4129"  # ConnectX-7
    fw_ver: str = "28.39.1002"
    board_id: str = "MT_0000000838"
    netdevs: tuple[str, ...] = ()  # device/net/*


@dataclass
class NodeSpec:
    """A node's PCIe switches (the root-port bus of each), GPUs, HCAs and modules."""

    switches: list[int]
    gpus: list[tuple[str, int]]  # (pci bus id, switch index)
    hcas: list[HcaSpec]
    peermem: bool = True


def preset(name: str) -> NodeSpec:
    """A healthy node: ``ndr4`` (8 GPUs, 4 NDR HCAs, two GPUs per PCIe switch), ``ndr8``
    (8 GPUs, 8 NDR HCAs, one GPU and one HCA per switch), ``roce8`` (as ndr8, the HCAs in
    Ethernet mode with a net device each)."""
    if name not in PRESETS:
        raise KeyError(f"unknown RDMA preset {name!r} (known: {', '.join(PRESETS)})")
    per_switch = 2 if name == "ndr4" else 1
    switches = [GPU_BUSES[i] - 3 for i in range(0, 8, per_switch)]
    gpus = [(_bdf(bus), i // per_switch) for i, bus in enumerate(GPU_BUSES)]
    roce = name == "roce8"
    hcas = []
    for s, root in enumerate(switches):
        port = PortSpec(
            link_layer="Ethernet" if roce else "InfiniBand",
            counters=_healthy_counters(s),
            netdevs=(f"ens{s + 1}np0",) if roce else (),
        )
        netdev = f"ens{s + 1}np0" if roce else f"ibp{root + 5}s0"  # IPoIB: ibp<bus>s0
        hcas.append(HcaSpec(f"mlx5_{s}", _bdf(root + 5), s, {1: port}, netdevs=(netdev,)))
    return NodeSpec(switches, gpus, hcas)


PRESETS = ("ndr4", "ndr8", "roce8")


def _bdf(bus: int, device: int = 0) -> str:
    return f"0000:{bus:02x}:{device:02x}.0"


def _healthy_counters(seed: int) -> dict[str, int]:
    words = 10**12 + seed * 7919
    return {name: 0 for name in ERROR_COUNTERS} | {
        "port_rcv_remote_physical_errors": 0,  # mlx5 has it; the checks do not judge it
        "port_xmit_data": words, "port_rcv_data": words + 13, "port_xmit_packets": words // 1000,
        "port_rcv_packets": words // 1000 + 1, "port_xmit_wait": 1234 + seed,
    }  # fmt: skip


FAULTS = ("down", "init", "polling", "disabled", "rate", "missing", "counter", "flaps")


def fault(spec: NodeSpec, kind: str, hca: str, port: int = 1, **kw: object) -> NodeSpec:
    """A copy of ``spec`` with one fault on ``hca`` (port ``port``):

    - ``down`` (DOWN / Polling: no link), ``init`` (INIT / LinkUp: no subnet manager),
      ``polling`` (DOWN / Polling), ``disabled`` (DOWN / Disabled);
    - ``rate``: trained below its speed (``rate="200 Gb/sec (4X HDR)"`` by default);
    - ``missing``: the HCA is gone (not on the bus);
    - ``counter``: ``counter`` grows by ``per_s`` per second (e.g. symbol_error);
    - ``flaps``: the link flapped at each time in ``at`` (link_downed grows by one each).
    """
    out = dataclasses.replace(spec, hcas=[dataclasses.replace(h) for h in spec.hcas])
    if kind == "missing":
        out.hcas = [h for h in out.hcas if h.name != hca]
        return out
    target = next((h for h in out.hcas if h.name == hca), None)
    if target is None or port not in target.ports:
        raise KeyError(f"no port {hca}/{port} in the node")
    target.ports = dict(target.ports)
    p = target.ports[port] = dataclasses.replace(target.ports[port])
    states = {"down": (1, 2), "init": (2, 5), "polling": (1, 2), "disabled": (1, 3)}
    if kind in states:
        p.state, p.phys_state = states[kind]
    elif kind == "rate":
        p.rate = str(kw.get("rate", "200 Gb/sec (4X HDR)"))
    elif kind == "counter":
        p.growth = {**p.growth, str(kw["counter"]): float(str(kw.get("per_s", 1.0)))}
    elif kind == "flaps":
        at = kw.get("at", ())
        p.flaps = tuple(float(str(t)) for t in at) if isinstance(at, list | tuple) else ()
    else:
        raise KeyError(f"unknown RDMA fault {kind!r} (known: {', '.join(FAULTS)})")
    return out


def write_tree(root: str, spec: NodeSpec, t: float = 0.0) -> None:
    """Write (or rewrite, for a later ``t``) the node's sysfs tree under ``root``."""
    paths = _write_pci(root, spec)
    for h in spec.hcas:
        _write_hca(root, h, paths[h.pci_bus_id], t)
    module = os.path.join(root, "module")
    os.makedirs(os.path.join(module, "nvidia"), exist_ok=True)
    peermem = os.path.join(module, "nvidia_peermem")
    if spec.peermem:
        _write(os.path.join(peermem, "refcnt"), "0")
    elif os.path.isdir(peermem):
        for name in os.listdir(peermem):
            os.unlink(os.path.join(peermem, name))
        os.rmdir(peermem)


def update_counters(root: str, spec: NodeSpec, t: float) -> None:
    """Rewrite only the ports' ``counters/*`` for scenario time ``t`` (a tree that
    :func:`write_tree` wrote for the same ``spec``): cheaper when time moves on."""
    for h in spec.hcas:
        for number, p in h.ports.items():
            path = os.path.join(root, "class", "infiniband", h.name, "ports", str(number))
            for name, value in counter_values(p, t).items():
                with open(os.path.join(path, "counters", name), "w") as fh:
                    fh.write(f"{value}\n")


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(text + "\n")


def _link(target: str, link: str) -> None:
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if not os.path.islink(link):
        os.symlink(os.path.relpath(target, os.path.dirname(link)), link)


def _write_pci(root: str, spec: NodeSpec) -> dict[str, str]:
    """Each switch as ``devices/pci0000:<rb>/<root port>/<upstream>/<downstream>/<endpoint>``;
    returns each endpoint's directory by PCI address."""
    endpoints: dict[str, str] = {}
    members: list[tuple[str, int, str, str]] = [(b, s, "0x10de", "0x030200") for b, s in spec.gpus]
    members += [(h.pci_bus_id, h.switch, "0x15b3", "0x020700") for h in spec.hcas]
    for slot, (bdf, switch, vendor, cls) in enumerate(members):
        rb = spec.switches[switch]
        chain = [f"pci0000:{rb:02x}", _bdf(rb, 1), _bdf(rb + 1), _bdf(rb + 2, slot % 32), bdf]
        path = os.path.join(root, "devices", *chain)
        _write(os.path.join(path, "vendor"), vendor)
        _write(os.path.join(path, "class"), cls)
        _write(os.path.join(path, "numa_node"), str(0 if rb < 0x80 else 1))
        _link(path, os.path.join(root, "bus", "pci", "devices", bdf))
        endpoints[bdf] = path
    return endpoints


def _write_hca(root: str, h: HcaSpec, device: str, t: float) -> None:
    base = os.path.join(root, "class", "infiniband", h.name)
    _link(device, os.path.join(base, "device"))
    for name, value in (
        ("node_guid", _guid(h.pci_bus_id)), ("sys_image_guid", _guid(h.pci_bus_id)),
        ("fw_ver", h.fw_ver), ("board_id", h.board_id), ("hca_type", h.hca_type),
        ("hw_rev", "0x0"), ("node_type", "1: CA"), ("node_desc", f"node {h.name}"),
    ):  # fmt: skip
        _write(os.path.join(base, name), value)
    for netdev in h.netdevs:
        _write(os.path.join(device, "net", netdev, "operstate"), "up")
    for number, p in h.ports.items():
        _write_port(os.path.join(base, "ports", str(number)), p, t)


def _guid(bdf: str) -> str:
    n = int(bdf.replace(":", "").replace(".", ""), 16)
    digits = f"946dae0300{n % 0xFFFFFF:06x}"
    return ":".join(digits[i : i + 4] for i in range(0, 16, 4))


def _write_port(path: str, p: PortSpec, t: float) -> None:
    layer = p.link_layer
    _write(os.path.join(path, "state"), f"{p.state}: {STATE_NAMES.get(p.state, 'UNKNOWN')}")
    phys = PHYS_STATE_NAMES.get(p.phys_state, "<unknown>")
    _write(os.path.join(path, "phys_state"), f"{p.phys_state}: {phys}")
    _write(os.path.join(path, "rate"), p.rate)
    _write(os.path.join(path, "link_layer"), layer)
    _write(os.path.join(path, "lid"), "0x0" if layer == "Ethernet" else "0x12")
    for name, value in counter_values(p, t).items():
        _write(os.path.join(path, "counters", name), str(value))
    hw = ROCE_HW_COUNTERS if layer == "Ethernet" else IB_HW_COUNTERS
    for name in hw:
        _write(os.path.join(path, "hw_counters", name), "0")
    _write(os.path.join(path, "hw_counters", "lifespan"), "10")
    for i, netdev in enumerate(p.netdevs):
        for gid in (2 * i, 2 * i + 1):  # a RoCE v1 and a RoCE v2 GID per address
            _write(os.path.join(path, "gid_attrs", "ndevs", str(gid)), netdev)
            kind = "IB/RoCE v1" if gid % 2 == 0 else "RoCE v2"
            _write(os.path.join(path, "gid_attrs", "types", str(gid)), kind)


def counter_values(p: PortSpec, t: float) -> Mapping[str, int]:
    """The port's counters at scenario time ``t``: base values, growth per second and the
    flaps up to ``t``."""
    values = {name: p.counters.get(name, 0) for name in (*ERROR_COUNTERS, *DATA_COUNTERS)}
    values |= {k: v for k, v in p.counters.items() if k not in values}
    for name, per_s in p.growth.items():
        values[name] = values.get(name, 0) + math.floor(per_s * max(t, 0.0))
    flaps = sum(1 for at in p.flaps if at <= t)
    values["link_downed"] += flaps
    return values


def main(argv: list[str] | None = None) -> int:
    """``python -m slurmhealth.rdma.simtree DIR [--preset P] [--fault KIND:HCA[/PORT]]...
    [--no-peermem] [--at T]``: write a generated tree (for the demo and by hand)."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m slurmhealth.rdma.simtree")
    ap.add_argument("root", help="directory to write the sysfs tree into")
    ap.add_argument("--preset", default="ndr8", choices=PRESETS)
    ap.add_argument("--fault", action="append", default=[], metavar="KIND:HCA[/PORT]")
    ap.add_argument("--no-peermem", action="store_true", help="nvidia_peermem not loaded")
    ap.add_argument("--at", type=float, default=0.0, help="scenario time (s)")
    args = ap.parse_args(argv)
    spec = preset(args.preset)
    try:
        for text in args.fault:
            kind, _, where = text.partition(":")
            hca, _, port = where.partition("/")
            spec = fault(spec, kind, hca, int(port) if port.isdigit() else 1)
    except KeyError as exc:
        print(f"simtree: {exc.args[0]}", file=sys.stderr)
        return 2
    spec.peermem = not args.no_peermem
    write_tree(args.root, spec, args.at)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
