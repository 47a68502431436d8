"""The network part of the detection-quality corpus.

Kernel-log cases (:func:`network_cases`): mlx5 driver lines on an H100 node with a
generated 4-HCA NDR tree (``[rdma]`` on), run through the same hooks as the GPU corpus:
firmware fatal errors, command-interface hangs, cable errors, PCI errors and link flapping
drain; one flap and an unplugged cable warn; informational lines and a fault on an HCA
outside the fabric do neither. The lines are the public reports' of ``tests/data/mlx5`` or
the driver's format strings filled in, on the tree's mlx5_1.

NCCL cases (:func:`nccl_cases`, :func:`judge_nccl`): a job's NCCL log and node count, and
the rule a correct diagnosis names (or none), from the real logs of ``tests/data/nccl`` and
lines filled from NCCL's format strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from slurmhealth.rdma import simtree
from tests.support.corpus_common import scenario
from tests.support.detection import JOB_S, Case, Line

DATA = Path(__file__).resolve().parents[1] / "data"
MLX5_1 = "0000:3c:00.0"  # ndr4: mlx5_1
DEVICES = ["mlx5_0", "mlx5_1", "mlx5_2"]  # mlx5_3 is not the fabric's (a storage port)
MID = JOB_S / 2


def _mlx5(msg: str, bus: str = MLX5_1, dev: str = "") -> str:
    return f"mlx5_core {bus}{' ' + dev if dev else ''}: {msg}"


def _real(name: str, bus: str) -> list[str]:
    from slurmhealth.kernel_log import split_line

    text = (DATA / "mlx5" / name).read_text()
    return [split_line(t).text.replace(bus, MLX5_1) for t in text.splitlines() if "mlx5" in t]


def network_cases(tree_root: Path) -> list[Case]:
    """Every network kernel-log case; ``tree_root``: where the NDR tree is written (once)."""
    if not (tree_root / "class" / "infiniband").is_dir():
        simtree.write_tree(str(tree_root), simtree.preset("ndr4"))
    config = {"rdma.sysfs_root": str(tree_root), "rdma.devices": DEVICES}

    def case(klass: str, expect: str, lines: list[tuple[float, str]], **kw: object) -> Case:
        return Case(name=f"{klass}/h100-sxm", klass=klass, preset="h100-sxm", expect=expect,
                    scenario=scenario("h100-sxm"), lines=tuple(Line(t, x) for t, x in lines),
                    config=config, **kw)  # type: ignore[arg-type]  # fmt: skip

    hang = _real("netdev_2025_cx7_access_reg.log", "0000:56:00.0")
    eeh = _real("netdev_2022_eeh_sriov.log", "400f:01:00.0")
    down, up = _mlx5("Link down", dev="ibp60s0"), _mlx5("Link up", dev="ibp60s0")
    checks = ("ib_kernel_log",)
    return [
        case("net_cmd_timeout", "drain", [(MID + i, x) for i, x in enumerate(hang)]),
        case("net_fatal_error", "drain", [(MID + i, x) for i, x in enumerate(eeh)]),
        case("net_fatal_miss_count", "drain", [(MID, _mlx5(
            "poll_health:786:(pid 0): device's health compromised - reached miss count"))]),
        case("net_cable_error", "drain", [(MID, _mlx5(
            "Port module event[error]: module 1, Cable error, Bad or shorted cable/module"))]),
        case("net_pci_frozen", "drain", [(MID, _mlx5(
            "mlx5_pci_err_detected Device state = 1 health sensors: 1 pci_status: 1. "
            "Enter, pci channel state = 2"))]),
        case("net_link_flapping", "drain",
             [(MID + 60 * i + s, x) for i in range(3) for s, x in ((0, down), (5, up))]),
        case("net_one_flap", "warn", [(MID, down), (MID + 4, up)], checks=checks),
        case("net_flaps_hours_apart", "warn",
             [(600 + 1200 * i + s, x) for i in range(3) for s, x in ((0, down), (5, up))],
             checks=checks),
        case("net_cable_unplugged", "warn", [(MID, _mlx5(
            "Port module event: module 1, Cable unplugged"))], checks=checks),
        case("net_fatal_off_fabric", "warn", [(MID, _mlx5(
            "poll_health:800:(pid 0): Fatal error 1 detected", bus="0000:bc:00.0"))],
             checks=checks),
        case("net_info_lines", "ok", [
            (MID, _mlx5("firmware version: 28.39.1002")),
            (MID + 1, _mlx5("Port module event: module 1, Cable plugged")),
            (MID + 2, up),
            (MID + 3, _mlx5("mlx5_cmd_out_err:838:(pid 1234): ACCESS_REG(0x805) op_mod(0x1) "
                            "failed, status bad parameter(0x3), syndrome (0x6f2c8a), err(-22)")),
        ]),
    ]  # fmt: skip


@dataclass(frozen=True)
class NcclCase:
    name: str
    text: str
    nodes: int
    expect: tuple[str, ...]  # the NCCL rules a correct diagnosis names; (): none


def _line(host: str, dev: int, msg: str) -> str:
    return f"{host}:{100 + dev}:{200 + dev} [{dev}] NCCL INFO {msg}"


NCCL_RULES = ("nccl_socket_fallback", "nccl_sockets_by_choice", "nvlink_degraded")


def nccl_cases() -> list[NcclCase]:
    def real(name: str) -> str:
        return (DATA / "nccl" / name).read_text()

    ib = [_line(h, d, f"Channel 00/0 : {r}[{d}] -> {p}[{d}] [send] via NET/IB/{d}/GDRDMA")
          for h, d, r, p in (("a", 0, 0, 8), ("b", 0, 8, 0))]  # fmt: skip
    sock = [_line("a", 0, "Using network Socket"), _line("b", 0, "Using network Socket")]
    return [
        NcclCase(
            "nccl/2.4/8-hosts-no-ib",
            real("issue226_nccl247_8hosts_socket.log"),
            8,
            ("nccl_socket_fallback",),
        ),
        # its containers' GPUs of one host talk over shared memory: P2P is lost there too
        NcclCase(
            "nccl/2.4/ring-net-socket",
            real("issue367_ring_net_socket.log"),
            2,
            ("nccl_socket_fallback", "nvlink_degraded"),
        ),
        NcclCase("nccl/2.19/using-network-socket", "\n".join(sock), 2, ("nccl_socket_fallback",)),
        NcclCase(
            "nccl/2.2x/channel-net-socket",
            _line("a", 0, "Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0"),
            2,
            ("nccl_socket_fallback",),
        ),
        NcclCase(
            "nccl/choice/ib-disable",
            "\n".join([_line("a", 0, "NCCL_IB_DISABLE set by environment to 1."), *sock]),
            2,
            ("nccl_sockets_by_choice",),
        ),
        NcclCase(
            "nccl/choice/nccl-net",
            "\n".join([_line("a", 0, "Comm config netName reset to NCCL_NET=Socket"), *sock]),
            2,
            ("nccl_sockets_by_choice",),
        ),
        NcclCase(
            "nccl/intra/p2p-disabled",
            _line(
                "a",
                0,
                "P2P is disabled between NVLINK "
                "connected GPUs 1 and 0. This should not be the case given their "
                "connectivity, and is probably due to a hardware issue.",
            ),
            1,
            ("nvlink_degraded",),
        ),
        NcclCase("nccl/ok/one-rank-socket", real("issue1267_nccl2193_one_rank_socket.log"), 1, ()),
        NcclCase("nccl/ok/h20-ib-cumem", real("issue1189_h20_ib_gdrdma_cumem.log"), 2, ()),
        NcclCase("nccl/ok/ibext-plugin", real("issue1814_ibext_v8_plugin.log"), 4, ()),
        NcclCase("nccl/ok/ib-channels", "\n".join(ib), 2, ()),
        NcclCase(
            "nccl/ok/p2p-disabled-by-user",
            "\n".join(
                [
                    _line("a", 0, "NCCL_P2P_DISABLE set by environment to 1."),
                    _line("a", 0, "Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct"),
                ]
            ),
            1,
            (),
        ),
    ]


def judge_nccl(case: NcclCase) -> set[str]:
    """The NCCL-related rules the diagnosis of ``case`` names."""
    from slurmhealth.diagnose.engine import diagnose
    from slurmhealth.diagnose.facts import Facts, NodeFacts
    from slurmhealth.model_records import Job

    nodes = tuple(f"n{i + 1}" for i in range(case.nodes))
    job = Job("1", node_names=nodes, state="completed", exit_code="0:0")
    facts = Facts(job, (NodeFacts("n1", logs={"nccl": case.text}),))
    return {d.rule for d in diagnose(facts)} & set(NCCL_RULES)


def precision_recall(tp: int, fp: int, fn: int) -> tuple[float | None, float | None]:
    """(precision, recall); None where nothing was predicted / expected."""
    return (tp / (tp + fp) if tp + fp else None, tp / (tp + fn) if tp + fn else None)
