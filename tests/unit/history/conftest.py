"""Fixtures of the history tests."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def systmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keep the last-resort spool (in ``tempfile.gettempdir()``) inside this test's tmp_path."""
    path = tmp_path / "systmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path
