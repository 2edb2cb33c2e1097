"""The code blocks of the documentation, with what each says of itself.

Every ``python``, ``bash``/``sh`` and ``console`` block in ``docs/`` and the README carries, on
the line before its fence, an HTML comment (invisible on the site) that says how it is tested:

* ``<!-- snippet: run -->``: the test suite runs it (Python in a fresh interpreter, shell with
  ``bash -e`` in the repository root) and it must succeed;
* ``<!-- snippet: fragment -->``: part of a program whose other names are the reader's own
  (``model``, ``loader``): syntax-checked;
* ``<!-- snippet: not-here WHY -->``: a command that cannot run in the test suite (it needs a
  cluster, installs the package, or builds images): syntax-checked.

``--8<-- "path:start:end"`` lines (pymdownx.snippets) are replaced by the lines they include.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LANGUAGES = {"python": "python", "bash": "shell", "sh": "shell", "console": "shell"}
KINDS = ("run", "fragment", "not-here")
MARKER = re.compile(r"^<!-- snippet: (?P<kind>[a-z-]+)(?P<why>[^>]*)-->\s*$")
INCLUDE = re.compile(r'^--8<-- "(?P<path>[^":]+)(?::(?P<start>\d+):(?P<end>\d+))?"\s*$')


@dataclass(frozen=True)
class Snippet:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str  # "python" or "shell"
    kind: str | None  # None: unmarked
    why: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def expand(text: str, root: Path) -> str:
    """``text`` with each pymdownx include line replaced by what it includes."""
    out = []
    for line in text.splitlines():
        found = INCLUDE.match(line)
        if not found:
            out.append(line)
            continue
        lines = (root / found["path"]).read_text().splitlines()
        if found["start"]:
            lines = lines[int(found["start"]) - 1 : int(found["end"])]
        out.extend(lines)
    return "\n".join(out) + "\n"


def commands(console: str) -> str:
    """A console transcript's commands (its ``$ `` lines), without their output."""
    return "\n".join(line[2:] for line in console.splitlines() if line.startswith("$ ")) + "\n"


def snippets(page: Path, root: Path) -> Iterator[Snippet]:
    lines = page.read_text().splitlines()
    index = 0
    while index < len(lines):
        fence = lines[index]
        if not fence.startswith("```"):
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        language = fence[3:].strip()
        if language in LANGUAGES:
            marker = MARKER.match(lines[index - 1]) if index else None
            code = expand("\n".join(lines[index + 1 : end]), root)
            if language == "console":
                code = commands(code)
            yield Snippet(
                page=page.relative_to(root),
                line=index + 1,
                language=LANGUAGES[language],
                kind=marker["kind"] if marker else None,
                why=marker["why"].strip() if marker else "",
                code=code,
            )
        index = end + 1


def pages(root: Path) -> list[Path]:
    """The README and every page of the site's sources."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
