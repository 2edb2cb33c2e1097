"""The chief's membership source on a real cluster: ``STRATEGYJOB_CLUSTER_FILE``.

Whoever resizes the job (``strategyjob run``, later the operator) writes the cluster, a JSON like
TF_CONFIG's ``cluster`` (``{"chief": [...], "worker": [...], "ps": [...]}``; ``worker`` may be
``{index: address}`` for sparse indices), to this file; the chief's transport looks at it every
``POLL_SECONDS`` and re-reads it when it changed. Only ``worker`` is followed: the chief and ps
tasks of a running job do not change. Content that cannot be used is said once (one warning
per bad version of the file) and the last good workers are kept, so a half-written file never
resizes the job: writers write a temporary file and rename it over this one.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable

from strategyjob import _names
from strategyjob.ps import _membership

__all__ = ["POLL_SECONDS", "ClusterFile", "from_env"]

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0

_Version = tuple[int, int, int] | None  # (mtime_ns, size, inode); None: no file


class ClusterFile:
    """``poll()``: the workers the file names when it changed to usable content, else None."""

    def __init__(
        self,
        path: str,
        poll_seconds: float = POLL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self._poll_seconds = poll_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._next = 0.0
        self._seen: _Version | object = object()  # no version seen yet
        self._workers: dict[int, str] | None = None  # the last good ones

    def poll(self) -> dict[int, str] | None:
        with self._lock:
            now = self._clock()
            if now < self._next:
                return None
            self._next = now + self._poll_seconds
            version = self._version()
            if version == self._seen:
                return None
            self._seen = version
            try:
                if version is None:
                    raise ValueError("the file does not exist")
                with open(self.path, encoding="utf-8") as f:
                    workers = _membership.workers_of(json.load(f))
            except (OSError, ValueError) as exc:  # (json's errors are ValueErrors)
                kept = "the workers it has" if self._workers is None else sorted(self._workers)
                log.warning(
                    "%s=%s cannot be used: %s. The chief keeps %s; write the whole cluster "
                    "(a temporary file renamed over this one).",
                    _names.ENV_CLUSTER_FILE,
                    self.path,
                    exc,
                    kept,
                )
                return None
            if workers == self._workers:
                return None
            self._workers = workers
            return dict(workers)

    def _version(self) -> _Version:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)


def from_env() -> ClusterFile | None:
    """The file ``STRATEGYJOB_CLUSTER_FILE`` names, if set."""
    path = os.environ.get(_names.ENV_CLUSTER_FILE, "").strip()
    return ClusterFile(path) if path else None
