"""A small PyTorch DDP training job whose steps slurmhealth measures by itself.

A 2-layer transformer language model on random tokens, one process per rank. Rank and
rendezvous come from torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT) or, under `srun`, from Slurm's (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID;
train-ddp.sbatch sets MASTER_ADDR/PORT). NCCL on GPUs, gloo on CPUs.

Communication time comes from a DDP communication hook around the default all-reduce, data
wait from timing the data loader's next(): nothing is declared by hand. Faults for tests:
--slow-rank R --slow-seconds S makes rank R compute S seconds longer per step (a slow GPU:
the other ranks wait for it in the all-reduce); --comm-delay-rank R --comm-delay S delays
rank R's all-reduce by S seconds (a slow link: every rank waits longer in communication).
--no-hook trains without the hook (to measure its cost). Rank 0 prints the loop's time.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from slurmhealth import job
from slurmhealth.train.timing import StepTimer
from slurmhealth.train.torch_comm import register_ddp_hook


def setup() -> tuple[int, int, torch.device]:
    env = os.environ
    rank = int(env.get("RANK", env.get("SLURM_PROCID", "0")))
    world = int(env.get("WORLD_SIZE", env.get("SLURM_NTASKS", "1")))
    local = int(env.get("LOCAL_RANK", env.get("SLURM_LOCALID", "0")))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    os.environ["RANK"] = str(rank)  # slurmhealth.job names its file after RANK
    if torch.cuda.is_available():
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", rank=rank, world_size=world)
        return rank, world, torch.device("cuda", local)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return rank, world, torch.device("cpu")


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        layer = nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.body(self.embed(tokens)))
        return out


def delayed_allreduce(seconds: float) -> Any:
    def hook(state: Any, bucket: Any) -> Any:
        time.sleep(seconds)
        return default_hooks.allreduce_hook(state, bucket)

    return hook


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--no-hook", action="store_true")
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-seconds", type=float, default=0.0)
    ap.add_argument("--comm-delay-rank", type=int, default=-1)
    ap.add_argument("--comm-delay", type=float, default=0.0)
    args = ap.parse_args()
    rank, world, device = setup()
    torch.manual_seed(0)
    model = TinyLM(args.vocab, args.dim, args.layers).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.index is not None else None
    )
    timer = StepTimer(flops_per_token=6 * n_params)
    if not args.no_hook:
        inner = default_hooks.allreduce_hook
        if rank == args.comm_delay_rank and args.comm_delay > 0:
            inner = delayed_allreduce(args.comm_delay)
        register_ddp_hook(ddp, timer, inner=inner)
    data = torch.randint(0, args.vocab, (args.batch * world * args.steps, args.seq + 1))
    sampler = DistributedSampler(TensorDataset(data), num_replicas=world, rank=rank)
    loader = DataLoader(TensorDataset(data), batch_size=args.batch, sampler=sampler)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    dist.barrier()
    start = time.perf_counter()
    for (batch,) in timer.data(loader) if not args.no_hook else loader:
        batch = batch.to(device, non_blocking=True)
        if rank == args.slow_rank:
            time.sleep(args.slow_seconds)
        logits = ddp(batch[:, :-1])
        loss = loss_fn(logits.reshape(-1, args.vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if args.no_hook:
            job.step(samples=len(batch), tokens=batch[:, :-1].numel())
        else:
            timer.step(samples=len(batch), tokens=batch[:, :-1].numel())
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if rank == 0:
        print(
            f"train_ddp: {args.steps} steps in {elapsed:.3f} s ({elapsed / args.steps:.4f} s/step)"
        )
    job.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
