"""The ``slurmhealth`` command: argument parsing, exit codes and rendering only; the work is
done below (hooks/, report/, baseline/, evidence/, ...).

One module per command group, each loaded only when its command runs (see ``app.COMMANDS``):
``check`` (check, checks), ``hooks`` (prolog, epilog, sidecar), ``history`` (history,
drains), ``nodes`` (nodes, resume), ``config``, ``report``, ``baseline`` (baseline,
validate), ``evidence``, ``incident``, ``xid``, ``exporter``. Shared options live in
``options``, tables and JSON output in ``render``, each command's ``--help`` examples in
``examples``, the once-per-run warnings in ``once``. A new command is a module here plus one
line in ``app.COMMANDS`` (and its example in ``examples.EXAMPLES``).
"""

from slurmhealth.cli.app import cli, main

__all__ = ["cli", "main"]
