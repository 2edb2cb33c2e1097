"""tests/support's promise (its ``__init__``): bench/ can import its modules, so only the pytest
plugin and the kind fixture import pytest, and none imports a test file."""

from __future__ import annotations

import ast
from pathlib import Path

SUPPORT = Path(__file__).resolve().parents[2] / "support"
PYTEST_USERS = {"interrupts.py", "kind.py"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_only_the_plugin_and_the_kind_fixture_import_pytest_and_none_a_test_file() -> None:
    modules = sorted(SUPPORT.glob("*.py"))
    assert len(modules) > 5
    for path in modules:
        imported = imported_modules(path)
        if path.name not in PYTEST_USERS:
            assert not {n for n in imported if n.split(".")[0] == "pytest"}, path.name
        tests = {n for n in imported if n.startswith("tests.") and n.split(".")[1] != "support"}
        assert not tests, f"{path.name} imports {tests}"
