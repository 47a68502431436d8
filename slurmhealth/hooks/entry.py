"""The hooks' process set-up, and ``slurmhealth prolog``/``epilog`` run in-process without
click: what a hook process does when the node agent is not used (absent, killed, too slow).

The fallback sits on every job's path when the agent is down, so it loads only the hook's
own modules (``python -X importtime -m slurmhealth prolog`` with ``SLURMHEALTH_AGENT=off``
shows no click): the same decision, log lines, exit codes and one-line errors as
``cli.hooks`` (which runs the same :func:`run_hook` under click, with the global flags).
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


def main(name: str) -> NoReturn:
    """``slurmhealth prolog`` or ``slurmhealth epilog`` as Slurm runs them (no flags), in
    this process: the CLI's logging, config and error handling without click."""
    from slurmhealth.cli import once
    from slurmhealth.errors import SlurmhealthError

    before = list(logging.getLogger().handlers)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="slurmhealth: %(levelname)s: %(message)s")  # fmt: skip
    for handler in logging.getLogger().handlers:
        if handler not in before:
            once.install(handler)
    try:
        from slurmhealth.config import load_config

        run_hook(load_config(), name)
    except SlurmhealthError as exc:
        sys.stderr.write(f"slurmhealth: error: {exc}\n")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("slurmhealth: interrupted\n")
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:
        sys.stderr.write(
            f"slurmhealth: internal error: {type(exc).__name__}: {exc} (run with --debug)\n"
        )
        sys.exit(3)
