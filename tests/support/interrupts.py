"""A pytest plugin (``-p tests.support.interrupts``, in pyproject.toml's addopts) that makes a
SIGTERM stop the suite the way Ctrl-C does.

Python's default SIGTERM ends the process at once: no fixture finalizer runs, so a control
plane, an operator or a kind cluster started by a fixture would outlive pytest. Raising
KeyboardInterrupt instead lets pytest unwind as for Ctrl-C, every finalizer included. A second
SIGTERM while that unwinding runs is ignored (finalizers are bounded in time), so a supervisor
that repeats its SIGTERM does not cut a cleanup short; SIGKILL still ends pytest at once.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Any

import pytest

_previous = pytest.StashKey[Any]()


class _SigtermToInterrupt:
    """The SIGTERM handler: KeyboardInterrupt the first time, a note on stderr afterwards."""

    def __init__(self) -> None:
        self.received = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self.received:
            sys.stderr.write("SIGTERM again: already stopping; finishing the cleanup first\n")
            return
        self.received = True
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def pytest_configure(config: pytest.Config) -> None:
    """Install the handler (the main thread only can; a SIGTERM already ignored stays so)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_IGN:
        return
    config.stash[_previous] = signal.signal(signal.SIGTERM, _SigtermToInterrupt())


def pytest_unconfigure(config: pytest.Config) -> None:
    """Give SIGTERM back what it did before this session (nested sessions restore in turn)."""
    if _previous in config.stash:
        signal.signal(signal.SIGTERM, config.stash[_previous])
        del config.stash[_previous]
