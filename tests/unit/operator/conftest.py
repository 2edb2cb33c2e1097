"""Shared fixtures of the operator's unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from strategyjob_operator import state


@pytest.fixture
def operator_state() -> Iterator[state.OperatorState]:
    """A fresh operator state, the one kopf's handlers and the job loops use during the test
    (:func:`state.installed`); the process's own is back afterwards."""
    with state.installed() as fresh:
        yield fresh
