"""Hugging Face ``Trainer``: report each optimizer step to slurmhealth in one line.

    from slurmhealth.train.hf import SlurmhealthCallback
    trainer = Trainer(..., callbacks=[SlurmhealthCallback(tokens_per_sample=2048)])

Per step (``on_step_end``, once per optimizer step of this rank): samples =
``per_device_train_batch_size x gradient_accumulation_steps``; tokens from the Trainer's own
count (``include_num_input_tokens_seen=True``: its growth since the last step, divided by the
world size, as the count is summed over ranks), else ``samples x tokens_per_sample`` when
given; FLOPs from ``flops_per_token``. The step number is the Trainer's ``global_step``, so a
run resumed from a checkpoint continues its count. Pass a
:class:`~slurmhealth.train.timing.StepTimer` to add measured communication and data wait
(e.g. FSDP under :func:`slurmhealth.train.torch_comm.time_collectives`).

Imports ``transformers`` (and only this module does).
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from slurmhealth.train.timing import StepTimer, timer_for, tokens_from


class SlurmhealthCallback(TrainerCallback):
    def __init__(
        self,
        tokens_per_sample: int | None = None,
        flops_per_token: float | None = None,
        timer: StepTimer | None = None,
    ) -> None:
        self.tokens_per_sample = tokens_per_sample
        self.timer = timer_for(timer, flops_per_token)
        self._tokens_seen: int | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._tokens_seen = _int(getattr(state, "num_input_tokens_seen", None))
        self.timer.take()  # what came before training is not a step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        samples = _int(getattr(args, "per_device_train_batch_size", None))
        accumulation = _int(getattr(args, "gradient_accumulation_steps", None)) or 1
        if samples is not None:
            samples *= accumulation
        tokens = self._tokens(args, state)
        tokens = tokens_from(tokens, samples, self.tokens_per_sample)
        step = _int(getattr(state, "global_step", None))
        self.timer.step(samples=samples, tokens=tokens, step=step)

    def _tokens(self, args: Any, state: Any) -> int | None:
        seen = _int(getattr(state, "num_input_tokens_seen", None))
        before, self._tokens_seen = self._tokens_seen, seen
        if not seen or before is None or seen <= before:
            return None
        world = _int(getattr(args, "world_size", None)) or 1
        return (seen - before) // world


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None
