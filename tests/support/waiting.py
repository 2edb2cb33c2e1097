"""Polling with a deadline: how tests wait for what they cannot be told about."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    what: str, predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.1
) -> Any:
    """Poll ``predicate`` until it returns something truthy and return that; fail naming
    ``what`` and the last value seen once ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
