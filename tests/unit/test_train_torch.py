"""The PyTorch timing with real PyTorch (CPU, gloo): the DDP hook, the collective patch, and
a 2-process DDP run of sbatch-templates/train_ddp.py. Skipped where PyTorch is absent
(`pip install -e '.[train]'`)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.skips import require_module

torch = require_module("torch", "PyTorch not installed (pip install '.[train]')")
dist = require_module("torch.distributed", "this PyTorch build has no torch.distributed")

from slurmhealth.checks.rank_straggler import rank_stragglers  # noqa: E402
from slurmhealth.sidecar.task import StepRecord, parse_line  # noqa: E402
from slurmhealth.train.timing import StepTimer  # noqa: E402
from slurmhealth.train.torch_comm import (  # noqa: E402
    register_ddp_hook,
    time_collectives,
    timed_hook,
)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "sbatch-templates" / "train_ddp.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def world_of_one() -> Iterator[None]:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def recording() -> tuple[StepTimer, list[dict[str, Any]]]:
    calls: list[dict[str, Any]] = []
    return StepTimer(report=lambda **k: calls.append(k)), calls


def train(model: Any, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.ones(4, 8)).sum().backward()
        opt.step()


def test_the_timed_hook_changes_nothing_but_is_timed(world_of_one: None) -> None:
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    plain = DistributedDataParallel(torch.nn.Linear(8, 3))
    torch.manual_seed(0)
    hooked = DistributedDataParallel(torch.nn.Linear(8, 3))
    timer, calls = recording()
    register_ddp_hook(hooked, timer)
    train(plain, 3)
    train(hooked, 3)
    for a, b in zip(plain.parameters(), hooked.parameters(), strict=True):
        assert torch.equal(a, b)
    timer.step(samples=4)
    assert calls[0]["comm_seconds"] > 0


def test_a_slow_inner_hook_shows_in_comm_seconds(world_of_one: None) -> None:
    import time

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    def slow(state: Any, bucket: Any) -> Any:
        time.sleep(0.05)
        return default_hooks.allreduce_hook(state, bucket)

    slow.__annotations__ = {}
    model = DistributedDataParallel(torch.nn.Linear(8, 3))
    timer, calls = recording()
    model.register_comm_hook(None, timed_hook(timer, slow))
    train(model, 1)
    timer.step()
    assert calls[0]["comm_seconds"] >= 0.05


def test_collectives_are_timed_inside_the_block_only(world_of_one: None) -> None:
    timer, calls = recording()
    original = dist.all_reduce
    with time_collectives(timer):
        t = torch.ones(1000)
        dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()
        dist.barrier()
    assert dist.all_reduce is original
    dist.all_reduce(torch.ones(3))  # outside: not timed
    timer.step()
    assert calls[0]["comm_seconds"] > 0
    assert timer.take() == (0.0, 0.0)


def run_ddp(tmp_path: Path, *extra: str, steps: int = 16) -> dict[int, list[StepRecord]]:
    """train_ddp.py as 2 gloo ranks on this machine; each rank's step records."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    port, procs = free_port(), []
    for rank in (0, 1):
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            SLURMHEALTH_JOB_DIR=str(tmp_path),
            PYTHONPATH=str(ROOT),
        )
        cmd = [
            sys.executable,
            str(SCRIPT),
            "--steps",
            str(steps),
            "--dim",
            "32",
            "--seq",
            "16",
            "--vocab",
            "100",
            *extra,
        ]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    for p in procs:
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0, out
    out_recs: dict[int, list[StepRecord]] = {}
    for rank in (0, 1):
        lines = (tmp_path / f"steps-{rank}.jsonl").read_text().splitlines()
        out_recs[rank] = [r for line in lines if (r := parse_line(line)) is not None]
        assert len(out_recs[rank]) == steps
    return out_recs


def comm_share(records: list[StepRecord]) -> float:
    timed = [r for r in records[1:] if r.step_seconds and r.comm_seconds is not None]
    return sum(r.comm_seconds or 0 for r in timed) / sum(r.step_seconds or 0 for r in timed)


def test_two_rank_ddp_measures_comm_and_names_the_slow_rank(tmp_path: Path) -> None:
    """Rank 1 computes 50 ms longer per step: rank 0 waits for it in the all-reduce (its
    measured communication share is large), and rank 1 is the task-level straggler."""
    recs = run_ddp(tmp_path, "--slow-rank", "1", "--slow-seconds", "0.05")
    assert 0 < comm_share(recs[1]) < comm_share(recs[0]) < 1
    assert all(r.flops and r.tokens == 8 * 16 for r in recs[0])
    assert [s.rank for s in rank_stragglers(recs)] == [1]


def test_a_delayed_all_reduce_shows_on_both_ranks(tmp_path: Path) -> None:
    """Rank 1's all-reduce starts 80 ms late (a slow link): rank 1's measured communication
    holds the delay, and rank 0's too, as it waits for rank 1 in the all-reduce."""
    slow = run_ddp(tmp_path, "--comm-delay-rank", "1", "--comm-delay", "0.08", steps=6)
    for rank in (0, 1):
        comm = sorted(r.comm_seconds or 0 for r in slow[rank][1:])
        assert comm[len(comm) // 2] >= 0.075, (rank, comm)
        assert 0.3 < comm_share(slow[rank]) < 1


def test_lightning_hooks_a_ddp_model_once(
    world_of_one: None, capsys: pytest.CaptureFixture[str]
) -> None:
    require_module("lightning", "lightning not installed")
    from torch.nn.parallel import DistributedDataParallel

    from slurmhealth.train.lightning import _hook_ddp

    model = DistributedDataParallel(torch.nn.Linear(8, 3))
    timer, calls = recording()
    assert _hook_ddp(torch.nn.Linear(8, 3), timer) is False  # not DDP: left alone
    assert _hook_ddp(model, timer) is True
    train(model, 1)
    timer.step()
    assert calls[0]["comm_seconds"] > 0
    second = StepTimer(report=lambda **k: None)
    assert _hook_ddp(model, second) is False  # DDP takes one hook: the first one stays
    assert "cannot register the DDP hook" in capsys.readouterr().err
