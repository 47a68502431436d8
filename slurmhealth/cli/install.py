"""``slurmhealth install``: put what a node needs besides the Python package where every doc,
template and test says it is (``LAYOUT``): the Slurm wrappers, the default config and the
wrappers' environment file (never overwritten), the exporter's systemd unit, the runtime
directory's tmpfiles.d entry, the logrotate config, the man page and the state and log
directories. The files come from the installed package itself (package data), so a wheel
is all a node needs; ``scripts/build-deb`` runs the same command into its package root.

``--prefix DIR`` puts the layout under DIR instead of ``/`` (a package root, a test's temp
dir); ``--dry-run`` prints what would be done and touches nothing.
"""

from __future__ import annotations

import gzip
import importlib.resources
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click

from slurmhealth.cli.options import Ctx, json_option, pass_ctx
from slurmhealth.errors import UsageError

# The one install layout (README "Install on a cluster", deploy/slurm, the Debian package).
LAYOUT: Mapping[str, str] = {
    "venv": "/opt/slurmhealth",
    "bin": "/opt/slurmhealth/bin/slurmhealth",
    "wrappers": "/usr/lib/slurmhealth",
    "config": "/etc/slurmhealth/config.toml",
    "env_file": "/etc/default/slurmhealth",
    "state": "/var/lib/slurmhealth",
    "run": "/run/slurmhealth",
    "logs": "/var/log/slurmhealth",
    "unit": "/usr/lib/systemd/system/slurmhealth-exporter.service",
    "tmpfiles": "/usr/lib/tmpfiles.d/slurmhealth.conf",
    "logrotate": "/etc/logrotate.d/slurmhealth",
    "man": "/usr/share/man/man1/slurmhealth.1.gz",
    "snippet": "/usr/share/slurmhealth/slurm.conf.snippet",
    # a job's own Python imports the client (slurmhealth.job, slurmhealth.train) from here,
    # without the venv's other packages: PYTHONPATH=/usr/lib/slurmhealth/python
    "pythonpath": "/usr/lib/slurmhealth/python",
}
WRAPPERS = (
    "slurmhealth-prolog",
    "slurmhealth-epilog",
    "slurmhealth-healthcheck",
    "slurmhealth-ctld-epilog",
)


@dataclass(frozen=True)
class Item:
    """One thing to install: a file (``data``), a symlink (``link``) or a directory."""

    path: str  # absolute, on the node
    mode: int
    data: bytes | None = None
    keep: bool = False  # edited by the admin: an existing one is never replaced
    link: str = ""  # the symlink's target: absolute, or under the prefix when there


def _package_file(*parts: str) -> bytes:
    return importlib.resources.files("slurmhealth").joinpath(*parts).read_bytes()


