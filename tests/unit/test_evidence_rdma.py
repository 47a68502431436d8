"""The epilog's evidence bundle on a node with RDMA devices: every port's sysfs state and
counters always, ``ibstat`` (and ``ibv_devinfo``, ``rdma link``) output where installed,
each bounded like the other sources; nothing of it on a node without RDMA devices."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from slurmhealth.config import Config, load_config
from slurmhealth.evidence.capture import capture
from slurmhealth.rdma import simtree
from tests.unit import test_evidence as base
from tests.unit.test_evidence import JOB, NODE, UID, _script

make_cfg = base.make_cfg  # the evidence tests' fixture: a simulated node n1

IBSTAT = "CA 'mlx5_1'\n\tCA type: MT4129\n\tPort 1:\n\t\tState: Active\n\t\tRate: 400\n"


def with_rdma(cfg: Config, tmp_path: Path, **evidence: object) -> Config:
    root = tmp_path / "sys"
    spec = simtree.fault(simtree.preset("ndr4"), "counter", "mlx5_1", counter="symbol_error",
                         per_s=10)  # fmt: skip
    simtree.write_tree(str(root), spec, 30.0)
    path = tmp_path / "config.toml"
    extra = "".join(f"{k} = {v}\n" for k, v in evidence.items())
    path.write_text(path.read_text() + "\n" + extra + f'[rdma]\nsysfs_root = "{root}"\n')
    return load_config(str(path), env={})


def run(cfg: Config) -> tuple[Path, dict[str, dict[str, object]], dict[str, str]]:
    result = capture(cfg, JOB, NODE, reason="job failed", gpus=[4, 5], user="alice", uid=UID,
                     budget_s=10)  # fmt: skip
    return Path(result.dir), {str(f["name"]): dict(f) for f in result.files}, dict(result.skipped)


def test_the_bundle_holds_every_ports_counters_and_ibstat(
    make_cfg: Callable[..., Config], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "rdma-bin"
    bin_dir.mkdir()
    _script(bin_dir / "ibstat", "\n".join(f'echo "{line}"' for line in IBSTAT.splitlines()))
    monkeypatch.setenv("PATH", str(bin_dir))  # ibv_devinfo and rdma: not installed
    bundle, files, skipped = run(with_rdma(make_cfg(), tmp_path))
    assert {"rdma-sysfs.json", "ibstat.txt"} <= set(files)
    rdma_skipped = {k: v for k, v in skipped.items() if k in ("ibstat", "ibv_devinfo", "rdma-link")}
    assert rdma_skipped == {"ibv_devinfo": "ibv_devinfo not found", "rdma-link": "rdma not found"}
    sysfs = json.loads((bundle / "rdma-sysfs.json").read_text())
    ports = {p["hca"]: p for h in sysfs["hcas"] for p in h["ports"]}
    assert sorted(ports) == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert ports["mlx5_1"]["counters"]["symbol_error"] == 300
    assert ports["mlx5_1"]["state_name"] == "ACTIVE" and ports["mlx5_1"]["hw_counters"]
    assert (bundle / "ibstat.txt").read_text().startswith("CA 'mlx5_1'")


def test_a_huge_counter_dump_is_cut_at_the_sources_cap(
    make_cfg: Callable[..., Config], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    _, files, _ = run(with_rdma(make_cfg(source_max_bytes=2048), tmp_path))
    assert files["rdma-sysfs.json"]["size"] == 2048
    assert "cut" in str(files["rdma-sysfs.json"]["error"])


def test_no_rdma_devices_no_rdma_evidence(make_cfg: Callable[..., Config]) -> None:
    _, files, skipped = run(make_cfg())
    assert not any("rdma" in n or "ibstat" in n for n in files)
    assert not any("rdma" in s or "ib" in s for s in skipped)
