"""The RDMA adapter reads the kernel's sysfs formats (``sysfs-class-infiniband``): states,
rates, counters in 4-byte words, the PCIe path that ties an HCA to its GPUs, RoCE net
devices, nvidia_peermem; odd or missing files are unknown, never an error."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurmhealth.rdma import read_rdma, simtree
from slurmhealth.rdma.model import ERROR_COUNTERS, gpus_near, parse_rate, parse_state


@pytest.mark.parametrize(
    ("text", "gbps", "width", "speed"),
    [
        ("400 Gb/sec (4X NDR)", 400.0, 4, "NDR"),
        ("200 Gb/sec (4X HDR)", 200.0, 4, "HDR"),
        ("100 Gb/sec (4X EDR)", 100.0, 4, "EDR"),
        ("56 Gb/sec (4X FDR)", 56.0, 4, "FDR"),
        ("2.5 Gb/sec (1X SDR)", 2.5, 1, "SDR"),
        ("800 Gb/sec (4X XDR)", 800.0, 4, "XDR"),
        ("10 Gb/sec (4X)", 10.0, 4, None),  # the SDR line of kernels before 5.x
        ("400", 400.0, None, None),  # ibstat
    ],
)
def test_rates_as_the_kernel_and_ibstat_print_them(
    text: str, gbps: float, width: int | None, speed: str | None
) -> None:
    rate = parse_rate(text + "\n")
    assert rate is not None and (rate.gbps, rate.width, rate.speed) == (gbps, width, speed)


def test_states_and_odd_text() -> None:
    assert parse_state("4: ACTIVE\n") == (4, "ACTIVE")
    assert parse_state("7: Phy Test") == (7, "Phy Test")
    assert parse_state("0: <unknown>") == (0, "<unknown>")
    assert parse_state("weird") == (None, "weird")
    assert parse_state("") == (None, None) and parse_rate("fast") is None


def _tree(tmp_path: Path, name: str = "ndr4") -> str:
    root = str(tmp_path / "sys")
    simtree.write_tree(root, simtree.preset(name))
    return root


def test_ports_counters_and_identity(tmp_path: Path) -> None:
    rdma = read_rdma(_tree(tmp_path), ts=123.0)
    assert [h.name for h in rdma.hcas] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    h = rdma.hcas[1]
    assert (h.pci_bus_id, h.hca_type, h.fw_ver, h.numa_node) == (
        "0000:3c:00.0",
        "MT4129",
        "28.39.1002",
        0,
    )
    assert h.node_guid is not None and len(h.node_guid.split(":")) == 4
    p = h.ports[0]
    assert (p.name, p.active, p.link_up, p.link_layer) == ("mlx5_1/1", True, True, "InfiniBand")
    assert p.counters["symbol_error"] == 0 and "lifespan" not in p.hw_counters
    tx, rx = p.data_bytes()
    assert (tx, rx) == (p.counters["port_xmit_data"] * 4, p.counters["port_rcv_data"] * 4)
    assert rdma.ts == 123.0 and rdma.peermem_loaded is True and rdma.error is None


def test_gpus_behind_the_same_switch(tmp_path: Path) -> None:
    four = read_rdma(_tree(tmp_path / "a", "ndr4"))
    assert [gpus_near(h, four.gpus) for h in four.hcas] == [
        ("0000:18:00.0", "0000:2a:00.0"),
        ("0000:3a:00.0", "0000:5d:00.0"),
        ("0000:9a:00.0", "0000:ab:00.0"),
        ("0000:ba:00.0", "0000:db:00.0"),
    ]
    eight = read_rdma(_tree(tmp_path / "b", "ndr8"))
    assert gpus_near(eight.hcas[7], eight.gpus) == ("0000:db:00.0",)


def test_roce_ports_name_their_net_device(tmp_path: Path) -> None:
    rdma = read_rdma(_tree(tmp_path, "roce8"))
    h = rdma.hcas[2]
    assert h.netdevs == ("ens3np0",) and h.ports[0].netdevs == ("ens3np0",)
    assert h.ports[0].link_layer == "Ethernet" and "np_cnp_sent" in h.ports[0].hw_counters
    assert (
        read_rdma(_tree(tmp_path / "x", "roce8"), hw_counters=False).hcas[0].ports[0].hw_counters
        == {}
    )


def test_odd_files_are_unknown_not_errors(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    port = os.path.join(root, "class", "infiniband", "mlx5_0", "ports", "1")
    with open(os.path.join(port, "counters", "symbol_error"), "w") as fh:
        fh.write("N/A (no PMA)\n")
    os.unlink(os.path.join(port, "rate"))
    with open(os.path.join(port, "state"), "w") as fh:
        fh.write("garbage\n")
    p = read_rdma(root).hcas[0].ports[0]
    assert "symbol_error" not in p.counters and p.rate is None
    assert (p.state, p.active) == (None, None)


def test_a_device_link_outside_the_tree_has_no_pcie_path(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    link = os.path.join(root, "class", "infiniband", "mlx5_0", "device")
    os.unlink(link)
    os.symlink(str(tmp_path), link)
    h = read_rdma(root).hcas[0]
    assert (h.pcie_path, h.pci_bus_id) == ((), None)


def test_a_node_without_rdma_devices_or_module_info(tmp_path: Path) -> None:
    rdma = read_rdma(str(tmp_path))
    assert (rdma.hcas, rdma.gpus, rdma.peermem_loaded, rdma.error) == ((), (), None, None)
    spec = simtree.preset("ndr4")
    spec.peermem = False
    root = str(tmp_path / "sys")
    simtree.write_tree(root, simtree.preset("ndr4"))
    simtree.write_tree(root, spec)  # unloaded since
    assert read_rdma(root).peermem_loaded is False


def test_generator_refuses_unknown_names() -> None:
    with pytest.raises(KeyError, match="ndr4"):
        simtree.preset("ndr9")
    with pytest.raises(KeyError, match="flaps"):
        simtree.fault(simtree.preset("ndr4"), "melted", "mlx5_0")
    with pytest.raises(KeyError, match="mlx5_9/1"):
        simtree.fault(simtree.preset("ndr4"), "down", "mlx5_9")


def test_the_generator_command_writes_a_faulty_tree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(tmp_path / "sys")
    assert simtree.main([root, "--preset", "ndr4", "--fault", "init:mlx5_2/1", "--no-peermem"]) == 0
    rdma = read_rdma(root)
    assert rdma.hca("mlx5_2") is not None and rdma.peermem_loaded is False
    assert [p.name for p in rdma.ports() if not p.active] == ["mlx5_2/1"]
    assert simtree.main([root, "--fault", "melt:mlx5_0"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_quick_read_takes_only_the_asked_counters_and_gpus(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    quick = read_rdma(
        root,
        hw_counters=False,
        counters=ERROR_COUNTERS,
        gpu_pci_bus_ids=["00000000:18:00.0", "00000000:2A:00.0", "not a bus"],
    )
    p = quick.hcas[0].ports[0]
    assert set(p.counters) == set(ERROR_COUNTERS) and p.hw_counters == {}
    assert [g.pci_bus_id for g in quick.gpus] == ["0000:18:00.0", "0000:2a:00.0"]
    assert gpus_near(quick.hcas[0], quick.gpus) == ("0000:18:00.0", "0000:2a:00.0")