def _package_dir() -> str:
    """The installed ``slurmhealth`` package's folder (this file is its cli/install.py)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _manpage() -> bytes:
    from slurmhealth.cli.app import cli
    from slurmhealth.cli.manpage import render

    return gzip.compress(render(cli).encode(), mtime=0)


def plan(bin_path: str, runtime: bool) -> list[Item]:
    """Everything ``install`` places, in order; ``bin_path`` goes into the env file.
    ``runtime``: also create the run directory (a live system, not a package root: there
    tmpfiles.d creates it at boot)."""
    env = _package_file("data", "default-env").decode().replace("@BIN@", bin_path)
    wrappers = [Item(f"{LAYOUT['wrappers']}/{w}", 0o755, _package_file("wrappers", w))
                for w in WRAPPERS]  # fmt: skip
    return [
        *wrappers,
        Item(LAYOUT["config"], 0o644, _package_file("data", "config.toml"), keep=True),
        Item(LAYOUT["env_file"], 0o644, env.encode(), keep=True),
        Item(LAYOUT["logrotate"], 0o644, _package_file("data", "logrotate"), keep=True),
        Item(LAYOUT["unit"], 0o644, _package_file("data", "slurmhealth-exporter.service")),
        Item(LAYOUT["tmpfiles"], 0o644, _package_file("data", "tmpfiles.conf")),
        Item(LAYOUT["man"], 0o644, _manpage()),
        Item(LAYOUT["snippet"], 0o644, _package_file("data", "slurm.conf.snippet")),
        Item(f"{LAYOUT['pythonpath']}/slurmhealth", 0, link=_package_dir()),
        # 0755: job owners reach their evidence bundles below it (README "Access")
        Item(LAYOUT["state"], 0o755),
        Item(LAYOUT["logs"], 0o750),
        *([Item(LAYOUT["run"], 0o755)] if runtime else []),
    ]


def _under(prefix: str, path: str) -> str:
    return os.path.join(prefix, path.lstrip("/"))


def _write(dest: str, item: Item) -> None:
    """Atomically, never through a symlink planted at ``dest``: a new file, then rename."""
    assert item.data is not None
    os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
    tmp = f"{dest}.slurmhealth-new"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, item.mode)
    with os.fdopen(fd, "wb") as out:
        out.write(item.data)
    os.chmod(tmp, item.mode)  # whatever the umask
    os.replace(tmp, dest)


def _symlink(dest: str, target: str, prefix: str) -> None:
    """``dest`` -> ``target``; a target inside ``prefix`` (a package root) is linked
    relatively, so the link holds once the root is unpacked at /."""
    root = os.path.abspath(prefix)
    if root != "/" and os.path.commonpath([root, target]) == root:
        target = os.path.relpath(target, os.path.dirname(dest))
    os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
    if os.path.islink(dest):
        os.unlink(dest)
    os.symlink(target, dest)


def apply(items: list[Item], prefix: str, dry_run: bool) -> list[dict[str, Any]]:
    """Install ``items`` under ``prefix``; one ``{"path", "action", "mode"}`` per item, where
    action is ``install``, ``keep`` (an existing config) or ``exists`` (a directory)."""
    done = []
    for item in items:
        dest = _under(prefix, item.path)
        if item.link:
            action = "install"
            if not dry_run:
                _symlink(dest, item.link, prefix)
        elif item.data is None:
            action = "exists" if os.path.isdir(dest) else "install"
            if action == "install" and not dry_run:
                os.makedirs(dest, exist_ok=True)
                os.chmod(dest, item.mode)
        else:
            action = "keep" if item.keep and os.path.lexists(dest) else "install"
            if action == "install" and not dry_run:
                _write(dest, item)
        mode = f"-> {item.link}" if item.link else f"{item.mode:04o}"
        done.append({"path": dest, "action": action, "mode": mode})
    return done


def _describe(row: dict[str, Any], dry_run: bool) -> str:
    verb = {"install": "would install" if dry_run else "installed",
            "keep": "kept (exists; not replaced)",
            "exists": "exists"}[row["action"]]  # fmt: skip
    return f"{verb:<28} {row['path']} ({row['mode']})"


@click.command("install")
@click.option(
    "--prefix",
    default="/",
    show_default=True,
    metavar="DIR",
    help="Install the layout under DIR instead of / (a package root, a test dir).",
)
@click.option(
    "--bin",
    "bin_path",
    default=LAYOUT["bin"],
    show_default=True,
    metavar="PATH",
    help="The slurmhealth executable the wrappers run (written to the env file).",
)
@click.option("--dry-run", is_flag=True, help="Print what would be installed; change nothing.")
@json_option
@pass_ctx
def install(ctx: Ctx, prefix: str, bin_path: str, dry_run: bool, as_json: bool) -> None:
    """Install the Slurm wrappers, default config, env file, systemd unit, tmpfiles.d and
    logrotate configs, man page and state directories at the standard layout:

    \b
      /opt/slurmhealth/bin/slurmhealth      this venv (pip install slurmhealth-*.whl)
      /usr/lib/slurmhealth/slurmhealth-{prolog,epilog,healthcheck,ctld-epilog}
      /etc/slurmhealth/config.toml          kept when it exists
      /etc/default/slurmhealth              kept when it exists
      /var/lib/slurmhealth, /var/log/slurmhealth, /run/slurmhealth

    Exits 0 when done, 2 when the prefix cannot be written."""
    from slurmhealth.cli import render

    if not os.path.isabs(bin_path):
        raise UsageError(f"--bin: {bin_path!r} is not an absolute path")
    live = os.path.realpath(prefix) == "/"
    try:
        done = apply(plan(bin_path, runtime=live), prefix, dry_run)
    except OSError as exc:
        raise UsageError(f"install: {exc.filename or prefix}: {exc.strerror}") from exc
    layout = {k: _under(prefix, v) for k, v in LAYOUT.items()}
    layout["scenarios"] = os.path.join(_package_dir(), "scenarios")
    if as_json:
        render.print_json({"schema": "slurmhealth.install/1", "prefix": prefix,
                           "dry_run": dry_run, "files": done, "layout": layout})  # fmt: skip
        return
    if ctx.quiet:
        return
    for row in done:
        click.echo(_describe(row, dry_run))
    # the wrappers run --bin as written: an executable there now (a checkout's venv, as
    # scripts/cluster passes) is as good as one under a package root's prefix
    if not os.path.exists(_under(prefix, bin_path)) and not os.path.exists(bin_path):
        click.echo(f"note: {bin_path} does not exist (nor under {prefix}): the wrappers run "
                   "it; create the venv there or pass --bin", err=True)  # fmt: skip
    if not dry_run and live:
        click.echo("next: systemctl daemon-reload && systemctl enable --now "
                   "slurmhealth-exporter; add the lines of "
                   f"{LAYOUT['snippet']} to slurm.conf")  # fmt: skip
