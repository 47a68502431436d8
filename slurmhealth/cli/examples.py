"""An example or two for each command's ``--help``, kept in one table so the command
modules stay as they are; ``app`` adds them as the command's epilog when it loads. An option
whose default is a config key it names (``evidence.budget_s``) shows that key's default.

Key: the command path under ``slurmhealth`` (``history prune``). Each line stays under 80
columns (click prints an epilog paragraph that starts with ``\\b`` as it is).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import click

EXAMPLES: Mapping[str, tuple[str, ...]] = {
    "check": (
        "slurmhealth check                  # every check on every GPU, recorded",
        "slurmhealth check --gpus 0,3 --json",
    ),
    "checks": ("slurmhealth checks                 # names, thresholds, actions",),
    "history": (
        "slurmhealth history --node n2 --since 2h",
        "slurmhealth history --job 1234    # your own job's runs",
    ),
    "history prune": ("slurmhealth history prune --all --vacuum",),
    "drains": ("slurmhealth drains --node n2 --limit 5",),
    "nodes": ("slurmhealth nodes                  # Slurm state next to the last check",),
    "resume": ('slurmhealth resume n2 --reason "NVLink cable reseated"',),
    "prolog": ("Prolog=/usr/lib/slurmhealth/slurmhealth-prolog   # slurm.conf",),
    "epilog": ("Epilog=/usr/lib/slurmhealth/slurmhealth-epilog   # slurm.conf",),
    "sidecar": ("slurmhealth sidecar --job 1234 --interval 10   # started by the prolog",),
    "healthcheck": (
        "HealthCheckProgram=/usr/lib/slurmhealth/slurmhealth-healthcheck",
        "slurmhealth healthcheck --json",
    ),
    "ctld-epilog": ("EpilogSlurmctld=/usr/lib/slurmhealth/slurmhealth-ctld-epilog",),
    "report": (
        "slurmhealth report 1234",
        "slurmhealth report 1234 --window 10m --timeline",
        "slurmhealth report 1234 --html report.html",
    ),
    "baseline show": ("slurmhealth baseline show --node n2 --kind nccl",),
    "baseline ingest": ("slurmhealth baseline ingest gpuburn gpu_burn.log --node n2",),
    "baseline compare": ("slurmhealth baseline compare n2",),
    "baseline outliers": ("slurmhealth baseline outliers --fraction 0.9",),
    "baseline reference": ("slurmhealth baseline reference --json",),
    "validate": (
        "slurmhealth validate                # on the node, after a repair",
        "slurmhealth validate --benchmarks nccl",
    ),
    "evidence list": ("slurmhealth evidence list",),
    "evidence show": ("slurmhealth evidence show 1234 --node n2",),
    "evidence capture": ('slurmhealth evidence capture 1234 --reason "hang seen"',),
    "evidence prune": ("slurmhealth evidence prune --max-age-days 30 --dry-run",),
    "incident add": (
        'slurmhealth incident add 1234 --symptom "NCCL hang" \\',
        '    --root-cause "bad riser on n2 GPU 3" --fix "riser replaced"',
    ),
    "incident search": ("slurmhealth incident search riser nvlink",),
    "xid": ("slurmhealth xid 79                  # what Xid 79 means, what to do",),
    "exporter": (
        "slurmhealth exporter --port 9410",
        "slurmhealth exporter --once    # print the exposition once",
    ),
    "config show": ("slurmhealth config show           # every key, its value and source",),
    "config check": ("slurmhealth --config site.toml config check",),
    "install": ("slurmhealth install --dry-run     # what would go where",),
    "epilog-finish": ("slurmhealth epilog-finish           # finish after-work a crash left",),
    "sweep show": (
        "slurmhealth sweep show               # the sweeps stored on this node",
        "slurmhealth sweep show 20261202-1530 --html sweep.html",
    ),
}


def epilog(path: str) -> str | None:
    """The ``Examples:`` paragraph of the command ``path``, or None without one."""
    lines = EXAMPLES.get(path)
    if not lines:
        return None
    return (
        "\b\nExample"
        + ("s" if len(lines) > 1 else "")
        + ":\n"
        + "\n".join(f"  {line}" for line in lines)
    )


_KEY = re.compile(r"\b([a-z_]+)\.([a-z_]+)\b|\[([a-z_]+)\] ([a-z_]+)\b")  # a.b, [a] b


def config_defaults(command: click.Command) -> None:
    """``Default: 10.`` after the help of each option of ``command`` without a default of
    its own whose help names a config key (``evidence.budget_s``): that key's default."""
    defaults: Any = None
    for param in command.params:
        unset = param.default is None or repr(param.default) == "Sentinel.UNSET"
        if not isinstance(param, click.Option) or param.hidden or param.is_flag or not unset:
            continue
        if param.help is None or "Default: " in param.help:
            continue
        for match in _KEY.finditer(param.help):
            section, key = (match[1], match[2]) if match[1] else (match[3], match[4])
            if defaults is None:
                from slurmhealth.config import Config

                defaults = Config()
            value = getattr(getattr(defaults, section, None), key, None)
            if value is None or callable(value):
                continue
            shown = "none" if value == "" else f"{value:g}" if isinstance(value, float) else (
                str(value))  # fmt: skip
            if shown not in param.help:  # "(default [baseline] outlier_fraction, 0.8)"
                param.help += f" Default: {shown}."
            break
