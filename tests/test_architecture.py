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


def _imports(module: str) -> list[tuple[str, str | None, int]]:
    """(imported module, imported name or None, line) for every import anywhere in ``module``
    (functions included: a lazy import is still an edge)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, str | None, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name)
                if target:
                    found.append((target, None, node.lineno))
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
                    found.append((sub, None, node.lineno))
                else:
                    target = _resolve(base)
                    if target:
                        found.append((target, alias.name, node.lineno))
    return found


def _graph() -> dict[str, set[str]]:
    return {m: {t for t, _, _ in _imports(m) if t != m} for m in MODULES}


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
    assert {"flopscope", "flopscope.core.counter", "flopscope.report", "flopscope.render.formats"} <= set(MODULES)


def test_no_import_cycles() -> None:
    """A package's ``__init__`` importing its own submodules is the one allowed loop: a submodule
    imports its package only for names the package itself defines, never back through it."""
    graph = _graph()
    # A submodule that imports its parent package gets an edge to it; the package's __init__
    # importing the submodule back is then a real cycle and is reported.
    assert _cycles(graph) == []


def test_report_does_not_import_renderers() -> None:
    """The report and the modules it is split into (records, source, schema, table rows) know
    nothing about rendering."""
    graph = _graph()
    rooms = [m for m in graph if m.startswith("flopscope.report")]
    assert len(rooms) >= 5  # report.py and its pieces
    for room in rooms:
        assert not {d for d in graph[room] if d.startswith("flopscope.render")}, room


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
