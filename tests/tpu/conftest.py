"""Fixtures of the TPUStrategy tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _destroy_the_process_group_it_started() -> Iterator[None]:
    """A test that builds a TPUStrategy in this process (local mode: a process group of one)
    leaves torch.distributed initialised, and a later test in the same pytest process that
    starts a cluster of its own would find it (``tests/multiprocess``). Destroy what the test
    initialised; a group that was there before it is left alone."""
    before = _initialized()
    yield
    if not before and _initialized():
        sys.modules["torch.distributed"].destroy_process_group()


def _initialized() -> bool:
    dist = sys.modules.get("torch.distributed")  # never imported by the torch-free tests
    return dist is not None and dist.is_available() and dist.is_initialized()
