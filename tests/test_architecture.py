"""The house's shape: imports in src/flopscope flow one way (no cycles, lazy and type-only imports
included) and no module reaches into another module's private names."""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping, Set
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "flopscope"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The flopscope module that an imported dotted name lives in (longest known prefix)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(tree: ast.AST) -> list[tuple[ast.AST, bool, str | None]]:
    """Every node with whether it is under ``if TYPE_CHECKING:`` (a type-only import: no edge at
    run time) and the name of the function it is in (``None`` at module level)."""
    out: list[tuple[ast.AST, bool, str | None]] = []

    def visit(node: ast.AST, typing_only: bool, function: str | None) -> None:
        out.append((node, typing_only, function))
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True, function)
            for child in node.orelse:
                visit(child, typing_only, function)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        for child in ast.iter_child_nodes(node):
            visit(child, typing_only, function)

    visit(tree, False, None)
    return out


def _imports(module: str, *, typing: bool = True) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import anywhere in ``module``
    (functions included: a lazy import is still an edge); ``typing=False`` leaves out imports
    under ``if TYPE_CHECKING:``."""
    return [(t, n, line) for t, n, line, _ in _imports_in(module, typing=typing)]


def _imports_in(module: str, *, typing: bool = True,
                source: str | None = None) -> list[tuple[str, str | None, int, str | None]]:
    """As :func:`_imports`, with the function each import is in; of ``source`` in place of the
    module's file when given (a planted import)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, str | None, int, str | None]] = []
    for node, typing_only, function in _walk(tree):
        if typing_only and not typing:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name)
                if target:
                    found.append((target, None, node.lineno, function))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            if not base.startswith("flopscope"):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in MODULES:  # `from package import submodule`
                    found.append((sub, None, node.lineno, function))
                else:
                    target = _resolve(base)
                    if target:
                        found.append((target, alias.name, node.lineno, function))
    return found


@functools.cache
def _graph(*, typing: bool = True) -> dict[str, frozenset[str]]:
    """Module -> the flopscope modules it imports (read once: callers copy before changing)."""
    return {m: frozenset(t for t, _, _ in _imports(m, typing=typing) if t != m) for m in MODULES}


def _cycles(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_modules_found() -> None:
    assert {"flopscope", "flopscope.core.counter", "flopscope.report", "flopscope.render.text"} <= set(MODULES)


def test_no_import_cycles() -> None:
    """Imports flow one way: no loop of modules, counting every import -- at module level, inside
    a function (a lazy import is still an edge) and under ``if TYPE_CHECKING:`` (a type-only
    import still ties two files together). A package's ``__init__`` importing its own submodules
    is no loop unless a submodule imports the package back (that edge is reported)."""
    assert _cycles(_graph()) == []


# one planted import of each kind, from the ground floor (flopscope.cost) to a module that
# imports it: each must close a loop that the test above reports
_PLANTED = {
    "module level": "from flopscope.core.counter import Counter\n",
    "in a function": "def f():\n    from flopscope.core.counter import Counter\n    return Counter\n",
    "type only": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                 "    from flopscope.core.counter import Counter\n",
}


@pytest.mark.parametrize("kind", sorted(_PLANTED))
def test_a_planted_cycle_is_found(kind: str) -> None:
    graph = dict(_graph())
    assert not any("flopscope.cost" in loop for loop in _cycles(graph))
    planted = {t for t, _, _, _ in _imports_in("flopscope.cost", source=_PLANTED[kind])}
    assert planted == {"flopscope.core.counter"}
    graph["flopscope.cost"] = graph["flopscope.cost"] | planted
    assert any({"flopscope.cost", "flopscope.core.counter"} <= set(loop) for loop in _cycles(graph))


# the one way a report reaches the renderer: its display methods, which import it when called
_DISPLAY = {"table", "__str__", "__rich__", "_repr_html_", "to_html"}
# the report a count returns (data + display) and the symbolic report: the two report modules
# above the renderers; every other report module sits below them
_SHOWN = ("flopscope.report.report", "flopscope.report.symbolic")


def test_report_data_does_not_import_renderers() -> None:
    """The report's data and pieces (data, records, source, schema, rows, sections, symbolic
    records) import no renderer; the report a count returns imports the renderers in its display
    methods only (no registry: a report prints from any import path, and importing flopscope does
    not import rich); the renderers read the report through ``report.data.ReportData`` and never
    import the shown reports, not even for type hints."""
    rooms = [m for m in MODULES if m.startswith("flopscope.report")]
    assert len(rooms) >= 5
    for room in rooms:
        bad = [(t, line, fn) for t, _, line, fn in _imports_in(room)
               if t.startswith("flopscope.render")
               and not (room == "flopscope.report.report" and fn in _DISPLAY)
               and not (room == "flopscope.report.symbolic"
                        and (fn in _DISPLAY or t == "flopscope.render.formulas"))]
        assert bad == [], room
    for module in (m for m in MODULES if m.startswith("flopscope.render")):
        shown = {t for t, _, _ in _imports(module)} & {*_SHOWN, "flopscope.report.diff"}
        assert shown == set(), module


def test_no_file_longer_than_500_lines() -> None:
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}


