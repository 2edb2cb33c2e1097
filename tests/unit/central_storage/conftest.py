from __future__ import annotations

import pytest
import strategyjob
from strategyjob import _context


@pytest.fixture(autouse=True)
def _isolated_context():
    """Every test starts and ends at top level (no scope left open by a failed test)."""
    _context._reset_for_tests()
    yield
    _context._reset_for_tests()


@pytest.fixture
def css():
    return strategyjob.CentralStorageStrategy(["cpu:0", "cpu:1"])
