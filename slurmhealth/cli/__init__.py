"""The ``slurmhealth`` command: argument parsing, exit codes and rendering only; the work is
done below (hooks/, report/, baseline/, evidence/, ...).

One module per command group, each loaded only when its command runs (see ``app.COMMANDS``):
``check`` (check, checks), ``hooks`` (prolog, epilog, sidecar), ``history`` (history,
drains), ``nodes`` (nodes, resume), ``config``, ``report``, ``baseline`` (baseline,
validate), ``evidence``, ``incident``, ``xid``, ``exporter``. Shared options live in
``options``, tables and JSON output in ``render``, each command's ``--help`` examples in
``examples``, the once-per-run warnings in ``once``. A new command is a module here plus one
line in ``app.COMMANDS`` (and its example in ``examples.EXAMPLES``).

``slurmhealth prolog`` and ``slurmhealth epilog`` (as Slurm runs them: no other argument)
ask the node agent first, importing the standard library only (slurmhealth.agent.client);
when it falls back to running in-process it loads the hook's modules only (no click).
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["cli", "main"]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args in (["prolog"], ["epilog"]):
        from slurmhealth.agent.client import hook_main

        hook_main(args[0])  # returns only when the hook runs in-process
        _hook_in_process(args[0])  # without click: the fallback is on the job's path too
    from slurmhealth.cli.app import main as app_main

    app_main(argv)


def _hook_in_process(name: str) -> None:
    """``slurmhealth prolog`` or ``epilog`` (no flags) in this process with the CLI's logging
    and one-line errors, without click (``app.main`` and ``app.cli`` do the same with it)."""
    import logging

    from slurmhealth.cli import failure, once

    before = list(logging.getLogger().handlers)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="slurmhealth: %(levelname)s: %(message)s")  # fmt: skip
    once.install_on_root(skip=before)
    try:
        from slurmhealth.config import load_config
        from slurmhealth.hooks.entry import run_hook

        run_hook(load_config(), name)
    except (Exception, KeyboardInterrupt) as exc:
        failure.exit_for(exc)


def __getattr__(name: str) -> Any:
    if name == "cli":
        from slurmhealth.cli.app import cli

        return cli
    raise AttributeError(name)