def test_at_most_three_private_modules_at_the_top() -> None:
    """An underscore module at the package top means an engine part or a piece of a split file;
    engine parts live in packages (core/, execution/, report/, render/)."""
    private = sorted(p.name for p in PACKAGE.glob("_*.py")
                     if p.name not in ("__init__.py", "__main__.py"))
    assert len(private) <= 3, private


def _private_attributes_defined(tree: ast.AST) -> set[str]:
    """Names of private attributes and methods that a module's classes define."""
    names: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name) and node.value.id == "self"):
                names.add(node.attr)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
        for stmt in cls.body:
            if isinstance(stmt, ast.Assign):
                names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _torch_private_names() -> set[str]:
    """Private attributes of torch's own objects (``module._parameters``, ``op._schema``,
    ``optimizer._optimizer_step_code``): reading those is using torch, not reaching into a
    flopscope module."""
    import torch
    from torch import nn

    names: set[str] = set()
    linear = nn.Linear(1, 1)
    for obj in (torch.ones(1), linear, nn.Module, torch.ops.aten.mm.default,
                torch.optim.SGD(linear.parameters(), lr=1.0), nn.Parameter(torch.ones(1))):
        names.update(dir(obj))
    return names


def test_no_module_reads_another_modules_private_attributes() -> None:
    """``obj._x``, where ``_x`` is a private attribute of a class in another flopscope module, is
    a hidden passage (module replay once replaced ``Counter._add`` and read five private
    attributes of the Counter); ``self._x`` and torch's own private attributes are fine."""
    trees = {m: ast.parse(p.read_text(), filename=str(p)) for m, p in MODULES.items()}
    defined = {m: _private_attributes_defined(t) for m, t in trees.items()}
    torch_names = _torch_private_names()
    bad = []
    for module, tree in trees.items():
        others = set().union(*(d for m, d in defined.items() if m != module)) - defined[module]
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr in others
                    and node.attr not in torch_names
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
                bad.append(f"{module}:{node.lineno} reads .{node.attr}")
    assert bad == []


def test_library_never_imports_the_cli() -> None:
    offenders = [m for m, deps in _graph().items()
                 if not m.startswith("flopscope.cli") and m != "flopscope.__main__"
                 and any(d.startswith("flopscope.cli") for d in deps)]
    assert offenders == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_names_of_other_modules(module: str) -> None:
    """``from flopscope.x import _name`` from another module reaches into x's private names
    (private *modules*, such as ``flopscope.core.tracker``, are the package's own and fine)."""
    bad = [f"{module}:{line} imports {name} from {target}"
           for target, name, line in _imports(module)
           if name is not None and name.startswith("_") and not name.startswith("__")
           and target != module]
    assert bad == []
