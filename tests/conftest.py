"""What the whole suite shares: the one kind cluster of a session (``tests.support.kind``),
used by the ``kind`` integration modules and the end-to-end suite, which run last, and its
timings at the end of the run's output."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.kind import MEASURED, kind_cluster  # noqa: F401


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The kind and end-to-end tests last (in their order): ``tools/test.sh`` loads the images
    into the kind cluster while the others run. Just before them, the ``signal_timing`` tests
    (how soon a process stops after a signal): by then that load, which takes both cores for
    about six minutes, is over."""
    e2e = Path(__file__).parent / "e2e"

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("kind") is not None or e2e in Path(item.fspath).parents:
            return 2
        return 1 if item.get_closest_marker("signal_timing") is not None else 0

    items.sort(key=rank)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The kind tests' timings (cluster creation, image loads, operator start, jobs)."""
    if MEASURED:
        terminalreporter.section("kind timings")
        for line in MEASURED:
            terminalreporter.write_line(line)
