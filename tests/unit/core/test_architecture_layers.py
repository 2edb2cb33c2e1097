"""docs/contributing/architecture.md's table of the SDK's layers says what the import contract
enforces.

The "SDK layers" contract of pyproject.toml (``lint-imports``) is the source of truth; the
document lists the same layers bottom-up. Every module the contract names must be in the table,
in a row no lower than that of any module the contract puts under it.
"""

from __future__ import annotations

import itertools
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CONTRACT = "The SDK's layers import one way"


def contract_layers() -> list[list[str]]:
    """The contract's layers, top first, each a list of module names."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["name"].startswith(CONTRACT)]
    return [[name.strip() for name in layer.split("|")] for layer in layers]


def table_rows() -> list[str]:
    """The module cells of the document's layer table, bottom layer first."""
    text = (ROOT / "docs" / "contributing" / "architecture.md").read_text()
    section = text.split("## SDK layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]  # no header
    return [row.split("|")[2] for row in rows]


def row_of(module: str, rows: list[str]) -> int | None:
    pattern = re.compile(rf"`{re.escape(module)}(\.py|/[^`]*)?`")
    return next((i for i, cells in enumerate(rows) if pattern.search(cells)), None)


def test_the_document_lists_the_contracts_layers_in_its_order() -> None:
    rows = table_rows()
    spans = []
    for layer in reversed(contract_layers()):  # bottom first, as the table
        found = {module: row_of(module, rows) for module in layer}
        missing = [module for module, row in found.items() if row is None]
        assert not missing, f"docs/contributing/architecture.md's layer table lacks {missing}"
        placed = [row for row in found.values() if row is not None]
        spans.append((min(placed), max(placed), layer))
    for (_, highest, below), (lowest, _, above) in itertools.pairwise(spans):
        assert highest <= lowest, (
            f"docs/contributing/architecture.md lists {below} in a row above {above}, "
            "which the import contract puts over them"
        )


def test_the_check_finds_a_module_by_its_spelling_in_the_table() -> None:
    rows = [" `errors`, `_names.py`, `jobspec/` ", " `client/` "]
    assert [row_of(m, rows) for m in ("_names", "jobspec", "client", "nn")] == [0, 0, 1, None]
