"""When a test may skip: only when the machine lacks what the test needs (root, a tool, a
driver), decided by that condition itself; under ``CI=true`` the same condition fails the
test, since CI installs everything the suite needs (``.ci/run``, ``scripts/test``).

The one exception is an optional extra of the package that CI cannot have: ``pyslurm``
targets a newer Slurm than Debian ships (README: `[slurm] backend`), so its tests skip
everywhere through ``optional_extra``, which names the extra in the skip reason."""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest

OPTIONAL_EXTRAS = frozenset({"pyslurm"})


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def unavailable(reason: str) -> NoReturn:
    """Skip locally, fail under CI (where the suite must run whole)."""
    if in_ci():
        pytest.fail(f"CI is set but this test cannot run: {reason}")
    pytest.skip(reason)


def optional_extra(extra: str, reason: str) -> NoReturn:
    """Skip a test of an optional extra the machine does not have, in CI too."""
    if extra not in OPTIONAL_EXTRAS:
        raise AssertionError(f"{extra!r} is not a documented optional extra")
    pytest.skip(f"optional extra {extra} unavailable: {reason}")


def require_module(name: str, reason: str) -> ModuleType:
    """``pytest.importorskip`` that fails under CI: for a whole test module that needs an
    extra the suite installs (``scripts/test`` installs the training frameworks)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        if in_ci():
            pytest.fail(f"CI is set but {name} cannot be imported: {reason}", pytrace=False)
        pytest.skip(reason, allow_module_level=True)


def root_only(reason: str) -> pytest.MarkDecorator:
    """``skipif`` not root, locally only: under CI (which runs as root) the test runs and
    fails if it cannot do what it needs root for."""
    return pytest.mark.skipif(os.geteuid() != 0 and not in_ci(), reason=reason)


def needs(condition: bool, reason: str) -> pytest.MarkDecorator:
    """``skipif`` the machine lacks something (``condition`` false), locally only: under CI
    the test runs and fails without it."""
    return pytest.mark.skipif(not condition and not in_ci(), reason=reason)
