"""Lightning: report each training batch to slurmhealth in one line.

    from slurmhealth.train.lightning import SlurmhealthCallback
    trainer = L.Trainer(..., callbacks=[SlurmhealthCallback(tokens_per_sample=2048)])

Per batch (``on_train_batch_end``): samples from the batch (a tensor's first dimension, the
first element of a tuple, ``input_ids`` of a dict), tokens from ``input_ids`` when the
batch has them, else ``samples x tokens_per_sample``; FLOPs from ``flops_per_token``. Under
the DDP strategy the callback registers slurmhealth's timed all-reduce as the model's
communication hook when training starts (``measure_comm=False`` to leave the model alone; a
model that already has a hook keeps it), so the communication share is measured.

Imports ``lightning`` (and only this module does); PyTorch only when the hook is registered.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback

from slurmhealth.train.timing import StepTimer, batch_size_of, timer_for, tokens_from, tokens_of


class SlurmhealthCallback(Callback):
    def __init__(
        self,
        tokens_per_sample: int | None = None,
        flops_per_token: float | None = None,
        timer: StepTimer | None = None,
        measure_comm: bool = True,
    ) -> None:
        self.tokens_per_sample = tokens_per_sample
        self.timer = timer_for(timer, flops_per_token)
        self.measure_comm = measure_comm
        self.hooked = False

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.measure_comm:
            self.hooked = _hook_ddp(getattr(trainer.strategy, "model", None), self.timer)
        self.timer.take()  # what came before training is not a step

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        samples = batch_size_of(batch)
        tokens = tokens_of(batch)
        tokens = tokens_from(tokens, samples, self.tokens_per_sample)
        self.timer.step(samples=samples, tokens=tokens)


def _hook_ddp(model: Any, timer: StepTimer) -> bool:
    """Register the timed all-reduce on a DDP-wrapped model; False when the model is not
    DDP or already has a hook (DDP allows one)."""
    try:
        from torch.nn.parallel import DistributedDataParallel

        from slurmhealth.train.torch_comm import register_ddp_hook

        if not isinstance(model, DistributedDataParallel):
            return False
        register_ddp_hook(model, timer)
        return True
    except Exception as exc:  # a hook set by the user or the strategy's ddp_comm_hook
        timer.disable(f"cannot register the DDP hook ({exc}); reporting steps only")
        return False
