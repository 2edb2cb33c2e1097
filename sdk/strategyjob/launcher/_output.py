"""The launcher's terminal output: replica lines prefixed with their role and
index, and (on a TTY) one live status line kept below them."""

from __future__ import annotations

import threading
from typing import TextIO

_CLEAR_LINE = "\r\x1b[K"


class Console:
    """Thread-safe writer shared by the replicas' reader threads and the launcher."""

    def __init__(self, out: TextIO, live_status: bool) -> None:
        self._out = out
        self._live = live_status
        self._status = ""
        self._lock = threading.Lock()
        self._closed = False  # the reader went away (e.g. `strategyjob run ... | head`)

    def _write(self, text: str) -> None:
        if self._closed:
            return
        try:
            self._out.write(text)
            self._out.flush()
        except (BrokenPipeError, ValueError, OSError):
            # Keep supervising the job even when nobody reads its output any more.
            self._closed = True

    def replica_line(self, name: str, line: str) -> None:
        self.line(f"[{name}] {line}")

    def line(self, text: str) -> None:
        with self._lock:
            if self._live and self._status:
                self._write(_CLEAR_LINE + text + "\n" + self._status)
            else:
                self._write(text + "\n")

    def status(self, text: str) -> None:
        """Replace the live status line (no-op unless live status is on)."""
        if not self._live:
            return
        with self._lock:
            self._status = text
            self._write(_CLEAR_LINE + text)

    def clear_status(self) -> None:
        if not self._live:
            return
        with self._lock:
            if self._status:
                self._write(_CLEAR_LINE)
            self._status = ""


def format_elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{seconds:.1f}s"
