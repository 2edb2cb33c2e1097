"""What the whole suite shares: the one kind cluster of a session (``tests.support.kind``),
used by the ``kind`` integration modules and the end-to-end suite, which run last, and its
timings at the end of the run's output."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.kind import MEASURED, kind_cluster  # noqa: F401


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The kind and end-to-end tests last (in their order): ``tools/test.sh`` loads the images
    into the kind cluster while the others run."""
    e2e = Path(__file__).parent / "e2e"

    def on_kind(item: pytest.Item) -> bool:
        return item.get_closest_marker("kind") is not None or e2e in Path(item.fspath).parents

    items.sort(key=on_kind)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The kind tests' timings (cluster creation, image loads, operator start, jobs)."""
    if MEASURED:
        terminalreporter.section("kind timings")
        for line in MEASURED:
            terminalreporter.write_line(line)
