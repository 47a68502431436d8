"""The history is the only package that talks to sqlite: no other module imports a driver."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "slurmhealth"
DRIVERS = {"sqlite3", "sqlite_utils"}


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_no_module_outside_history_imports_a_database_driver() -> None:
    offenders = {
        str(path.relative_to(PACKAGE.parent)): sorted(_imported(path) & DRIVERS)
        for path in PACKAGE.rglob("*.py")
        if PACKAGE / "history" not in path.parents and _imported(path) & DRIVERS
    }
    assert offenders == {}


def test_the_walk_sees_function_level_imports() -> None:  # (writer imports sqlite_utils late)
    assert _imported(PACKAGE / "history" / "writer.py") & DRIVERS == DRIVERS
