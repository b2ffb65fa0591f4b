"""The house's shape: imports in src/flopscope flow one way (no cycles, lazy imports included) and
no module reaches into another module's private names."""

from __future__ import annotations

import ast
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


def _imports_in(module: str, *, typing: bool = True) -> list[tuple[str, str | None, int, str | None]]:
    """As :func:`_imports`, with the function each import is in."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
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


def _graph(*, typing: bool = True) -> dict[str, set[str]]:
    return {m: {t for t, _, _ in _imports(m, typing=typing) if t != m} for m in MODULES}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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
    """A package's ``__init__`` importing its own submodules is the one allowed loop: a submodule
    imports its package only for names the package itself defines, never back through it."""
    graph = _graph(typing=False)  # an import for type hints only is no edge at run time
    # A submodule that imports its parent package gets an edge to it; the package's __init__
    # importing the submodule back is then a real cycle and is reported.
    assert _cycles(graph) == []


# the one way a report reaches the renderer: its display methods, which import it when called
_DISPLAY = {"table", "__str__", "__rich__", "_repr_html_", "to_html"}


def test_report_does_not_import_renderers() -> None:
    """The report and its pieces (records, source, schema, rows, sections, diff) know nothing
    about rendering, but that a report (or a symbolic report) shows itself: its display methods
    import the renderer when called (no registry: a report prints from any import path); the
    renderer imports the report for type hints only."""
    rooms = [m for m in MODULES if m.startswith("flopscope.report")]
    assert len(rooms) >= 5
    for room in rooms:
        bad = [(t, line, fn) for t, _, line, fn in _imports_in(room)
               if t.startswith("flopscope.render")
               and not (room in ("flopscope.report.report", "flopscope.report.symbolic")
                        and fn in _DISPLAY)]
        assert bad == [], room
    for module in (m for m in MODULES if m.startswith("flopscope.render")):
        runtime = {t for t, _, _ in _imports(module, typing=False)}
        assert "flopscope.report.report" not in runtime, module


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
