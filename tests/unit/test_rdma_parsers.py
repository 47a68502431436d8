"""Parsers of the network tools' outputs, from their documented formats and public examples:
``ibstat`` (infiniband-diags), ``ib_write_bw`` / ``ib_read_bw`` (perftest) and the mlx5
driver's kernel-log lines; each with a hypothesis run (never raises, bounded results)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmhealth.baseline.model import BaselineParseError, BenchmarkFailed
from slurmhealth.baseline.parsers import parse
from slurmhealth.kernel_log.net_patterns import NET_EVENT_KINDS, parse_net_event
from slurmhealth.rdma.ibstat import parse_ibstat

IBSTAT = """\
CA 'mlx5_0'
\tCA type: MT4129
\tNumber of ports: 1
\tFirmware version: 28.39.1002
\tHardware version: 0
\tNode GUID: 0x946dae0300f5a1b2
\tSystem image GUID: 0x946dae0300f5a1b2
\tPort 1:
\t\tState: Active
\t\tPhysical state: LinkUp
\t\tRate: 400
\t\tBase lid: 5
\t\tLMC: 0
\t\tSM lid: 1
\t\tCapability mask: 0xa751e848
\t\tPort GUID: 0x946dae0300f5a1b2
\t\tLink layer: InfiniBand
CA 'mlx5_1'
\tCA type: MT4129
\tNumber of ports: 1
\tFirmware version: 28.39.1002
\tHardware version: 0
\tNode GUID: 0x946dae0300f5a1c4
\tSystem image GUID: 0x946dae0300f5a1c4
\tPort 1:
\t\tState: Down
\t\tPhysical state: Polling
\t\tRate: 10
\t\tBase lid: 65535
\t\tLMC: 0
\t\tSM lid: 0
\t\tCapability mask: 0xa751e848
\t\tPort GUID: 0x946dae0300f5a1c4
\t\tLink layer: InfiniBand
CA 'mlx5_bond_0'
\tCA type: MT4125
\tNumber of ports: 1
\tFirmware version: 22.36.1010
\tHardware version: 0
\tNode GUID: 0x0000000000000000
\tSystem image GUID: 0x1070fd0300b1c2d4
\tPort 1:
\t\tState: Active
\t\tPhysical state: LinkUp
\t\tRate: 100
\t\tBase lid: 0
\t\tLMC: 0
\t\tSM lid: 0
\t\tCapability mask: 0x00010000
\t\tPort GUID: 0x1270fdfffeb1c2d4
\t\tLink layer: Ethernet
"""


def test_ibstat_reads_every_ca_and_port_state() -> None:
    hcas = parse_ibstat(IBSTAT)
    assert [h.name for h in hcas] == ["mlx5_0", "mlx5_1", "mlx5_bond_0"]
    assert (hcas[0].fw_ver, hcas[0].hca_type) == ("28.39.1002", "MT4129")
    ok, down, eth = (h.ports[0] for h in hcas)
    assert (ok.name, ok.active, ok.link_up, ok.rate and ok.rate.gbps) == (
        "mlx5_0/1",
        True,
        True,
        400,
    )
    assert (down.state_name, down.phys_state_name, down.active) == ("DOWN", "Polling", False)
    assert (eth.link_layer, eth.rate and eth.rate.gbps) == ("Ethernet", 100)


def test_ibstat_one_port_form_old_hca_and_odd_rates() -> None:
    text = (
        "CA: 'mlx4_0'\nPort 1:\nState: Initializing\nPhysical state: LinkUp\n"
        "Rate: 40 (FDR10)\nLink layer: InfiniBand\n"
        "CA 'qib0'\n\tPort 1:\n\t\tState: ???\n\t\tPhysical state: Disabled\n\t\tRate: 2.5\n"
    )
    mlx4, qib = parse_ibstat(text)
    p = mlx4.ports[0]
    assert (p.state, p.state_name, p.phys_state) == (2, "INIT", 5)
    assert p.rate is not None and (p.rate.gbps, p.rate.speed) == (40.0, "FDR10")
    q = qib.ports[0]
    assert (q.state, q.phys_state_name, q.rate and q.rate.gbps) == (None, "Disabled", 2.5)


@settings(max_examples=300)
@given(st.text(max_size=400))
def test_ibstat_never_raises(text: str) -> None:
    for hca in parse_ibstat("CA 'mlx5_0'\n" + text):
        assert all(len(p.state_name or "") <= 64 for p in hca.ports)


BANNER = """\
************************************
* Waiting for client to connect... *
************************************
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF\t\tDevice         : mlx5_0
 Number of qps   : 1\t\tTransport type : IB
 Connection type : RC\t\tUsing SRQ      : OFF
 PCIe relax order: ON
 ibv_wr* API     : ON
 TX depth        : 128
 CQ Moderation   : 100
 Mtu             : 4096[B]
 Link type       : IB
 Max inline data : 0[B]
 rdma_cm QPs\t : OFF
 Data ex. method : Ethernet
