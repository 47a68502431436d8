"""Which transport NCCL chose for each channel, read from its ``NCCL_DEBUG=INFO`` log.

NCCL prints one line per channel connection when a communicator is set up, after the usual
``host:pid:tid [cudaDev] NCCL INFO`` prefix (a launcher or ``NCCL_DEBUG_TIMESTAMP_FORMAT``
may put text before it)::

    Channel 00/0 : 0[0] -> 1[1] via P2P/IPC                 (2.7+: channel/sub-channel)
    Channel 01/0 : 8[0] -> 15[7] via P2P/IPC/read           (P2P/CUMEM, P2P/direct pointer)
    Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct       (SHM/CE/..., "direct shared memory")
    Channel 03/0 : 7[7] -> 14[6] [send] via NET/IB/0/GDRDMA  (NET/IBext..., NET/Socket/3, plugins)
    Channel 00 : 11[3e000] -> 9[1b000] via P2P/direct pointer   (2.5-2.6: bus ids)
    Ring 00 : 0[0] -> 1[1] via P2P/IPC                       (2.4 and older)

and which network it uses: ``NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:...``,
``NET/Socket : Using [0]eth0:10.0.0.1<0>``, ``NET/IB : No device found.``,
``Using network IB`` / ``Using network Socket`` / ``Using network AWS Libfabric``.
Communicator set-up lines (``comm 0x.. rank 3 nranks 8 ... Init COMPLETE``, ``nRanks``
since 2.19) map ranks to hosts. Before 2.5 an inter-node ring line names ranks without their
device (``Ring 00 : 15 -> 0 [receive] via NET/Socket/0``). The version (``NCCL version
2.4.7+cuda9.2``, with or without the prefix) and the settings NCCL reports taking from the
environment (``NCCL_IB_DISABLE set by environment to 1.``, ``Comm config netName reset to
NCCL_NET=Socket``) are kept: they say whether sockets were the job's own choice.

The connecting rank of a line is its source, or its destination for ``[receive]``; its host
is the line's prefix. P2P, SHM and NVLS only connect GPUs of one node; a NET connection is
inter-node unless both ranks are known on one host. Two verdicts follow: intra-node traffic
that left NVLink/P2P (SHM, or NET between GPUs of one node) and inter-node traffic over
sockets (``NET/Socket``) instead of InfiniBand/RoCE or a network plugin. :func:`facts`
turns them into what the diagnosis rules read (:class:`NcclFacts`).

The log is the job user's file (hostile input): lines over ``MAX_LINE_CHARS`` are skipped
and at most ``MAX_EDGES`` distinct connections are kept. Pure: lines in, a summary out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, fields

MAX_LINE_CHARS = 2048
MAX_EDGES = 100_000
MAX_EXAMPLES = 5  # rank pairs quoted per flag
MAX_ENV = 64  # NCCL_* settings kept

_PREFIX = re.compile(r"([^\s:\[\]]{1,255}):(\d{1,10}):(\d{1,10}) \[(\d{1,6})\] NCCL INFO (.*)$")
_CHANNEL = re.compile(
    r"^(?:Channel|Ring) (\d{1,4})(?:/(\d{1,4}))? ?: (\d{1,9})(?:\[([0-9a-fA-F]{1,16})\])? -> "
    r"(\d{1,9})(?:\[([0-9a-fA-F]{1,16})\])?(?: \[(send|receive)\])? via (\S.*)$"
)
_RANKS = re.compile(r"\brank (\d{1,9}) n[Rr]anks (\d{1,9})\b")
_NETWORK = re.compile(r"^Using network (\S.*?)\s*$")
_NET_DEVICES = re.compile(r"^NET/(IB|Socket) ?: (Using .*|No device found.*)$")
_VERSION = re.compile(r"\bNCCL version (\d{1,3}\.\d{1,3}\.\d{1,4})")
_ENV = re.compile(r"^(NCCL_[A-Z0-9_]{1,64}) set by environment to (.{0,200}?)\.?\s*$")
_P2P_OFF = re.compile(r"\bP2P is disabled between\b")  # paths.cc, 2.18+: "... NVLINK connected"
_ENV_RESET = re.compile(r"\breset to (NCCL_[A-Z0-9_]{1,64})=(\S{1,200})")

Edge = tuple[str, int, int, str, str | None]  # host, rank, peer, transport, network
INTRA_SLOW = "intra_node_off_p2p"
INTER_SOCKET = "inter_node_socket"


@dataclass(frozen=True, slots=True)
class Channel:
    """One channel connection as logged: ``rank`` connects to ``peer``."""

    host: str
    pid: int
    rank: int
    peer: int
    channel: int
    transport: str  # P2P, SHM, NET, NVLS, COLLNET or OTHER
    network: str | None  # for NET: IB (also RoCE, IBext), Socket, or the plugin's name
    via: str  # the text after "via", e.g. "NET/IB/0/GDRDMA"


@dataclass(frozen=True, slots=True)
class Flag:
    kind: str  # INTRA_SLOW or INTER_SOCKET
    text: str
    ranks: tuple[tuple[int, int], ...]  # (rank, peer) examples, at most MAX_EXAMPLES


@dataclass(frozen=True, slots=True)
class RankTransports:
    """What one rank's connections went over: ``intra`` = to GPUs of its own node (P2P,
    SHM, NVLS, NET), ``inter`` = to other nodes (IB, Socket or a plugin name)."""

    host: str
    rank: int
    intra: tuple[str, ...]
    inter: tuple[str, ...]


@dataclass
class NcclTransports:
    """The summary of one or more NCCL logs of a job (feed every rank's file to one)."""

    ranks: dict[tuple[str, int], RankTransports] = field(default_factory=dict)
    networks: dict[str, set[str]] = field(default_factory=dict)  # host -> "Using network X"
    no_ib_device: set[str] = field(default_factory=set)  # hosts that logged no IB device
    net_init: dict[str, set[str]] = field(default_factory=dict)  # host -> "NET/IB : Using"...
    env: dict[str, str] = field(default_factory=dict)  # NCCL_* as NCCL says it took them
    versions: set[str] = field(default_factory=set)
    p2p_disabled: list[str] = field(default_factory=list)  # "P2P is disabled between ..." lines
    hosts: set[str] = field(default_factory=set)  # every host a line came from
    flags: list[Flag] = field(default_factory=list)
    lines: int = 0
    channel_lines: int = 0
    skipped_lines: int = 0  # over MAX_LINE_CHARS


def classify(via: str) -> tuple[str, str | None]:
    """(transport, network) of the text after ``via`` in a channel line."""
    head, _, rest = via.partition("/")
    top = head.strip().upper()
    if top == "P2P":
        return "P2P", None
    if top == "SHM" or "shared memory" in via.lower():
        return "SHM", None
    if top == "NVLS":
        return "NVLS", None
    if top == "COLLNET":
        return "COLLNET", None
    if top == "NET":
        name = rest.split("/", 1)[0].strip()
        low = name.lower()
        if low.startswith("ib"):
            return "NET", "IB"
        if low.startswith("socket"):
            return "NET", "Socket"
        return "NET", name or "unknown"
    return "OTHER", None


def parse_channel(line: str) -> Channel | None:
    """A :class:`Channel` from one log line, ``None`` when it is not a channel line."""
    if len(line) > MAX_LINE_CHARS:
        return None
    m = _PREFIX.search(line.rstrip("\r\n"))
    return _channel(m) if m else None


def _channel(prefix: re.Match[str]) -> Channel | None:
    c = _CHANNEL.match(prefix.group(5))
    if c is None:
        return None
    src, dst, direction = int(c.group(3)), int(c.group(5)), c.group(7)
    rank, peer = (dst, src) if direction == "receive" else (src, dst)
    via = c.group(8).strip()
    transport, network = classify(via)
    host, pid = prefix.group(1), int(prefix.group(2))
    return Channel(host, pid, rank, peer, int(c.group(1)), transport, network, via)


def parse(lines: Iterable[str]) -> NcclTransports:
    """Summarise NCCL log lines (every rank's file of a job, in any order)."""
    out = NcclTransports()
    edges: set[Edge] = set()
    hosts: dict[int, set[str]] = {}  # rank -> hosts it was seen on (sub-communicators clash)
    for line in lines:
        out.lines += 1
        if len(line) > MAX_LINE_CHARS:
            out.skipped_lines += 1
            continue
        if "NCCL version" in line and (v := _VERSION.search(line)) and len(out.versions) < MAX_ENV:
            out.versions.add(v.group(1))
        m = _PREFIX.search(line.rstrip("\r\n"))
        if m is None:
            continue
        host = m.group(1)
        if len(out.hosts) < MAX_EDGES:
            out.hosts.add(host)
        if ch := _channel(m):
            out.channel_lines += 1
            hosts.setdefault(ch.rank, set()).add(host)
            if len(edges) < MAX_EDGES:
                edges.add((host, ch.rank, ch.peer, ch.transport, ch.network))
        elif r := _RANKS.search(m.group(5)):
            hosts.setdefault(int(r.group(1)), set()).add(host)
        else:
            _setting(out, host, m.group(5))
    _judge(out, edges, hosts)
    return out


def _setting(out: NcclTransports, host: str, msg: str) -> None:
    """The network NCCL chose (``Using network X``), its init lines (``NET/IB : Using``,
    ``NET/IB : No device found.``) and the environment it took (``NCCL_X set by
    environment to Y.``)."""
    if n := _NETWORK.match(msg):
        if len(out.networks) < MAX_EDGES:
            out.networks.setdefault(host, set()).add(n.group(1)[:64])
    elif d := _NET_DEVICES.match(msg):
        if "No device" in d.group(2):
            if d.group(1) == "IB":
                out.no_ib_device.add(host)
        elif len(out.net_init) < MAX_EDGES:
            out.net_init.setdefault(host, set()).add(d.group(1))
    elif (e := _ENV.match(msg) or _ENV_RESET.search(msg)) and len(out.env) < MAX_ENV:
        out.env.setdefault(e.group(1), e.group(2).strip()[:200])
    elif _P2P_OFF.search(msg) and len(out.p2p_disabled) < MAX_EXAMPLES:
        out.p2p_disabled.append(f"{host}: {msg.strip()[:200]}")


def _same_host(host: str, peer: int, hosts: dict[int, set[str]]) -> bool:
    return hosts.get(peer) == {host}


def _judge(out: NcclTransports, edges: set[Edge], hosts: dict[int, set[str]]) -> None:
    """Each rank's intra- and inter-node transports, and the flags."""
    intra: dict[tuple[str, int], set[str]] = {}
    inter: dict[tuple[str, int], set[str]] = {}
    slow: set[tuple[int, int]] = set()
    socket: set[tuple[int, int]] = set()
    for host, rank, peer, transport, network in edges:
        key = (host, rank)
        intra.setdefault(key, set())
        inter.setdefault(key, set())
        if transport != "NET" or _same_host(host, peer, hosts):
            intra[key].add(transport)
            if transport in ("SHM", "NET"):
                slow.add((rank, peer))
        else:
            inter[key].add(network or "unknown")
            if network == "Socket":
                socket.add((rank, peer))
    for key in sorted(intra):
        out.ranks[key] = RankTransports(*key, tuple(sorted(intra[key])), tuple(sorted(inter[key])))
    if slow:
        kinds = sorted({t for k in intra for t in intra[k] if t in ("SHM", "NET")})
        out.flags.append(
            Flag(INTRA_SLOW, _INTRA_TEXT.format(len(slow), "/".join(kinds)), _ex(slow))
        )
    if socket:
        out.flags.append(Flag(INTER_SOCKET, _SOCKET_TEXT.format(len(socket)), _ex(socket)))
    elif len(out.hosts) > 1:
        # no channel lines (NCCL_DEBUG=WARN, or cut off), but the chosen network is known
        on = sorted(h for h, nets in out.networks.items() if "Socket" in nets)
        if on:
            text = _NETWORK_TEXT.format(", ".join(on[:MAX_EXAMPLES]), len(out.hosts))
            out.flags.append(Flag(INTER_SOCKET, text, ()))


def _ex(pairs: set[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    return tuple(sorted(pairs)[:MAX_EXAMPLES])


_INTRA_TEXT = (
    "intra-node traffic left NVLink/P2P: {} connection(s) between GPUs of one node went via "
    "{} (P2P disabled or unavailable: NCCL_P2P_DISABLE, NVLink down, ACS/IOMMU, containers "
    "without IPC)"
)
_SOCKET_TEXT = (
    "inter-node traffic fell back to sockets: {} connection(s) via NET/Socket instead of "
    "InfiniBand/RoCE (NCCL_IB_DISABLE, no IB device or driver in the job's environment, "
    "NCCL_NET=Socket)"
)
_NETWORK_TEXT = (
    "inter-node traffic fell back to sockets: NCCL chose 'network Socket' on {} of a {}-node job"
)


# -- what the diagnosis reads ------------------------------------------------------------------

SOCKET, IB = "socket", "ib"
_CHOICE_TEXT = "NCCL was told to use sockets ({}): the job's choice, not the node's fault"


@dataclass(frozen=True, slots=True)
class NcclFacts:
    """The verdicts of a job's NCCL logs as the rules read them (``nccl`` matcher).

    ``inter_node_transport``: ``socket``, ``ib`` or a network plugin's name (lowercase), from
    the inter-node channel lines, else the network NCCL chose (``Using network X``), else
    its init lines (``NET/IB : No device found.`` then ``NET/Socket : Using``: NCCL 2.4 to
    2.6 print nothing more); None when the logs say nothing. ``user_choice``: the setting
    that asked for sockets (``NCCL_IB_DISABLE=1``, ``NCCL_NET=Socket``), when NCCL reported
    taking it; ``intra_choice`` likewise ``NCCL_P2P_DISABLE=1`` for traffic between the GPUs
    of a node. ``intra_node_left_nvlink``: SHM or NET between GPUs of one node, or NCCL
    saying ``P2P is disabled between NVLINK connected GPUs``. ``evidence``: one line each,
    what showed it."""

    hosts: tuple[str, ...] = ()
    version: str | None = None
    inter_node_transport: str | None = None
    intra_node_left_nvlink: bool = False
    intra_node_transports: tuple[str, ...] = ()
    user_choice: str | None = None
    intra_choice: str | None = None
    evidence: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: object) -> NcclFacts:
        """Back from ``to_dict`` (a summary file): wrong or missing values become unknown."""
        d = data if isinstance(data, dict) else {}

        def texts(key: str) -> tuple[str, ...]:
            v = d.get(key)
            return tuple(str(x)[:300] for x in v[:MAX_EDGES]) if isinstance(v, list | tuple) else ()

        def text(key: str) -> str | None:
            v = d.get(key)
            return v[:200] if isinstance(v, str) and v else None

        return cls(texts("hosts"), text("version"), text("inter_node_transport"),
                   d.get("intra_node_left_nvlink") is True, texts("intra_node_transports"),
                   text("user_choice"), text("intra_choice"), texts("evidence"))  # fmt: skip


def facts(out: NcclTransports) -> NcclFacts:
    """The facts of a parsed job log (:func:`parse`)."""
    inter, why = _inter_node(out)
    intra = sorted({t for r in out.ranks.values() for t in r.intra})
    slow = [f for f in out.flags if f.kind == INTRA_SLOW]
    evidence = [why] if why else []
    evidence += [f.text for f in slow]
    evidence += out.p2p_disabled
    choice = _user_choice(out.env)
    if choice and inter == SOCKET:
        evidence.append(_CHOICE_TEXT.format(choice))
    p2p = out.env.get("NCCL_P2P_DISABLE", "0").strip()
    versions = sorted(out.versions, key=lambda v: tuple(int(x) for x in v.split(".")))
    return NcclFacts(tuple(sorted(out.hosts)[:MAX_EDGES]), versions[-1] if versions else None,
                     inter, bool(slow or out.p2p_disabled), tuple(intra), choice,
                     f"NCCL_P2P_DISABLE={p2p}" if p2p not in ("", "0") else None,
                     tuple(evidence))  # fmt: skip


def read_facts(lines: Iterable[str]) -> NcclFacts:
    """:func:`facts` of :func:`parse` of ``lines``: the one call readers make."""
    return facts(parse(lines))


def _inter_node(out: NcclTransports) -> tuple[str | None, str]:
    """(transport, why) between nodes: channel lines first, then the chosen network, then
    the network init lines."""
    used = {n for r in out.ranks.values() for n in r.inter}
    if used:
        name = "Socket" if "Socket" in used else "IB" if "IB" in used else sorted(used)[0]
        flag = next((f.text for f in out.flags if f.kind == INTER_SOCKET), "")
        return name.lower(), flag or f"inter-node channels via NET/{name}"
    chosen = {_kind(n): n for nets in out.networks.values() for n in nets}
    if chosen:
        kind = SOCKET if SOCKET in chosen else IB if IB in chosen else sorted(chosen)[0]
        on = sorted(h for h, nets in out.networks.items() if any(_kind(n) == kind for n in nets))
        where = ", ".join(on[:MAX_EXAMPLES])
        return kind, f"NCCL chose 'network {chosen[kind]}' on {where}"
    if any("IB" in v for v in out.net_init.values()):
        return IB, "NET/IB : Using (an InfiniBand/RoCE device)"
    socket = sorted(h for h, v in out.net_init.items() if "Socket" in v)
    if socket:
        why = "NET/IB : No device found, " if out.no_ib_device else ""
        return SOCKET, f"{why}NET/Socket : Using on {', '.join(socket[:MAX_EXAMPLES])}"
    return None, ""


def _kind(network: str) -> str:
    """``Socket`` -> socket; ``IB``, ``IBext_v8`` (NVIDIA's plugin) -> ib; a plugin's name
    lowercased."""
    low = network.strip().lower()
    return SOCKET if low.startswith(SOCKET) else IB if low.startswith(IB) else low


def _user_choice(env: dict[str, str]) -> str | None:
    if env.get("NCCL_IB_DISABLE", "0").strip() not in ("", "0"):
        return f"NCCL_IB_DISABLE={env['NCCL_IB_DISABLE'].strip()}"
    net = env.get("NCCL_NET", "")
    return f"NCCL_NET={net}" if net.strip().lower() == SOCKET else None
