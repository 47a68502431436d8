"""The pairwise sweep: tests run as ordinary Slurm jobs (each node alone, then pairs in
rounds of perfect matchings) and a verdict that names the bad node, link or NVLink/GPU.

``plan``, ``model``, ``verdict`` and ``render`` are pure; ``submit`` talks to Slurm and the
output files; ``run`` decides what runs when (docs/sweep.md).
"""
