"""The layer map of docs/architecture.md, enforced: every ``slurmhealth`` import (module level
or inside a function) goes to the same layer or one below, no two units import each other, no
module imports itself back through any chain of imports (lazy and type-only ones counted),
and the package root holds a handful of modules, the rest living in the packages that name
the parts.

The map lives in docs/architecture.md as a table; this test parses that table, so the doc and
the test cannot drift apart.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "slurmhealth"
DOC = ROOT / "docs" / "architecture.md"
LAYERS = ("entry", "orchestration", "domain", "adapters", "model", "client")
# "client" (the training-side library) stands apart: it imports nothing of slurmhealth and
# nothing of slurmhealth imports it except the entry layer (for `--help` of its env names).


def layer_map() -> dict[str, str]:
    """``{module prefix: layer}`` from the doc's table rows ``| layer | `a`, `b` | ... |``."""
    out: dict[str, str] = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or cells[0] not in LAYERS:
            continue
        for name in re.findall(r"`(slurmhealth[\w.]*)`", cells[1]):
            out[name] = cells[0]
    return out


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_only(tree: ast.Module) -> set[int]:
    """Ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def imports_of(name: str, path: Path, *, runtime_only: bool = False) -> Iterator[tuple[str, int]]:
    """Every ``slurmhealth`` module this module imports, with the line: ``from x import y``
    counts as ``x.y`` when ``x.y`` is a module, else ``x``. ``runtime_only`` leaves out
    imports made only for the type checker."""
    known = modules()
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_only(tree) if runtime_only else set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "slurmhealth":
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            if base.split(".")[0] != "slurmhealth":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield (sub if sub in known else base), node.lineno


def layer_of(name: str, table: dict[str, str]) -> str | None:
    best = max((p for p in table if name == p or name.startswith(p + ".")), key=len, default="")
    return table.get(best)


def unit_of(name: str) -> str:
    """The unit cycles are judged between: a first-level subpackage or top-level module."""
    return ".".join(name.split(".")[:2])


def violations(table: dict[str, str]) -> list[str]:
    rank = {layer: i for i, layer in enumerate(LAYERS[:-1])}
    out = []
    for name, path in modules().items():
        mine = layer_of(name, table)
        for target, line in imports_of(name, path):
            theirs = layer_of(target, table)
            where = f"{path.relative_to(ROOT)}:{line}: {name} ({mine}) imports {target} ({theirs})"
            if mine == "client" or theirs == "client":
                if mine != "entry" and mine != theirs:
                    out.append(where + ": the client is standard library only")
            elif mine is None or theirs is None:
                continue  # reported by test_every_module_has_a_layer
            elif rank[theirs] < rank[mine]:
                out.append(where + ": imports upwards")
    return out


def cycles() -> list[list[str]]:
    """Runtime import cycles between units (a type-only import creates no dependency at run
    time; it still has to respect the layers)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules().items():
        src = unit_of(name)
        for target, _ in imports_of(name, path, runtime_only=True):
            dst = unit_of(target)
            if dst != src and dst != "slurmhealth":
                graph.setdefault(src, set()).add(dst)
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def module_cycles() -> list[list[str]]:
    """Import cycles between modules, counting every import: module level, inside a function
    (a lazy import still needs the other module to be importable first) and for the type
    checker only (the two modules still describe each other). A package's ``__init__`` is the
    package's module; a submodule importing its package's names is an edge like any other."""
    known = modules()
    graph = {name: {t for t, _ in imports_of(name, path) if t in known and t != name}
             for name, path in known.items()}  # fmt: skip
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def strongly_connected(node: str) -> None:  # Tarjan
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                strongly_connected(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = [stack.pop()]
            while group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            strongly_connected(node)
    return found


ROOT_MODULES_MAX = 6
STAGES = ("gather", "build", "render")
# what a build module may not import: the standard library's I/O (databases, commands, the
# network, the filesystem's listing and users), named by top-level module
IO_MODULES = frozenset({"sqlite3", "subprocess", "urllib", "http", "socket", "glob", "pwd",
                        "grp", "shutil", "tempfile", "pathlib"})  # fmt: skip


def stage_map() -> dict[str, str]:
    """``{report module: stage}`` from the doc's table ``| gather | `a`, `b` |``."""
    out: dict[str, str] = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0] in STAGES:
            out.update((name, cells[0]) for name in re.findall(r"`(slurmhealth[\w.]*)`", cells[1]))
    return out


