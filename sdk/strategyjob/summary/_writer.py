"""``tf.summary.SummaryWriter``: event files TensorBoard reads, as TFRecords (each event
framed by its length and masked CRC32C checksums, computed by ``tensorboardX``) of
``tensorboardX``'s ``Event`` protocol buffers; the summaries themselves are TensorFlow 2's
(a tensor with its plugin's metadata), so TensorBoard shows them as it shows
``tf.summary``'s."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import socket
import struct
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

from strategyjob._progress import announce_logdir
from strategyjob.summary._leader import this_process_writes
from strategyjob.summary._state import STATE


class SummaryWriter:
    """Where summaries go (``tf.summary.SummaryWriter``); made by :func:`create_file_writer`
    or :func:`create_noop_writer`, never directly."""

    def set_as_default(self, step: Any = None) -> None:
        """Make this the default writer for the rest of the program (and ``step`` the
        default step, when given)."""
        with STATE.lock:
            STATE.writer = self
            if step is not None:
                STATE.step = step

    @contextlib.contextmanager
    def as_default(self, step: Any = None) -> Iterator[SummaryWriter]:
        """Make this the default writer (and ``step`` the default step) inside the block;
        the writer is flushed when the block ends, as TensorFlow's is."""
        with STATE.lock:
            old_writer, old_step = STATE.writer, STATE.step
            STATE.writer = self
            if step is not None:
                STATE.step = step
        try:
            yield self
        finally:
            with STATE.lock:
                STATE.writer = old_writer
                if step is not None:
                    STATE.step = old_step
            self.flush()

    def init(self) -> None:
        """Nothing to do: the file is created with the writer (TF's ``init`` op)."""

    def flush(self) -> None:
        """Write what is queued to the event file now."""

    def close(self) -> None:
        """Flush, and write nothing more."""

    def write(self, tag: str, value: Any, step: int) -> bool:
        """Append one ``Summary.Value`` at ``step``; True when written. (Used by the
        summary functions; users call :func:`scalar` and the like.)"""
        return False


class _NoopWriter(SummaryWriter):
    """``create_noop_writer()``, and every writer of a process that does not write."""


class _FileWriter(SummaryWriter):
    """One event file, written in the caller's thread: summaries queue in memory and go to
    the file once ``max_queue`` wait or ``flush_secs`` have passed since the last write, on
    :meth:`flush`, at the end of ``as_default`` and at exit (no thread, no pickling: a
    summary costs what building its protocol buffer does)."""

    _serial = itertools.count()

    def __init__(self, logdir: str, max_queue: int, flush_secs: float, suffix: str) -> None:
        from tensorboardX.proto.event_pb2 import Event

        os.makedirs(logdir, exist_ok=True)
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
            f"{os.getpid()}.{next(self._serial)}{suffix}"
        )
        self.logdir = logdir
        self.path = os.path.join(logdir, name)
        self._file = open(self.path, "ab")
        first = Event(wall_time=time.time(), file_version="brain.Event:2")
        self._queue: list[bytes] = [first.SerializeToString()]
        self._max_queue = max(1, max_queue)
        self._flush_secs = flush_secs
        self._flushed_at = time.monotonic()
        self._closed = False
        self._last_step: dict[str, int] = {}
        self._lock = threading.Lock()
        _OPEN.add(self)

    def flush(self) -> None:
        """Write the queue and hand the file to the disk (``fsync``)."""
        with self._lock:
            self._write_queue(sync=True)

    def _write_queue(self, sync: bool = False) -> None:
        """Append the queued events as TFRecords: the length and its masked CRC32C, the
        event and its masked CRC32C (what TensorBoard's reader checks)."""
        if self._closed:
            return
        from tensorboardX.record_writer import masked_crc32c

        chunks = []
        for record in self._queue:
            header = struct.pack("<Q", len(record))
            chunks += [header, struct.pack("<I", masked_crc32c(header))]
            chunks += [record, struct.pack("<I", masked_crc32c(record))]
        self._file.write(b"".join(chunks))
        self._queue.clear()
        self._file.flush()  # to the OS: a reader sees it, a crash of the process loses none
        if sync:
            os.fsync(self._file.fileno())
        self._flushed_at = time.monotonic()

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._write_queue(sync=True)
                self._file.close()
                self._closed = True

    def write(self, tag: str, value: Any, step: int) -> bool:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary

        with self._lock:
            if self._closed:
                _warn_once(
                    ("closed", self.logdir),
                    f"strategyjob.summary: the writer of {self.logdir} is closed; "
                    f"summary {tag!r} at step {step} is not written",
                )
                return False
            last = self._last_step.get(tag)
            if last is not None and step < last:
                _warn_once(
                    ("backwards", self.logdir, tag),
                    f"strategyjob.summary: {tag!r} at step {step} comes after step {last} in "
                    f"{self.logdir}; TensorBoard draws the curve back from there (a resumed job "
                    "should go on from its checkpoint's step, e.g. "
                    "summary.experimental.set_step(optimizer.iterations))",
                )
            self._last_step[tag] = step
            value.tag = tag
            event = Event(wall_time=time.time(), step=step, summary=Summary(value=[value]))
            self._queue.append(event.SerializeToString())
            due = time.monotonic() - self._flushed_at >= self._flush_secs
            if len(self._queue) >= self._max_queue or due:
                self._write_queue()
        return True


