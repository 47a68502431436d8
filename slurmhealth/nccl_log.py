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
since 2.19) map ranks to hosts.

The connecting rank of a line is its source, or its destination for ``[receive]``; its host
is the line's prefix. P2P, SHM and NVLS only connect GPUs of one node; a NET connection is
inter-node unless both ranks are known on one host. Two verdicts follow: intra-node traffic
that left NVLink/P2P (SHM, or NET between GPUs of one node) and inter-node traffic over
sockets (``NET/Socket``) instead of InfiniBand/RoCE or a network plugin.

The log is the job user's file (hostile input): lines over ``MAX_LINE_CHARS`` are skipped
and at most ``MAX_EDGES`` distinct connections are kept. Pure: lines in, a summary out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_LINE_CHARS = 2048
MAX_EDGES = 100_000
MAX_EXAMPLES = 5  # rank pairs quoted per flag

_PREFIX = re.compile(r"([^\s:\[\]]{1,255}):(\d{1,10}):(\d{1,10}) \[(\d{1,6})\] NCCL INFO (.*)$")
_CHANNEL = re.compile(
    r"^(?:Channel|Ring) (\d{1,4})(?:/(\d{1,4}))? ?: (\d{1,9})\[([0-9a-fA-F]{1,16})\] -> "
    r"(\d{1,9})\[([0-9a-fA-F]{1,16})\](?: \[(send|receive)\])? via (\S.*)$"
)
_RANKS = re.compile(r"\brank (\d{1,9}) n[Rr]anks (\d{1,9})\b")
_NETWORK = re.compile(r"^Using network (\S.*?)\s*$")
_NET_DEVICES = re.compile(r"^NET/(IB|Socket) ?: (Using .*|No device found.*)$")

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
        m = _PREFIX.search(line.rstrip("\r\n"))
        if m is None:
            continue
        host, msg = m.group(1), m.group(5)
        if len(out.hosts) < MAX_EDGES:
            out.hosts.add(host)
        if ch := _channel(m):
            out.channel_lines += 1
            hosts.setdefault(ch.rank, set()).add(host)
            if len(edges) < MAX_EDGES:
                edges.add((host, ch.rank, ch.peer, ch.transport, ch.network))
        elif r := _RANKS.search(msg):
            hosts.setdefault(int(r.group(1)), set()).add(host)
        elif n := _NETWORK.match(msg):
            out.networks.setdefault(host, set()).add(n.group(1)[:64])
        elif (d := _NET_DEVICES.match(msg)) and d.group(1) == "IB" and "No device" in msg:
            out.no_ib_device.add(host)
    _judge(out, edges, hosts)
    return out


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