def stdlib_imports(path: Path) -> Iterator[tuple[str, int]]:
    """The top-level non-slurmhealth modules a module imports at run time, with the line."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            yield from ((a.name.split(".")[0], node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.module.split(".")[0], node.lineno


def stage_violations(stages: dict[str, str], table: dict[str, str]) -> list[str]:
    """Build modules: no I/O module, nothing below the domain's neighbours (adapters,
    orchestration, entry) and nothing of gather or render; render: nothing of gather."""
    out = []
    for name, path in modules().items():
        stage = stages.get(name)
        if stage not in ("build", "render"):
            continue
        where = f"{path.relative_to(ROOT)}"
        for lib, line in stdlib_imports(path):
            if stage == "build" and lib in IO_MODULES:
                out.append(f"{where}:{line}: the build ({name}) imports {lib}, which does I/O")
        for target, line in imports_of(name, path, runtime_only=True):
            theirs = stages.get(target)
            if stage == "build" and theirs in ("gather", "render"):
                out.append(f"{where}:{line}: the build ({name}) imports {target} ({theirs})")
            elif stage == "build" and layer_of(target, table) in (
                "adapters",
                "orchestration",
                "entry",
            ):
                out.append(f"{where}:{line}: the build ({name}) imports {target}, an adapter")
            elif stage == "render" and theirs == "gather":
                out.append(f"{where}:{line}: the render ({name}) imports {target} (gather)")
    return out


def test_every_report_module_has_a_stage() -> None:
    stages = stage_map()
    report = [n for n in modules() if n.startswith("slurmhealth.report.")]
    assert set(stages.values()) == set(STAGES), stages
    assert sorted(n for n in report if n not in stages) == []
    assert sorted(n for n in stages if n not in modules()) == []


def test_the_report_build_is_pure() -> None:
    bad = stage_violations(stage_map(), layer_map())
    assert not bad, "\n".join(bad)


def test_an_impure_build_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage check itself: a build module that runs sqlite or calls the gathering, and a
    renderer that reads a history, are each reported."""
    fake = tmp_path / "slurmhealth"
    (fake / "report").mkdir(parents=True)
    for name in ("__init__.py", "report/__init__.py", "report/gather.py"):
        (fake / name).write_text("")
    (fake / "report" / "build.py").write_text(
        "import sqlite3\n\ndef f():\n    from slurmhealth.report import gather\n"
    )
    (fake / "report" / "render.py").write_text("from slurmhealth.report.gather import x\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    stages = {"slurmhealth.report.gather": "gather", "slurmhealth.report.build": "build",
              "slurmhealth.report.render": "render"}  # fmt: skip
    bad = stage_violations(stages, {"slurmhealth.report": "domain"})
    assert [b.split(": ", 1)[1] for b in bad] == [
        "the build (slurmhealth.report.build) imports sqlite3, which does I/O",
        "the build (slurmhealth.report.build) imports slurmhealth.report.gather (gather)",
        "the render (slurmhealth.report.render) imports slurmhealth.report.gather (gather)",
    ]


def test_the_doc_has_a_map() -> None:
    table = layer_map()
    assert set(table.values()) == set(LAYERS), table


def test_every_module_has_a_layer() -> None:
    table = layer_map()
    missing = [n for n in modules() if n != "slurmhealth" and layer_of(n, table) is None]
    assert not missing, f"modules missing from docs/architecture.md: {missing}"


def test_no_import_against_the_map() -> None:
    bad = violations(layer_map())
    assert not bad, "\n".join(bad)


def test_no_cycles_between_units() -> None:
    assert not cycles()


def test_no_import_cycle_between_modules() -> None:
    assert not module_cycles()


