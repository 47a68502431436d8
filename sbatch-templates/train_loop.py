"""A small stand-in training loop that reports every step to slurmhealth.

Runs anywhere (no GPU, no framework): each step "computes" for --step-seconds, spends a
tenth of it in a pretend all-reduce and a twentieth waiting for data, and reports samples,
tokens and FLOPs with `slurmhealth.job.step()`. With PyTorch and a GPU available and --torch,
the compute is a real bf16 matmul instead. --slow-after N makes steps twice as slow after
step N (a throughput drop the sidecar must notice); --stall-after N stops reporting.
"""

from __future__ import annotations

import argparse
import time

from slurmhealth import job

BATCH, SEQ = 32, 2048
FLOPS_PER_TOKEN = 6 * 1.3e9  # a 1.3B-parameter model: ~6 N FLOPs per token (fwd + bwd)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--step-seconds", type=float, default=0.1)
    ap.add_argument("--slow-after", type=int, default=0)
    ap.add_argument("--stall-after", type=int, default=0)
    ap.add_argument("--torch", action="store_true")
    args = ap.parse_args()
    matmul = None
    if args.torch:
        import torch

        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

        def matmul() -> None:
            (a @ a).sum().item()

    for step in range(1, args.steps + 1):
        if args.stall_after and step > args.stall_after:
            time.sleep(3600)  # a hung collective: no more steps
        compute = args.step_seconds * (2 if args.slow_after and step > args.slow_after else 1)
        if matmul is not None:
            matmul()
        else:
            time.sleep(compute * 0.85)
        time.sleep(compute * 0.10)  # all-reduce
        time.sleep(compute * 0.05)  # data loader
        tokens = BATCH * SEQ
        job.step(
            samples=BATCH,
            tokens=tokens,
            flops=tokens * FLOPS_PER_TOKEN,
            comm_seconds=compute * 0.10,
            data_wait_seconds=compute * 0.05,
        )
    job.close()


if __name__ == "__main__":
    main()
