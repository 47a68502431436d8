"""The sidecar's RDMA watch over a generated sysfs tree: the job's per-port series (state,
errors summed or per counter, bytes in bytes, not 4-byte words) and the ``ib_errors`` event,
judged with the same ``[checks.ib_errors]`` thresholds and ``[checks] disabled`` list as the
prolog."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry

from slurmhealth.config import Config, load_config
from slurmhealth.metrics.job_series import RDMA_ERROR_COUNTERS, SidecarCollector
from slurmhealth.model import Severity
from slurmhealth.model_records import ExportState, Job
from slurmhealth.rdma import simtree
from slurmhealth.sidecar.rdma import RdmaWatch, configured, job_ports
from slurmhealth.sidecar.state import Event
from tests.unit.test_detectors import T0, snap

FAST = "[checks.ib_errors]\nmin_window_s = 60\nmin_count = 5\n"


def config(
    tmp_path: Path, toml: str = FAST, root: Path | None = None, devices: str = "mlx5_0 mlx5_1"
) -> Config:
    """[rdma] over the tree at ``root`` (default tmp_path/sys), the fabric ``devices``."""
    path = tmp_path / "config.toml"
    tree = root if root is not None else tmp_path / "sys"
    fabric = ", ".join(f'"{d}"' for d in devices.split())
    path.write_text(f'[rdma]\nsysfs_root = "{tree}"\ndevices = [{fabric}]\n{toml}')
    return load_config(str(path), env={}, flags={"paths.db": str(tmp_path / "h.db")})


def symbol_errors(tmp_path: Path, per_s: float = 1.0) -> simtree.NodeSpec:
    """ndr4: mlx5_1/1 takes ``per_s`` symbol errors a second from t = 0."""
    spec = simtree.preset("ndr4")
    spec = simtree.fault(spec, "counter", "mlx5_1", counter="symbol_error", per_s=per_s)
    simtree.write_tree(str(tmp_path / "sys"), spec, 0.0)
    return spec


def watch_events(cfg: Config, spec: simtree.NodeSpec, root: Path, until: int = 200) -> list[Event]:
    """A sidecar sampling every 10 s for ``until`` seconds."""
    w = RdmaWatch(cfg)
    out = []
    for t in range(0, until, 10):
        simtree.update_counters(str(root), spec, float(t))
        s = snap(t)
        out += w.observe(w.read(s), s)
    return out


def test_growing_symbol_errors_are_one_ib_errors_event_on_the_port(tmp_path: Path) -> None:
    spec = symbol_errors(tmp_path)
    cfg = config(tmp_path)
    assert configured(cfg)
    events = watch_events(cfg, spec, tmp_path / "sys")
    assert [(e.kind, e.ts - T0, e.severity) for e in events] == [("ib_errors", 60, Severity.FAIL)]
    e = events[0]
    assert e.message.startswith("ib_errors mlx5_1/1 errors growing: symbol_error +60")
    assert (e.evidence["hca"], e.evidence["port"], e.evidence["gpus"]) == ("mlx5_1", 1, [2, 3])
    assert e.evidence["failing"] == ["symbol_error"] and e.gpu is None


def test_the_sidecar_uses_the_sites_thresholds_and_disabled_list(tmp_path: Path) -> None:
    spec = symbol_errors(tmp_path)
    root = tmp_path / "sys"
    slower = config(tmp_path, "[checks.ib_errors]\nmin_window_s = 120\nmin_count = 5\n")
    assert [e.ts - T0 for e in watch_events(slower, spec, root)] == [120]
    higher = config(tmp_path, FAST + "symbol_error_per_min = 100\n")
    assert watch_events(higher, spec, root) == []
    off = config(tmp_path, FAST + '[checks]\ndisabled = ["ib_errors"]\n')
    assert watch_events(off, spec, root) == []


def test_a_port_going_down_is_one_ib_port_down_event(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    simtree.write_tree(str(root), simtree.preset("ndr4"), 0.0)
    cfg = config(tmp_path)
    w = RdmaWatch(cfg)
    s = snap(0)
    assert w.observe(w.read(s), s) == []
    simtree.write_tree(str(root), simtree.fault(simtree.preset("ndr4"), "down", "mlx5_0"), 10.0)
    events = []
    for t in (10, 20):
        s = snap(t)
        events += w.observe(w.read(s), s)
    assert [(e.kind, e.evidence["hca"]) for e in events] == [("ib_port_down", "mlx5_0")]
    assert "DOWN/Polling" in events[0].message


def test_no_rdma_devices_means_no_watch(tmp_path: Path) -> None:
    assert not configured(config(tmp_path, root=tmp_path / "nothing"))


Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def series(
    tmp_path: Path, cfg: Config, gpus: range = range(8), per_counter: bool = False
) -> Series:
    """The RDMA series of a job on ``gpus`` (the sidecar's snapshot holds the job's GPUs)."""
    w = RdmaWatch(cfg)
    s = replace(snap(30), gpus=tuple(g for g in snap(30).gpus if g.index in gpus))
    rdma = job_ports(w.read(s), w.expect)
    job = Job(job_id="77", user="alice", node="n2", account="ml", partition="gpu")
    collector = SidecarCollector(lambda: ExportState(labels=job, snapshot=s, rdma=rdma),
                                 per_counter_rdma=per_counter)  # fmt: skip
    registry = CollectorRegistry()
    registry.register(collector)
    return {
        (x.name, tuple(sorted(x.labels.items()))): x.value
        for fam in registry.collect()
        for x in fam.samples
        if x.name.startswith("slurmhealth_rdma_")
    }


def test_the_jobs_rdma_series_per_judged_port_with_the_jobs_labels(tmp_path: Path) -> None:
    spec = symbol_errors(tmp_path, per_s=2.0)
    simtree.update_counters(str(tmp_path / "sys"), spec, 30.0)
    got = series(tmp_path, config(tmp_path))
    job = (("job_id", "77"), ("node", "n2"), ("priority", ""), ("user", "alice"))

    def key(name: str, hca: str, **more: str) -> tuple[str, tuple[tuple[str, str], ...]]:
        return (name, tuple(sorted({**dict(job), "hca": hca, "port": "1", **more}.items())))

    # default: one error series per port, the sum of its counters (only symbol_error grew)
    assert got[key("slurmhealth_rdma_port_errors_total", "mlx5_1", counter="all")] == 60
    assert got[key("slurmhealth_rdma_port_errors_total", "mlx5_0", counter="all")] == 0
    assert got[key("slurmhealth_rdma_port_up", "mlx5_0", state="ACTIVE/LinkUp")] == 1.0
    assert got[key("slurmhealth_rdma_port_rate_bytes_per_second", "mlx5_0")] == 50e9
    words = simtree.counter_values(spec.hcas[1].ports[1], 30.0)["port_rcv_data"]
    assert got[key("slurmhealth_rdma_port_received_bytes_total", "mlx5_1")] == 4 * words
    # only the fabric's ports ([rdma] devices), 5 series per port
    assert {dict(k[1])["hca"] for k in got} == {"mlx5_0", "mlx5_1"}
    assert len(got) == 2 * 5


def errors_by_port(got: Series) -> dict[tuple[str, str], dict[str, float]]:
    out: dict[tuple[str, str], dict[str, float]] = {}
    for (name, labels), value in got.items():
        if name == "slurmhealth_rdma_port_errors_total":
            d = dict(labels)
            out.setdefault((d["hca"], d["port"]), {})[d["counter"]] = value
    return out


def test_per_counter_rdma_splits_the_errors_instead_of_summing_them(tmp_path: Path) -> None:
    spec = symbol_errors(tmp_path, per_s=2.0)
    spec = simtree.fault(spec, "counter", "mlx5_1", counter="port_rcv_errors", per_s=1.0)
    simtree.update_counters(str(tmp_path / "sys"), spec, 30.0)
    cfg = config(tmp_path)
    summed = errors_by_port(series(tmp_path, cfg))
    split = errors_by_port(series(tmp_path, cfg, per_counter=True))
    assert summed[("mlx5_1", "1")] == {"all": 60 + 30}
    assert split[("mlx5_1", "1")]["symbol_error"] == 60
    assert split[("mlx5_1", "1")]["port_rcv_errors"] == 30
    # never both: `sum by (hca, port)` is the same in either mode
    assert all("all" not in counters for counters in split.values())
    assert {p: sum(c.values()) for p, c in split.items()} == {
        p: c["all"] for p, c in summed.items()
    }
    # the 8 counters an mlx5 port reports, 12 series a port
    assert set(split[("mlx5_0", "1")]) == set(RDMA_ERROR_COUNTERS)
    assert len(series(tmp_path, cfg, per_counter=True)) == 2 * 12


def test_rdma_series_of_an_8_hca_node_per_gpu(tmp_path: Path) -> None:
    """One HCA per GPU (ndr8): 5 series per GPU by default, for an 8-GPU job and a 1-GPU job."""
    simtree.write_tree(str(tmp_path / "sys"), simtree.preset("ndr8"), 0.0)
    cfg = config(tmp_path, "", devices="")
    assert len(series(tmp_path, cfg)) == 8 * 5
    one = series(tmp_path, cfg, gpus=range(5, 6))
    assert len(one) == 5 and {dict(k[1])["hca"] for k in one} == {"mlx5_5"}
    assert len(series(tmp_path, cfg, per_counter=True)) == 8 * 12


def test_each_node_reads_its_own_tree_through_node_in_sysfs_root(tmp_path: Path) -> None:
    from slurmhealth.hooks.rdma_read import read_rdma_for_checks

    simtree.write_tree(str(tmp_path / "n2" / "sys"), simtree.preset("ndr4"))
    cfg = config(tmp_path, root=tmp_path / "{node}" / "sys")
    assert configured(cfg, "n2") and not configured(cfg, "n1")
    assert RdmaWatch(cfg, "n2").root == str(tmp_path / "n2" / "sys")
    rdma, expect, counters = read_rdma_for_checks(cfg, replace(snap(0), node="n2"))
    assert rdma is not None and len(rdma.hcas) == 4 and "ib:mlx5_1/1" in counters
    assert expect is not None
    assert read_rdma_for_checks(cfg, replace(snap(0), node="n1")) == (None, None, {})


def test_a_job_on_two_gpus_shows_only_the_hca_behind_them(tmp_path: Path) -> None:
    symbol_errors(tmp_path)
    cfg = config(tmp_path, "", devices="")  # every port judged: mlx5_0..mlx5_3
    assert {dict(k[1])["hca"] for k in series(tmp_path, cfg)} == {f"mlx5_{i}" for i in range(4)}
    got = series(tmp_path, cfg, gpus=range(2, 4))  # GPUs 2 and 3: mlx5_1's switch
    assert {dict(k[1])["hca"] for k in got} == {"mlx5_1"} and len(got) == 5


def test_which_jobs_export_their_ports() -> None:
    from slurmhealth.sidecar.rdma import exports_rdma

    assert exports_rdma("multi_node", "n[1-2]") and exports_rdma("multi_node", "n1,n7")
    assert not exports_rdma("multi_node", "n1") and not exports_rdma("multi_node", "")
    assert not exports_rdma("multi_node", "n[1-")  # unreadable: no series, never an error
    assert exports_rdma("all", "n1") and not exports_rdma("none", "n[1-2]")
