"""What the commands share, defined once: the context object that loads the config, the
``--json`` flag and the ``--gpus`` list."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import click

if TYPE_CHECKING:
    from slurmhealth.config import Config

F = TypeVar("F", bound=Callable[..., Any])


class Ctx:
    """The root group's options. The config is read when a command asks, never at import."""

    def __init__(self, config_path: str | None, db: str | None, debug: bool) -> None:
        self.config_path = config_path
        self.db = db
        self.debug = debug

    def config(self, flags: Mapping[str, object] | None = None) -> Config:
        """The effective config; ``flags`` maps dotted keys (``node.name``) to values."""
        from slurmhealth.config import load_config

        return load_config(self.config_path, flags={"paths.db": self.db, **(flags or {})})


pass_ctx = click.make_pass_decorator(Ctx)


def json_option(fn: F) -> F:
    """``--json``: the command prints JSON (``as_json=True``) instead of a table or text."""
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")(fn)


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
