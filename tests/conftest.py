"""What the whole suite shares: the one kind cluster of a session (``tests.support.kind``),
used by the ``kind`` integration modules and the end-to-end suite, and its timings at the end
of the run's output."""

from __future__ import annotations

import pytest

from tests.support.kind import MEASURED, kind_cluster  # noqa: F401


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The kind tests' timings (cluster creation, image loads, operator start, jobs)."""
    if MEASURED:
        terminalreporter.section("kind timings")
        for line in MEASURED:
            terminalreporter.write_line(line)
