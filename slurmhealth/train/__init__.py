"""Training-side integrations that measure what :func:`slurmhealth.job.step` reports.

- :mod:`slurmhealth.train.timing`: the per-step accumulator and the data-loader wrapper
  (standard library only).
- :mod:`slurmhealth.train.torch_comm`: a DDP communication hook and ``torch.distributed``
  collective timing (needs PyTorch, imported only there).
- :mod:`slurmhealth.train.hf` and :mod:`slurmhealth.train.lightning`: one-line callbacks for
  Hugging Face ``Trainer`` and Lightning (each imports its framework, and only it).

Importing this package imports none of those frameworks.
"""