---------------------------------------------------------------------------------------
 local address: LID 0x05 QPN 0x0088 PSN 0x9b5f9b RKey 0x1fdfbb VAddr 0x007f3f2d1b0000
 remote address: LID 0x07 QPN 0x0088 PSN 0x4c0f2a RKey 0x1fe0bc VAddr 0x007f9d4a3c0000
---------------------------------------------------------------------------------------
"""


def test_ib_write_bw_gbits_single_size() -> None:
    text = BANNER + (
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
        " 65536      5000             392.87             392.11\t\t   0.747872\n"
        "---------------------------------------------------------------------------------------\n"
    )
    r = parse("perftest", text)
    got = {m.metric: m.value for m in r.measurements}
    assert got == {
        "ib_write_bw.bw_avg": 392.11,
        "ib_write_bw.bw_peak": 392.87,
        "ib_write_bw.bw_avg@65536": 392.11,
    }
    assert r.passed and r.meta["device"] == "mlx5_0" and r.meta["link_type"] == "IB"


def test_ib_read_bw_megabytes_sweep_in_gbps_from_the_largest_size() -> None:
    text = BANNER.replace("RDMA_Write", "RDMA_Read") + (
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
        " 2          1000           10.32              10.11\t\t   5.300411\n"
        " 8388608    1000           46800.00           46799.12\t\t   0.005850\n"
    )
    r = parse("perftest", text)
    got = {m.metric: m.value for m in r.measurements}
    assert got["ib_read_bw.bw_avg"] == pytest.approx(46799.12 * 1048576 * 8 / 1e9, abs=1e-3)
    assert {m.unit for m in r.measurements} == {"Gb/s"}
    assert r.meta["sizes"] == [2, 8388608]


def test_duration_run_with_a_warning_inside_the_table_and_roce() -> None:
    text = BANNER.replace("Link type       : IB", "Link type       : Ethernet") + (
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
        "Conflicting CPU frequency values detected: 1500.000000 != 3300.016000. "
        "CPU Frequency is not max.\n"
        " 65536      560845           0.00               98.02                0.186950\n"
    )
    r = parse("perftest", text)
    assert [m.metric for m in r.measurements] == ["ib_write_bw.bw_avg", "ib_write_bw.bw_avg@65536"]
    assert r.passed and r.meta["link_type"] == "Ethernet"


def test_bidirectional_qos_and_per_port_layouts() -> None:
    qos = BANNER.replace("RDMA_Write BW", "RDMA_Write Bidirectional BW") + (
        " #bytes    #sl      #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
        " 65536     3        5000           780.10             779.55             1.486\n"
    )
    assert parse("perftest", qos).measurements[0].metric == "ib_write_bw_bidir.bw_avg"
    assert parse("perftest", qos).measurements[0].value == 779.55
    per_port = BANNER + (
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
        "   BW Port1[Gb/sec]   MsgRate Port1[Mpps]   BW Port2[Gb/sec]   MsgRate Port2[Mpps]\n"
        " 65536      5000           190.2              189.9              0.36   95.0   0.18"
        "   94.9   0.18\n"
    )
    assert parse("perftest", per_port).measurements[0].value == 189.9


def test_a_run_that_never_connected_measured_nothing() -> None:
    text = " Couldn't connect to 10.0.0.2:18515\nUnable to open file descriptor for socket\n"
    with pytest.raises(BenchmarkFailed, match="Couldn't connect"):
        parse("perftest", text)
    with pytest.raises(BaselineParseError, match="result table"):
        parse("perftest", "hello\n")
    zero = BANNER + (
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
        " 65536      5000             0.00               0.00             0.000000\n"
    )
    with pytest.raises(BenchmarkFailed):
        parse("perftest", zero)


@settings(max_examples=300)
@given(
    st.text(max_size=300),
    st.sampled_from(["", " #bytes #iterations BW peak[Gb/sec] BW average[Gb/sec]\n"]),
)
def test_perftest_parser_raises_only_its_own_errors(text: str, head: str) -> None:
    try:
        r = parse("perftest", head + text)
    except BaselineParseError:
        return
    assert r.measurements and all(m.value > 0 for m in r.measurements)


CORE = "mlx5_core 0000:01:00.0"
MLX5_LINES = [  # line, kind, bus, device, module, level
    (f"{CORE} enp1s0f0: Link down", "net_link_down", "0000:01:00.0", "enp1s0f0", None, "warn"),
    (f"{CORE} enp1s0f0: Link up", "net_link_up", "0000:01:00.0", "enp1s0f0", None, "info"),
    (
        f"{CORE}: Port module event: module 0, Cable plugged",
        "net_module", "0000:01:00.0", "mlx5_core", 0, "info",
    ),
    (
        "mlx5_core 0000:5e:00.0: mlx5_port_module_event:1147:(pid 0): "
        "Port module event: module 1, Cable unplugged",
        "net_module", "0000:5e:00.0", "mlx5_core", 1, "warn",
    ),
    (
        "mlx5_core 0000:5c:00.0: Port module event[error]: module 0, Cable error, High Temperature",
        "net_module_error", "0000:5c:00.0", "mlx5_core", 0, "error",
    ),
    (
        "mlx5_core: Port module event[error]: module 3, Cable error, Bad or shorted cable/module",
        "net_module_error", None, "mlx5_core", 3, "error",
    ),
    (
        "mlx5_core 0000:12:00.0: mlx5_pcie_event:299:(pid 268269): "
        "Detected insufficient power on the PCIe slot (27W).",
        "net_pcie_power", "0000:12:00.0", "mlx5_core", 27, "error",
    ),
    (
        "mlx5_core 0000:d2:00.0: poll_health:174: "
        "device's health compromised - reached miss count.",
        "net_health", "0000:d2:00.0", "mlx5_core", None, "fatal",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("line", "kind", "bus", "device", "code", "level"), MLX5_LINES)
def test_mlx5_kernel_lines(
    line: str, kind: str, bus: str | None, device: str, code: int | None, level: str
) -> None:
    e = parse_net_event(line, seq=7, ts=5.0)
    assert e is not None
    assert (e.kind, e.pci_bus_id, e.device, e.code, e.level) == (kind, bus, device, code, level)
    assert (e.seq, e.ts, e.raw) == (7, 5.0, line)


@pytest.mark.parametrize(
    "line",
    [
        "mlx5_core 0000:01:00.0: firmware version: 16.35.4030",
        "mlx5_core 0000:43:00.0: E-Switch: Total vports 18, per vport: max uc(128) max mc(2048)",
        "IPv6: ADDRCONF(NETDEV_CHANGE): enp1s0f0: link becomes ready",
        "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=python, GPU has fallen off the bus.",
        "e1000e 0000:00:1f.6 eno1: Link is Down",
    ],
)
def test_other_lines_are_not_network_faults(line: str) -> None:
    assert parse_net_event(line) is None


@settings(max_examples=300)
@given(st.text(max_size=200), st.sampled_from(["mlx5_core ", "mlx5_core 0000:01:00.0: ", ""]))
def test_net_patterns_never_raise(text: str, prefix: str) -> None:
    e = parse_net_event(prefix + text)
    assert e is None or e.kind in NET_EVENT_KINDS


def test_an_unreadable_peak_is_not_measured_the_average_still_is() -> None:
    for peak in ("nan", "inf", "-nan"):
        text = BANNER + (
            " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
            f" 65536      5000             {peak}             392.11             0.747872\n"
        )
        got = {m.metric: m.value for m in parse("perftest", text).measurements}
        assert got == {"ib_write_bw.bw_avg": 392.11, "ib_write_bw.bw_avg@65536": 392.11}, peak
