"""What the commands share, defined once: the context object that loads the config and
the caller's rights (from the root-owned system config only) and holds the global flags
(``--debug``, ``--quiet``, ``--json``: accepted before or after the command, see
``app``), the ``--json`` flag and the ``--gpus`` list."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from slurmhealth.access import Caller, Rights
    from slurmhealth.config import Config

F = TypeVar("F", bound=Callable[..., Any])


class Ctx:
    """The root group's options. The config is read when a command asks, never at import."""

    def __init__(
        self,
        config_path: str | None,
        db: str | None,
        debug: bool,
        quiet: bool = False,
        as_json: bool = False,
    ) -> None:
        self.config_path = config_path
        self.db = db
        self.debug = debug
        self.quiet = quiet  # nothing on stdout but asked-for JSON; only errors on stderr
        self.as_json = as_json  # `slurmhealth --json CMD`: as CMD --json
        self._rights: Rights | None = None

    def config(self, flags: Mapping[str, object] | None = None) -> Config:
        """The effective config; ``flags`` maps dotted keys (``node.name``) to values."""
        from slurmhealth.config import load_config

        cfg = load_config(self.config_path, flags={"paths.db": self.db, **(flags or {})})
        return self._mark_rights(cfg)

    def rights(self) -> Rights:
        """What the root-owned system config grants (never the caller's own config)."""
        from slurmhealth import access

        if self._rights is None:
            path = access.system_config_path(self.config_path, os.getuid())
            self._rights = access.rights_from_system_config(path)
        return self._rights

    def caller(self) -> Caller:
        from slurmhealth.access import current_caller

        return current_caller()

    def _mark_rights(self, cfg: Config) -> Config:
        """``config show`` says when the caller's own ``evidence.admin_group`` grants nothing.
        Every command (the prolog too) loads the config: nothing to mark, nothing imported."""
        key = "evidence.admin_group"
        source = cfg.sources.get(key)
        if source is None:
            return cfg
        from slurmhealth import access

        system = access.system_config_path(self.config_path, os.getuid())
        if source == system:
            return cfg
        note = f"{source} (ignored for access: rights come from {system} only)"
        return dataclasses.replace(cfg, sources={**cfg.sources, key: note})


pass_ctx = click.make_pass_decorator(Ctx)


def json_option(fn: F) -> F:
    """``--json``: the command prints JSON (``as_json=True``) instead of a table or text;
    ``slurmhealth --json CMD`` too. Every JSON output is one object with a ``schema`` key
    (``slurmhealth.<what>/<version>``)."""
    return click.option(
        "--json",
        "as_json",
        is_flag=True,
        callback=_json_anywhere,
        help="Print JSON instead of text.",
    )(fn)


def _json_anywhere(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    root = ctx.find_object(Ctx)
    return bool(value or (root is not None and root.as_json))


def gpus_option(help: str, envvar: str | None = None) -> Callable[[F], F]:
    """``--gpus 0,3`` / ``0-7`` / ``all``: the command gets a tuple of indices, or None
    for every GPU (no value, empty or ``all``)."""
    return click.option("--gpus", metavar="LIST", envvar=envvar, callback=_parse_gpus, help=help)


def _parse_gpus(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> tuple[int, ...] | None:
    from slurmhealth.model import parse_gpu_list

    if value is None or value.strip() in ("", "all"):
        return None
    return parse_gpu_list(value, source="--gpus")