#: Every open file writer, flushed at exit as TensorFlow flushes its writers.
_OPEN: weakref.WeakSet[_FileWriter] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    for writer in list(_OPEN):
        with contextlib.suppress(Exception):
            writer.close()


_WARNED: set[tuple[str, ...]] = set()


def _warn_once(key: tuple[str, ...], text: str, stacklevel: int = 5) -> None:
    """Warn once per ``key``; ``stacklevel`` 5 points at the caller of ``scalar`` and the like
    (through their value builder or the writer's ``write``)."""
    if key not in _WARNED:
        _WARNED.add(key)
        warnings.warn(text, RuntimeWarning, stacklevel=stacklevel)


def create_file_writer(
    logdir: str | os.PathLike[str],
    max_queue: int | None = None,
    flush_millis: int | None = None,
    filename_suffix: str | None = None,
    name: str | None = None,
    experimental_trackable: bool = False,
) -> SummaryWriter:
    """``tf.summary.create_file_writer``: a writer of event files in ``logdir`` (made if
    missing). Queued summaries are written at most ``flush_millis`` (2 minutes) later, or
    once ``max_queue`` (10) are waiting. ``name`` and ``experimental_trackable`` are
    TensorFlow's graph details, accepted and unused.

    In a job, only the chief (else worker 0) and an evaluator write; on the other processes
    this returns a writer that writes nothing and makes no file. A ``logdir`` that cannot be
    written gives one warning and such a writer too: summaries never stop training."""
    del name, experimental_trackable
    if not this_process_writes():
        return _NoopWriter()
    path = os.fspath(logdir)
    if not isinstance(path, str) or not path:
        raise ValueError(f"logdir must be a non-empty path (got {logdir!r})")
    try:
        writer = _FileWriter(
            path,
            10 if max_queue is None else int(max_queue),
            120.0 if flush_millis is None else flush_millis / 1000,
            ".v2" if filename_suffix is None else filename_suffix,
        )
    except OSError as e:
        _warn_once(
            ("logdir", path),
            f"strategyjob.summary: cannot write summaries to {path} ({e.strerror or e}); "
            "training goes on without them. Give create_file_writer a directory this "
            "process can write.",
            stacklevel=3,
        )
        return _NoopWriter()
    announce_logdir(path)  # the leader's reports name it: `strategyjob tensorboard NAME`
    return writer


def create_noop_writer() -> SummaryWriter:
    """``tf.summary.create_noop_writer``: a writer that writes nothing (a placeholder where
    code expects one)."""
    return _NoopWriter()
