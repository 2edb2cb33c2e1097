"""The SDK's and the operator's import graphs have no cycle, however an import is made.

``lint-imports`` checks the layers on the imports that run (type-only ones left out, see
pyproject.toml). This test reads every module's source and counts every import: at module
level, inside functions, under ``if TYPE_CHECKING:`` and ``importlib.import_module("...")``
with a literal name, so a cycle cannot hide in a late or type-only import either.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = {"strategyjob": ROOT / "sdk" / "strategyjob", "strategyjob_operator": ROOT / "operator"}


def _modules(package: str) -> dict[str, Path]:
    """Every module of ``package``: dotted name -> source file (a package is its __init__)."""
    base = PACKAGES[package]
    top = base if base.name == package else base / package
    found = {}
    for path in top.rglob("*.py"):
        parts = path.relative_to(top.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> Iterator[str]:
    """The modules of ``known`` that ``module``'s source imports: ``from a import b`` imports
    the module ``a.b`` when there is one, else ``a`` (as import-linter counts)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{node.module}" if node.module else anchor
            else:
                base = node.module or ""
            for alias in node.names:
                name = f"{base}.{alias.name}"
                if name in known or base in known:
                    yield name if name in known else base
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in known
        ):
            yield node.args[0].value


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports, by any kind of import."""
    modules = _modules(package)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        found = _imports(tree, name, path.name == "__init__.py", set(modules))
        graph[name] = set(found) - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_cycle_finder_sees_a_type_only_and_a_late_import() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .b import X\n"
        "def f():\n    import importlib\n    return importlib.import_module('pkg.c')\n"
    )
    known = {"pkg", "pkg.a", "pkg.b", "pkg.c"}
    assert set(_imports(ast.parse(source), "pkg.a", False, known)) == {"pkg.b", "pkg.c"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle_even_counting_type_only_and_late_imports(package: str) -> None:
    found = cycles(import_graph(package))
    assert found == [], f"import cycles in {package} (each line: the modules of one cycle):\n" + (
        "\n".join(" <-> ".join(c) for c in found)
    )
