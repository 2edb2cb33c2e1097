"""MkDocs hooks (``mkdocs.yml``): the pages generated from their one source, added to the site
at build time and never committed: the ``StrategyJob`` reference from the CRD, the command line
from its parser, every benchmark run from ``bench/README.md``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import cli_reference  # noqa: E402
import crd_reference  # noqa: E402

CRD = ROOT / "crds" / "strategyjob.dev_strategyjobs.yaml"


def generated_pages() -> dict[str, str]:
    """Site path -> Markdown of every generated page."""
    runs = (ROOT / "bench" / "README.md").read_text()
    runs = runs.replace("# Benchmarks\n", "# Every benchmark, every run\n", 1)
    return {
        "reference/strategyjob.md": crd_reference.render(crd_reference.load_crd(CRD)),
        "reference/cli.md": cli_reference.render(),
        "benchmarks/runs.md": runs,
    }


def on_files(files: Files, config: Any) -> Files:
    for path, text in generated_pages().items():
        files.append(File.generated(config, path, content=text))
    return files
