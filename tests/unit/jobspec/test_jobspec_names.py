"""strategyjob._names is the one definition of the API coordinates, labels and environment
variable names: the CRD agrees with it, and no other module of the SDK or the operator
spells one of its names as a string of its own."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import yaml
from strategyjob import _names, jobspec
from strategyjob.launcher import _plan

ROOT = Path(__file__).resolve().parents[3]
SOURCES = (ROOT / "sdk" / "strategyjob", ROOT / "operator" / "strategyjob_operator")


def shared_names() -> dict[str, str]:
    """The names a module could spell out by mistake: the environment variables and the API
    group (labels and annotations start with it). ``StrategyJob`` is also a class name."""
    return {
        key: value
        for key, value in vars(_names).items()
        if key.startswith("ENV_") or key in ("GROUP", "API_VERSION")
    }


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are docstrings (prose may name anything)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def spelled_out(values: set[str]) -> Iterator[tuple[str, str]]:
    """``(file, name)`` for every string constant equal to one of ``values`` (or an API
    group-prefixed name, e.g. a label) outside strategyjob/_names.py."""
    for source in SOURCES:
        for path in sorted(source.rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative == "sdk/strategyjob/_names.py":
                continue
            tree = ast.parse(path.read_text(), relative)
            skip = docstrings(tree)
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and id(node) not in skip
                    and (node.value in values or node.value.startswith(f"{_names.GROUP}/"))
                ):
                    yield relative, node.value


def test_every_shared_name_is_defined_once() -> None:
    values = set(shared_names().values())
    found = set(spelled_out(values))
    assert found == set(), "import these from strategyjob._names"


def test_the_crd_serves_the_names_of_the_sdk() -> None:
    crd = yaml.safe_load((ROOT / "crds" / "strategyjob.dev_strategyjobs.yaml").read_text())
    assert crd["spec"]["group"] == _names.GROUP
    assert crd["metadata"]["name"] == f"{_names.PLURAL}.{_names.GROUP}"
    assert crd["spec"]["names"]["kind"] == _names.KIND
    assert crd["spec"]["names"]["plural"] == _names.PLURAL
    assert [v["name"] for v in crd["spec"]["versions"]] == [_names.VERSION]
    assert _names.API_VERSION == f"{_names.GROUP}/{_names.VERSION}"


def test_the_manifest_model_and_the_launcher_use_the_shared_names() -> None:
    assert jobspec.API_VERSION == _names.API_VERSION and jobspec.KIND == _names.KIND
    for key in ("ENV_TF_CONFIG", "ENV_RANK", "ENV_TOKEN", "ENV_RESTART_ATTEMPT"):
        assert getattr(jobspec, key) == getattr(_names, key)
    assert set(_plan._CLEARED_ENV) == {
        _names.ENV_TF_CONFIG,
        _names.ENV_RANK,
        _names.ENV_WORLD_SIZE,
        _names.ENV_LOCAL_RANK,
        _names.ENV_LOCAL_WORLD_SIZE,
        _names.ENV_MASTER_ADDR,
        _names.ENV_MASTER_PORT,
    }


def test_the_shared_names_import_nothing() -> None:
    """strategyjob.report and the operator import it: it must cost nothing to import."""
    tree = ast.parse((ROOT / "sdk" / "strategyjob" / "_names.py").read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]
    assert [ast.unparse(n) for n in imports] == ["from __future__ import annotations"]
