"""``run_sweep`` end to end over a fake Slurm that runs the jobs on a simulated fabric:
real job output files, real parsers, the real history, the real drain and breaker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slurmhealth.cli.app import main
from slurmhealth.config import Config, load_config
from slurmhealth.errors import UsageError
from slurmhealth.history.read import Reader, baseline_rows, drain_rows
from slurmhealth.history.sweeps import sweep_list, sweep_record
from slurmhealth.slurm import NodeInfo
from slurmhealth.sweep.run import Settings, run_sweep
from slurmhealth.sweep.submit import Waiter
from tests.support.sweep_fabric import Fabric, FakeBatchSlurm

THREE = ["n1", "n2", "n3"]


def _cfg(tmp_path: Path, **flags: Any) -> Config:
    (tmp_path / "config.toml").write_text("")
    base = {"node.name": "login1", "paths.db": str(tmp_path / "db" / "{node}.db"),
            "paths.evidence_dir": str(tmp_path / "evidence"),
            "paths.run_dir": str(tmp_path / "run")}  # fmt: skip
    return load_config(str(tmp_path / "config.toml"), env={}, flags={**base, **flags})


class Clock:
    """Simulated time: each poll's sleep moves it on."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def _run(
    cfg: Config, slurm: FakeBatchSlurm, nodes: list[str], **kw: Any
) -> tuple[dict[str, Any], Clock]:
    clock = Clock()
    settings = Settings(nodes=tuple(nodes), template="/x/sweep.sbatch",
                        output_dir=str(Path(cfg.paths.evidence_dir) / "sweeps"),
                        gpus_per_node=1, time_min=2, **kw)  # fmt: skip
    waiter = Waiter(poll_s=2.0, max_pending_s=60.0, clock=clock, sleep=clock.sleep)
    return run_sweep(cfg, settings, slurm, waiter, clock=clock), clock


def _fabric(nodes: list[str], **faults: Any) -> Fabric:
    f = Fabric(nodes, noise=0.0, glitch=0.0, node_spread=0.0)
    for key, value in faults.items():
        getattr(f, key).update(value)
    return f


def test_a_node_fault_is_named_stored_and_shown(tmp_path: Path, capsys: Any) -> None:
    cfg = _cfg(tmp_path)
    slurm = FakeBatchSlurm(_fabric(THREE, node_fault={"n2": 0.5}))
    record, _ = _run(cfg, slurm, THREE)
    assert [(s["kind"], s["nodes"]) for s in record["suspects"]] == [("node", ["n2"])]
    assert not slurm.drains  # not asked to
    outdir = Path(record["output_dir"])
    assert len(list(outdir.glob("*.out"))) == record["jobs"] == len(slurm.submitted)
    assert all(j.nodes in {("n1",), ("n2",), ("n3",), ("n1", "n2"), ("n1", "n3"), ("n2", "n3")}
               for j in slurm.submitted)  # fmt: skip
    with Reader(cfg.db_path()) as db:
        assert sweep_list(db)[0][0] == record["id"]
        stored = sweep_record(db, record["id"])
        rows = baseline_rows(db, kind="nccl")
    assert stored is not None and stored["suspects"] == record["suspects"]
    assert {r["node"] for r in rows} == {"n1", "n2", "n3", "n1,n2", "n1,n3", "n2,n3"}
    assert {r["label"] for r in rows} == {f"sweep:{record['id']}"}
    slow = [r["value"] for r in rows if r["node"] == "n1,n2"]
    assert slow and all(v == pytest.approx(185.9, abs=0.1) for v in slow)

    db_flag = ["--db", cfg.db_path()]
    main([*db_flag, "sweep", "show", record["id"], "--json"])  # returns: exit 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["suspects"][0]["nodes"] == ["n2"]
    main([*db_flag, "sweep", "show", record["id"]])
    text = capsys.readouterr().out
    assert "NODE n2 (confidence 67%): n2: slow with 2 of 2 partners" in text
    assert "n1-n2" in text and "185.9" in text  # the pair table
    main([*db_flag, "sweep", "show"])
    assert record["id"] in capsys.readouterr().out
    html = tmp_path / "sweep.html"
    main([*db_flag, "sweep", "show", record["id"], "--html", str(html)])
    page = html.read_text()
    assert 'id="matrix-nccl"' in page and "NODE n2" in page
    assert page.count('class="h-slow"') == 4  # n1-n2 and n2-n3, both halves of the matrix


def test_jobs_in_flight_stay_under_max_jobs(tmp_path: Path) -> None:
    nodes = [f"n{i}" for i in range(10)]
    slurm = FakeBatchSlurm(_fabric(nodes), polls=3)
    record, _ = _run(_cfg(tmp_path), slurm, nodes, max_jobs=3)
    assert slurm.most_at_once == 3
    assert record["suspects"] == [] and record["jobs"] == 10 + 5 * 5


def test_a_job_stuck_in_the_queue_is_cancelled_at_its_deadline(tmp_path: Path) -> None:
    slurm = FakeBatchSlurm(_fabric(THREE), hang=[("n1", "n3")])
    record, clock = _run(_cfg(tmp_path), slurm, THREE)
    stuck = [r for r in record["results"] if r["nodes"] == ["n1", "n3"]]
    assert stuck and all("cancelled" in r["error"] for r in stuck)
    assert len(slurm.cancelled) == len(stuck)
    assert clock.now - 1000.0 >= len(stuck) * (2 * 60 + 60)  # time limit + max pending each
    assert [(s["kind"], s["nodes"]) for s in record["suspects"]] == [("link", ["n1", "n3"])]