def test_the_package_root_holds_a_handful_of_modules() -> None:
    """The root keeps what everything shares (errors, the model, the client library, the
    entry point); a part of the system is a package named after it (slurm, config, metrics,
    access, history, ...), so the tree shows the architecture."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(loose) <= ROOT_MODULES_MAX, loose


def test_a_lazy_or_type_only_cycle_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cycle check itself: a lazy import back, or one for the type checker only, closes a
    cycle as much as a module-level one."""
    fake = tmp_path / "slurmhealth"
    (fake / "pkg").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "pkg" / "__init__.py").write_text("def f():\n    from slurmhealth.pkg import part\n")
    (fake / "pkg" / "part.py").write_text("from slurmhealth.pkg import f\n")
    (fake / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                               "    from slurmhealth import b\n")  # fmt: skip
    (fake / "b.py").write_text("import slurmhealth.a\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    assert module_cycles() == [
        ["slurmhealth.a", "slurmhealth.b"],
        ["slurmhealth.pkg", "slurmhealth.pkg.part"],
    ]


def test_an_upward_import_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker itself: a model module that imports the CLI is reported."""
    fake = tmp_path / "slurmhealth"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "model.py").write_text("def f():\n    from slurmhealth.cli import main\n")
    (fake / "cli.py").write_text("from slurmhealth import model\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    table = {"slurmhealth.cli": "entry", "slurmhealth.model": "model"}
    assert any("imports upwards" in v for v in violations(table))
    assert cycles() == [["slurmhealth.cli", "slurmhealth.model", "slurmhealth.cli"]]


def row_tuples_outside_history() -> list[str]:
    """Places outside ``slurmhealth/history/`` that build the history's batches themselves
    (``Batch(...)``, ``.inserts``/``.upserts``) or write a ``(table, dict)`` tuple with a
    table's name: callers hand over ``history.records`` rows, the history makes the rest."""
    from slurmhealth.history.schema import COLUMNS

    found = []
    for name, path in sorted(modules().items()):
        if name == "slurmhealth.history" or name.startswith("slurmhealth.history."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
                called = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
                if called == "Batch":
                    found.append(f"{where}: builds a Batch")
            elif isinstance(node, ast.Attribute) and node.attr in ("inserts", "upserts"):
                found.append(f"{where}: touches a batch's {node.attr}")
            elif (isinstance(node, ast.Tuple) and len(node.elts) >= 2
                  and isinstance(node.elts[0], ast.Constant) and node.elts[0].value in COLUMNS
                  and isinstance(node.elts[1], ast.Dict | ast.Name | ast.Call)):  # fmt: skip
                found.append(f"{where}: a ({node.elts[0].value!r}, row) tuple")
    return sorted(found)


def test_the_history_owns_its_rows() -> None:
    assert row_tuples_outside_history() == []


def test_a_table_row_tuple_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself: a hook that writes ``("drains", row)`` or builds a Batch is named."""
    fake = tmp_path / "slurmhealth"
    (fake / "hooks").mkdir(parents=True)
    (fake / "history").mkdir()
    for init in (fake / "__init__.py", fake / "hooks" / "__init__.py"):
        init.write_text("")
    (fake / "history" / "__init__.py").write_text("class Batch: ...\nBatch(inserts=[])\n")
    (fake / "hooks" / "a.py").write_text(
        "from slurmhealth.history import Batch\n"
        "def f(h, row):\n    h.write(Batch(inserts=[('drains', row)]))\n"
        "def g(b, row):\n    b.upserts.append(('jobs', {'job_id': '1'}, 'job_id'))\n"
    )
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGE", fake)
    assert row_tuples_outside_history() == [
        "slurmhealth/hooks/a.py:3: a ('drains', row) tuple",
        "slurmhealth/hooks/a.py:3: builds a Batch",
        "slurmhealth/hooks/a.py:5: a ('jobs', row) tuple",
        "slurmhealth/hooks/a.py:5: touches a batch's upserts",
    ]


def test_the_epilogs_summary_does_not_need_the_report() -> None:
    """The epilog writes a node's summary from ``slurmhealth.summary``, which sits below the
    report as well: nothing of the evidence package or the summary package imports the
    report (the report reads the summaries back; never the other way round)."""
    below = ("slurmhealth.evidence", "slurmhealth.summary")
    found = []
    for name, path in sorted(modules().items()):
        if unit_of(name) not in below:
            continue
        for imported, line in imports_of(name, path):
            if unit_of(imported) == "slurmhealth.report":
                found.append(f"{path.relative_to(ROOT)}:{line}: imports {imported}")
    assert found == []
