"""Shared fixtures of the unit tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _reset_strategy_state() -> Iterator[None]:
    """Every test starts and ends with no strategy scope open on the test thread.

    A failing test can leave a ``scope()`` or ``experimental_set_strategy`` behind; resetting
    keeps that failure from cascading. Torch-free tests never load the contexts module, so it
    is only touched when something imported it.
    """
    context = sys.modules.get("strategyjob._context")
    if context is not None:
        context._reset_for_tests()
    yield
    context = sys.modules.get("strategyjob._context")
    if context is not None:
        context._reset_for_tests()
