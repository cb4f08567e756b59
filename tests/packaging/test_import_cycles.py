"""No package imports itself in a circle: the modules of each package, read as its children
(a subpackage counts as one), import one another without a cycle, so each can be read, and
imported, from the bottom up.

Only imports that run when a module is imported count: those under ``if TYPE_CHECKING:`` never
run, and one inside a function runs after every module is loaded (each such import says why it
is there). The graph is grimp's, the one import-linter checks the layers on.
"""

from __future__ import annotations

import ast
import importlib.util
from collections import deque
from functools import cache
from itertools import pairwise
from pathlib import Path

import grimp
import pytest

ROOTS = (
    "txbroker",
    "txbroker_sdk",
    "txbroker_checkback",
    "txbroker_outbox",
    "txbroker_migrations",
    "txbroker_reconcile",
    "examples",
)


@cache
def _graph() -> grimp.ImportGraph:
    return grimp.build_graph(
        *ROOTS, include_external_packages=False, exclude_type_checking_imports=True
    )


@cache
def _lines_in_functions(module: str) -> frozenset[int]:
    """The source lines of the imports inside a function body of ``module``."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    source = Path(spec.origin)
    if source.suffix != ".py":  # compiled (the compiled hot path): its source is beside it
        source = source.with_name(module.rsplit(".", 1)[-1] + ".py")
    with open(source, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    lines: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return frozenset(lines)


def _imports_at_load(importer: str, imported: str) -> list[str]:
    """The import lines of ``importer`` that load ``imported`` when ``importer`` is imported."""
    lazy = _lines_in_functions(importer)
    return [
        f"{importer}:{d['line_number']}: {d['line_contents']}"
        for d in _graph().get_import_details(importer=importer, imported=imported)
        if d["line_number"] not in lazy
    ]


def _child(package: str, module: str) -> str | None:
    """The child of ``package`` that holds ``module`` (``package`` for its own ``__init__``)."""
    if module == package:
        return package
    if not module.startswith(package + "."):
        return None
    return f"{package}.{module[len(package) + 1 :].split('.')[0]}"


def _edges(package: str) -> dict[str, dict[str, list[str]]]:
    """Child -> imported child -> the import lines behind it."""
    graph = _graph()
    edges: dict[str, dict[str, list[str]]] = {c: {} for c in graph.find_children(package)}
    edges[package] = {}
    for module in graph.find_descendants(package) | {package}:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = _child(package, module), _child(package, imported)
            if a is None or b is None or a == b:
                continue
            lines = _imports_at_load(module, imported)
            if lines:
                edges[a].setdefault(b, []).extend(lines)
    return edges


def _cycles(edges: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components with more than one child (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _one_loop(edges: dict[str, dict[str, list[str]]], component: list[str]) -> list[str]:
    """A shortest way from the component's first child back to itself, as import lines."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(edges[v]):
            if w not in members:
                continue
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                hops = [start, *reversed(path[:-1]), start]
                return [edges[a][b][0] for a, b in pairwise(hops)]
            if w not in came_from:
                came_from[w] = v
                queue.append(w)
    raise AssertionError(f"no loop through {start}")


def _packages() -> list[str]:
    graph = _graph()
    return sorted(m for m in graph.modules if graph.find_children(m))


@pytest.mark.parametrize("package", _packages())
def test_no_import_cycle_among_a_packages_modules(package: str) -> None:
    edges = _edges(package)
    cycles = _cycles(edges)
    report = [f"{', '.join(c)}\n    " + "\n    ".join(_one_loop(edges, c)) for c in cycles]
    assert not cycles, f"import cycles in {package}:\n  " + "\n  ".join(report)
