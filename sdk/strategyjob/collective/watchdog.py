"""A watchdog over waits that cannot be sliced: a lost or stuck peer ends the process with
its error.

Why: ``CollectiveGroup.wait`` polls a collective's ``Work`` in slices and checks the peers
between them, but DTensor's functional collectives (TPUStrategy's logical-device transfers)
are waited for by ``_c10d_functional.wait_tensor``, one blocking C++ call with no handle to
poll, which gloo ends only at its 30-minute timeout; a frozen peer held the survivor there.
No Python error can be raised into a thread blocked in C++, so, as torch's own NCCL watchdog
tears the process down on a failed collective, the watchdog prints the waiting thread's
stack and the error a sliced wait would raise (``UnavailableError`` naming the lost peer;
``DeadlineExceededError`` naming a stuck one, past ``timeout_seconds`` or the job's
stuck-peer bound), as an uncaught error would be printed, and ends the process with status 1.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

from strategyjob import errors

__all__ = ["BlockingWaitWatchdog"]

#: How often a wait in progress has its peers checked (a killed peer is found within it; a
#: frozen one after STRATEGYJOB_UNRESPONSIVE_PEER_SECONDS of silence).
TICK_SECONDS = 0.5


class PeerChecker(Protocol):
    """What the watchdog asks of a collective group (:class:`CollectiveGroup`)."""

    def lost_peer_error(self, what: str, waited: float) -> errors.OpError | None: ...

    def unsliced_wait(self, what: str) -> AbstractContextManager[None]: ...


class BlockingWaitWatchdog:
    """Checks ``group``'s peers while a thread is inside :meth:`watching`; a thread of its own,
    started at the first wait, so an unwatched wait costs two assignments."""

    def __init__(self, group: PeerChecker, what: str) -> None:
        self._group = group
        self._what = what
        self._waiter: tuple[int, float] | None = None  # (thread id, since when)
        self._thread: threading.Thread | None = None

    @contextmanager
    def watching(self) -> Iterator[None]:
        """Around one blocking wait of the calling thread (not reentrant: the innermost wins)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="wait-watchdog", daemon=True)
            self._thread.start()
        outer = self._waiter
        self._waiter = (threading.get_ident(), time.monotonic())
        try:
            with self._group.unsliced_wait(self._what):
                yield
        finally:
            self._waiter = outer

    def _watch(self) -> None:
        while True:
            time.sleep(TICK_SECONDS)
            waiter = self._waiter
            if waiter is None or time.monotonic() - waiter[1] < TICK_SECONDS:
                continue
            error = self._group.lost_peer_error(self._what, time.monotonic() - waiter[1])
            if error is not None and self._waiter is waiter:
                _end_process(error, waiter[0])


def _end_process(error: BaseException, thread_id: int) -> None:
    """Print ``error`` as Python prints an uncaught one raised where ``thread_id`` waits, and
    exit 1 at once (the waiting thread never returns, so nothing else could)."""
    frame = sys._current_frames().get(thread_id)  # noqa: SLF001  (where the thread waits)
    stack = traceback.format_stack(frame) if frame is not None else []
    kind = type(error)
    text = "".join(
        [
            "Traceback (most recent call last):\n",
            *stack,
            f"{kind.__module__}.{kind.__name__}: {error}\n",
        ]
    )
    try:
        sys.stdout.flush()
        sys.stderr.write(text)
        sys.stderr.flush()
    finally:
        os._exit(1)
