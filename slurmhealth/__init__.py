"""slurmhealth: Slurm GPU clusters that diagnose themselves."""

__version__ = "0.1.0"
