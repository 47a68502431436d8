"""The hooks' process set-up (history migrations deferred, log lines naming the hook, job
and node) and :func:`run_hook`, the prolog's or epilog's decision in this process: what
``cli.hooks`` runs under click, and what ``slurmhealth prolog``/``epilog`` run without it
when the node agent is not used (``cli.main``): that fallback sits on every job's path while
the agent is down, so nothing here loads click.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:
    from slurmhealth.config import Config

SYSLOG_SOCKET = "/dev/log"


def hook_setup(name: str, node: str | None = None) -> None:
    """What every hook process does first: an existing history is never migrated inside the
    hook's timeout (what it writes is spooled; the admin migrates), and its log lines name
    the hook, the job and the node."""
    from slurmhealth.history import History

    History.defer_migrations = True
    hook_logging(name, node)


def hook_logging(name: str, node: str | None) -> None:
    node = node or os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
    who = f"node={node}" if name == "healthcheck" else (
        f"job={os.environ.get('SLURM_JOB_ID', '?')} node={node}"
    )  # fmt: skip
    fmt = f"slurmhealth {name}[{who}]: %(levelname)s: %(message)s"
    root = logging.getLogger()
    # the hooks' stderr reaches slurmd's log and the wrapper, which add the time and send
    # it to syslog; the sidecar's goes straight to SLURMHEALTH_LOG_FILE: it stamps its own
    stamped = logging.Formatter("%(asctime)s " + fmt, "%Y-%m-%dT%H:%M:%SZ")
    stamped.converter = time.gmtime
    for handler in root.handlers:
        handler.setFormatter(stamped if name == "sidecar" else logging.Formatter(fmt))
    root.setLevel(min(root.level, logging.INFO))
    if name == "sidecar":
        to_syslog(root, f"slurmhealth-{name}[{who}]: %(levelname)s: %(message)s")


def to_syslog(logger: logging.Logger, fmt: str) -> None:
    """Also send ``logger``'s records to syslog/journal (identifier ``slurmhealth``, as the
    wrappers' ``logger -t slurmhealth``) where the node has a syslog socket."""
    from logging.handlers import SysLogHandler

    if not os.path.exists(SYSLOG_SOCKET) or any(
        isinstance(h, SysLogHandler) for h in logger.handlers
    ):
        return
    try:
        handler = SysLogHandler(address=SYSLOG_SOCKET, facility=SysLogHandler.LOG_DAEMON)
    except OSError:
        return
    handler.ident = "slurmhealth: "
    handler.setFormatter(logging.Formatter(fmt))
    logger.addHandler(handler)


def run_hook(cfg: Config, name: str) -> NoReturn:
    """Run hook ``name`` (``prolog`` or ``epilog``) on this node and exit with its code."""
    from slurmhealth.hooks.prolog import run_epilog, run_prolog

    hook_setup(name)
    runner = run_prolog if name == "prolog" else run_epilog
    result = runner(cfg, os.environ)
    drain = result.drain
    summary = f"{result.status}" + (f"; {drain.state}: {drain.reason}" if drain else "")
    if drain and drain.detail:
        summary += f" ({drain.detail})"
    logging.getLogger("slurmhealth.hooks").info("%s", summary)
    sys.exit(result.exit_code)
