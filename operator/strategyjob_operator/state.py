"""What the kopf handlers of one operator process share (:class:`OperatorState`), and the one
declared way to put a fresh one in place (:func:`installed`): kopf calls its handlers with no
context of ours, so they find the state here, and tests install their own instead of swapping
a module global."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Iterator
from typing import Any

from strategyjob_operator.reconcile import OperatorSettings, Reconciler

#: A job's loop: (plural, namespace, name).
JobRef = tuple[str, str, str]


class OperatorState:
    """What the handlers share within one operator process."""

    def __init__(self, settings: OperatorSettings | None = None) -> None:
        self.settings = settings or OperatorSettings()
        self.reconciler: Reconciler | None = None
        #: The reconciler of TFJobs (``STRATEGYJOB_SERVE_TFJOBS``), sharing the API client
        #: and the pod cache with :attr:`reconciler`; None when TFJobs are not served.
        self.tfjob_reconciler: Reconciler | None = None
        #: Per (plural, namespace, name): a StrategyJob and a TFJob may share a name.
        self.wakeups: dict[JobRef, asyncio.Event] = {}
        #: The uid of the job whose daemon runs, per (plural, namespace, name): the daemon of
        #: a job that was deleted, or replaced by a namesake, sees it is gone and ends.
        self.daemons: dict[JobRef, str] = {}
        self.metrics_server: Any = None
        #: Set to stop ``kopf.run`` (see :func:`stopping.give_up`); ``__main__`` passes it as
        #: stop_flag.
        self.stop_flag: concurrent.futures.Future[None] = concurrent.futures.Future()
        #: Why the operator gave up, for ``__main__`` to print once kopf has stopped.
        self.fatal: str | None = None
        #: The room of each ResourceQuota seen, per (namespace, name) (``quota_changed``).
        self.quotas: dict[tuple[str, str], dict[str, Any]] = {}


_current = OperatorState()


def current() -> OperatorState:
    """The state the handlers use now: the process's, or the one :func:`installed` put."""
    return _current


@contextlib.contextmanager
def installed(state: OperatorState | None = None) -> Iterator[OperatorState]:
    """Make ``state`` (a fresh one by default) the handlers' state while the block runs, then
    put the previous one back: a test's handlers and job loops see only its own jobs."""
    global _current
    previous, _current = _current, state or OperatorState()
    try:
        yield _current
    finally:
        _current = previous
