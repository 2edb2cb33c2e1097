"""A SIGTERM during a bound model's ``fit``: every worker backs up at the same batch and exits.

The project's ``PreemptionCheckpointHandler`` does the agreeing and exiting: its
``save_checkpoint_if_preempted`` is called at each trained batch's end on every worker (one
4-byte all-reduce in flight during the next step), and when any worker was sent SIGTERM, all of
them call ``save`` (the ``BackupAndRestore`` backup, ``_callbacks``) after the same batch, then
exit with 143, which the ``ExitCode`` restart policy retries. TF's Keras 2 offers this as
``BackupAndRestore(save_before_preemption=True)``; Keras 3 has no such argument, so under
``MultiWorkerMirroredStrategy`` every ``BackupAndRestore`` does it.

The handler only lives for the ``fit`` call: :meth:`PreemptionWatch.close` gives SIGTERM its
previous handler back and, if a SIGTERM came too late to be acted on (after the last batch),
sends it again, so that the process still stops as it was told to.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from strategyjob.train.checkpoint import Checkpoint
from strategyjob.train.preemption import (
    PREEMPTION_EXIT_CODE,
    PreemptionCheckpointHandler,
    TerminationConfig,
)

__all__ = ["PreemptionWatch"]


class PreemptionWatch:
    """For one ``fit``: SIGTERM on any worker makes every worker call ``save`` after the same
    batch, then exit 143. Create it on every worker, in the main thread (Python's signals)."""

    def __init__(self, strategy: Any, save: Callable[[], None]) -> None:
        self._previous = signal.getsignal(signal.SIGTERM)
        self._noticed = False
        self._acted = False
        # the handler restores and saves a Checkpoint; here it tracks nothing and saves through
        # save_fn, so its directory stays empty (removed at close)
        self._scratch = tempfile.mkdtemp(prefix="strategyjob-keras-preemption-")
        self._handler = PreemptionCheckpointHandler(
            strategy.cluster_resolver,
            Checkpoint(),
            self._scratch,
            TerminationConfig(exit_fn=self._exit, save_fn=save),
        )
        installed = signal.getsignal(signal.SIGTERM)
        assert callable(installed)

        def on_sigterm(signum: int, frame: Any) -> None:
            self._noticed = True
            installed(signum, frame)

        signal.signal(signal.SIGTERM, on_sigterm)

    @staticmethod
    def possible() -> bool:
        """Whether SIGTERM can be watched here: Python handles signals in the main thread."""
        return threading.current_thread() is threading.main_thread()

    def after_batch(self) -> None:
        """At a trained batch's end, on every worker: save and exit if any worker was told to
        stop (the answer of the agreement started at the previous batch's end)."""
        self._handler.save_checkpoint_if_preempted()

    def _exit(self) -> NoReturn:
        self._acted = True
        sys.exit(PREEMPTION_EXIT_CODE)

    def close(self) -> None:
        """SIGTERM's previous handler back; a notice not acted on is delivered to it again."""
        signal.signal(signal.SIGTERM, self._previous)
        shutil.rmtree(self._scratch, ignore_errors=True)
        if self._noticed and not self._acted:
            os.kill(os.getpid(), signal.SIGTERM)