def test_drain_suspects_drains_the_node_through_the_breaker(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, **{"policy.drain_max_share": 0.5})
    nodes = ["n1", "n2", "n3", "n4"]
    slurm = FakeBatchSlurm(_fabric(nodes, node_fault={"n2": 0.5}, link_fault={("n1", "n4"): 0.5}))
    record, _ = _run(cfg, slurm, nodes, drain=True)
    kinds = {(s["kind"], tuple(s["nodes"])) for s in record["suspects"]}
    assert kinds == {("node", ("n2",)), ("link", ("n1", "n4"))}
    assert [n for n, _ in slurm.drains] == ["n2"]  # a link is never drained
    reason = slurm.drains[0][1]
    assert reason.startswith("slurmhealth: sweep: node n2: slow with")
    assert slurm.table["n2"].drained
    with Reader(cfg.db_path("n2")) as db:
        (row,) = drain_rows(db, node="n2")
    assert row["state"] == "drained" and row["detail"]["sweep"] == record["id"]


def test_the_breaker_holds_a_sweep_drain(tmp_path: Path) -> None:
    """One node of four already drained by slurmhealth, at most a quarter may be: the sweep
    names n2 but its drain is suppressed, and says so."""
    cfg = _cfg(tmp_path, **{"policy.drain_max_share": 0.25})
    nodes = ["n1", "n2", "n3", "n4"]
    slurm = FakeBatchSlurm(_fabric(nodes, node_fault={"n2": 0.5}))
    slurm.table["n4"] = NodeInfo("n4", "drained", "slurmhealth: xid gpu1 Xid 79", "root", 1.0)
    record, _ = _run(cfg, slurm, nodes, drain=True)
    assert record["skipped"] == {"n4": "drained: slurmhealth: xid gpu1 Xid 79"}
    assert [s["nodes"] for s in record["suspects"]] == [["n2"]]
    (drain,) = record["drains"]
    assert drain["state"] == "suppressed" and "circuit breaker" in drain["detail"]
    assert not slurm.drains and not slurm.table["n2"].drained


def test_when_every_job_is_refused_nobody_is_named_or_drained(tmp_path: Path) -> None:
    keys = [("n1",), ("n2",), ("n3",), ("n1", "n2"), ("n1", "n3"), ("n2", "n3")]
    slurm = FakeBatchSlurm(_fabric(THREE), refuse=keys)
    record, _ = _run(_cfg(tmp_path), slurm, THREE, drain=True)
    assert record["suspects"] == [] and record["drains"] == []
    assert "measured nothing" in record["inconclusive"]
    assert "Invalid node name" in record["results"][0]["error"]


def test_unknown_nodes_are_a_usage_error_drained_ones_are_skipped(tmp_path: Path) -> None:
    slurm = FakeBatchSlurm(_fabric(THREE))
    with pytest.raises(UsageError, match="not nodes of this cluster: n9"):
        _run(_cfg(tmp_path), slurm, ["n1", "n9"])
    slurm.table["n3"] = NodeInfo("n3", "drained", "bad PSU", "alice", 1.0)
    record, _ = _run(_cfg(tmp_path), slurm, THREE)
    assert record["nodes"] == ["n1", "n2"] and "bad PSU" in record["skipped"]["n3"]
    assert all("n3" not in j.nodes for j in slurm.submitted)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["sweep"], "--nodes HOSTLIST is required"),
        (["sweep", "--nodes", "n[1-3]", "--test", "both", "--command", "/x/a"], "name the test"),
        (["sweep", "--nodes", "n[1-3]", "--command", "mpi=/x"], "expected PATH, nccl=PATH"),
        (["sweep", "--nodes", "n[1-3]", "--job-env", "PATH=/evil"], "SWEEP_NAME=VALUE"),
        (["sweep", "--nodes", "n[1-3", "--template", "/dev/null"], "unbalanced"),
        (["sweep", "show", "nope"], "no history at"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: Any, argv: list[str], said: str
) -> None:
    cfg = _cfg(tmp_path)
    with pytest.raises(SystemExit) as done:
        main(["--config", str(tmp_path / "config.toml"), "--db", cfg.db_path(), *argv])
    err = capsys.readouterr().err
    assert done.value.code == 2 and said in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_node_suspect_carries_what_its_own_history_saw(tmp_path: Path) -> None:
    from slurmhealth.history import History
    from slurmhealth.history.batch import Batch

    cfg = _cfg(tmp_path)
    finding = {"run_id": "r1", "ts": 1_000.0 - 3600, "node": "n2", "check_name": "ib_errors",
               "severity": "fail", "severity_value": 30, "gpu": None,
               "message": "mlx5_1/1 symbol_error 40/min over 600 s (GPUs 2,3 behind it)",
               "action": "drain", "evidence": {"hca": "mlx5_1", "port": 1}}  # fmt: skip
    old = {**finding, "ts": 1_000.0 - 30 * 86400, "message": "a month ago"}
    info = {**finding, "severity": "info", "severity_value": 10, "message": "fine"}
    with History.for_node(cfg, "n2") as h:
        h.write(Batch(inserts=[("findings", finding), ("findings", old), ("findings", info)]))
    slurm = FakeBatchSlurm(_fabric(THREE, node_fault={"n2": 0.5}))
    record, _ = _run(cfg, slurm, THREE)
    (suspect,) = record["suspects"]
    (seen,) = suspect["evidence"]["history"]
    assert seen["node"] == "n2" and seen["check_name"] == "ib_errors"
    assert seen["evidence"]["hca"] == "mlx5_1"
