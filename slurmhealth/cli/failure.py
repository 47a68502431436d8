"""How a ``slurmhealth`` process ends on an error, without click (the hooks' in-process
fallback runs without it): one line on stderr and the documented exit code (``app``'s
:data:`~slurmhealth.cli.app.EXIT_CODES`); ``--debug`` re-raises for the traceback."""

from __future__ import annotations

import sys
from typing import NoReturn

from slurmhealth.errors import SlurmhealthError


def exit_for(exc: BaseException, debug: bool = False) -> NoReturn:
    """Exit for ``exc``: 130 interrupted, 0 a closed pipe, the error's own code for a
    :class:`SlurmhealthError`, else 3 (internal error)."""
    if isinstance(exc, KeyboardInterrupt):
        sys.stderr.write("slurmhealth: interrupted\n")
        sys.exit(130)
    if isinstance(exc, BrokenPipeError):
        sys.exit(0)
    if debug:
        raise exc
    if isinstance(exc, SlurmhealthError):
        sys.stderr.write(f"slurmhealth: error: {exc}\n")
        sys.exit(exc.exit_code)
    sys.stderr.write(
        f"slurmhealth: internal error: {type(exc).__name__}: {exc} (run with --debug)\n"
    )
    sys.exit(3)
