"""What slurmhealth's measuring costs a DDP training step (the timed all-reduce hook, the
timed data loader and the timer's report) against the same step with plain ``job.step()``.

Usage: python benchmarks/train_hook_overhead.py [--ranks 2] [--rounds 30] [--block 5]
       [--dim 128 --seq 64 --batch 8]   (needs PyTorch; CPU and gloo, or NCCL on GPUs)

Each rank builds the example's model (sbatch-templates/train_ddp.py) twice with the same
weights, one DDP copy plain and one with the hook, and alternates blocks of ``--block``
steps between them for ``--rounds`` rounds, so both see the same machine load; every step
is timed. Reported by rank 0: the median step time of each, and the overhead (difference
of the medians, in % of the plain step); ``--micro`` reports the measuring's own CPU cost
per collective, per ``next()`` and per step instead. Not part of the test run.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from slurmhealth import job
from slurmhealth.train.timing import StepTimer
from slurmhealth.train.torch_comm import register_ddp_hook

REPO = Path(__file__).resolve().parent.parent


def _example() -> Any:
    spec = importlib.util.spec_from_file_location(
        "train_ddp", REPO / "sbatch-templates" / "train_ddp.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _steps(ddp: Any, batches: Any, timer: StepTimer | None, args: Any) -> list[float]:
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    loss_fn = torch.nn.CrossEntropyLoss()
    out = []
    source = timer.data(batches) if timer is not None else batches
    start = time.perf_counter()
    for batch in source:
        logits = ddp(batch[:, :-1])
        loss = loss_fn(logits.reshape(-1, args.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        tokens = batch[:, :-1].numel()
        if timer is not None:
            timer.step(samples=len(batch), tokens=tokens)
        else:
            job.step(samples=len(batch), tokens=tokens)
        now = time.perf_counter()
        out.append(now - start)
        start = now
    return out


def _rank(rank: int, args: argparse.Namespace, port: int, job_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank))
    os.environ["SLURMHEALTH_JOB_DIR"] = job_dir
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    example = _example()
    models = []
    for _ in range(3):
        torch.manual_seed(0)
        models.append(DistributedDataParallel(example.TinyLM(args.vocab, args.dim, 2)))
    # the same all-reduce as a Python hook without timing: what any comm hook costs
    models[1].register_comm_hook(None, default_hooks.allreduce_hook)
    timer = StepTimer()
    register_ddp_hook(models[2], timer)
    data = torch.randint(0, args.vocab, (args.block, args.batch, args.seq + 1))
    variants = [
        ("plain", models[0], None),
        ("python hook", models[1], None),
        ("measured", models[2], timer),
    ]
    times: dict[str, list[float]] = {name: [] for name, _, _ in variants}
    for round_ in range(args.rounds + 1):
        shift = round_ % len(variants)  # rotate the order: no variant always runs first
        for name, model, tm in variants[shift:] + variants[:shift]:
            got = _steps(model, list(data), tm, args)
            if round_:  # the first round warms up
                times[name] += got[1:]  # a block's first step includes the switch
    if rank == 0:
        plain = statistics.median(times["plain"])
        print(f"ranks {args.ranks}, {len(times['plain'])} steps each, dim {args.dim}")
        for name, _, _ in variants:
            med = statistics.median(times[name])
            print(f"{name:12} {med * 1000:8.2f} ms/step (median) {(med - plain) / plain:+7.2%}")
    job.close()
    dist.destroy_process_group()


def _per_call_us(fn: Any, n: int = 20000, repeats: int = 7) -> float:
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - start) / n * 1e6)
    return statistics.median(runs)


def micro() -> None:
    """The measuring's own CPU cost in microseconds, free of the machine's noise: per
    collective (the interval and the chained future), per ``next()``, per ``timer.step``."""
    from slurmhealth.train.torch_comm import _Interval, _timed_future

    t = torch.ones(10)
    timer = StepTimer(report=lambda **k: None)

    def plain() -> None:
        f = torch.futures.Future()
        chained = f.then(lambda x: x.value())
        f.set_result(t)
        chained.wait()

    def timed() -> None:
        f = torch.futures.Future()
        chained = _timed_future(timer, f, _Interval(timer, False))
        f.set_result(t)
        chained.wait()

    def step() -> None:
        timer.add_comm(1.0, 1.5)
        timer.step(samples=8, tokens=512)

    items = list(range(1000))
    a, b = _per_call_us(plain), _per_call_us(timed)
    print(f"per collective: {a:.2f} us plain future, {b:.2f} us timed ({b - a:+.2f} us)")
    a = _per_call_us(lambda: [None for _ in iter(items)], n=200) / len(items)
    b = _per_call_us(lambda: [None for _ in timer.data(items)], n=200) / len(items)
    print(f"per next(): {b - a:+.3f} us")
    print(f"per timer.step (report not counted): {_per_call_us(step):.2f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--block", type=int, default=5)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--micro", action="store_true", help="only the per-call costs")
    args = ap.parse_args()
    if args.micro:
        micro()
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as job_dir:
        mp.spawn(_rank, args=(args, port, job_dir), nprocs=args.ranks)


if __name__ == "__main__":
    main()
