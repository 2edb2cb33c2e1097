"""The launcher's terminal output: replica lines prefixed with their role and
index, and (on a TTY) one live status line kept below them."""

from __future__ import annotations

import json
import threading
from typing import Any, TextIO

from strategyjob._history import MetricHistory

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


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def format_report(record: dict[str, Any] | None) -> str:
    """A progress report of ``strategyjob.report`` as ``step 50/200 (25%) loss=0.31``."""
    if not record:
        return ""
    step, total = record.get("step"), record.get("totalSteps")
    text = f"step {step}"
    if total:
        text += f"/{total}"
        if isinstance(step, int | float):  # a record may carry totalSteps without a step
            text += f" ({min(100.0, 100.0 * step / total):.0f}%)"
    metrics = record.get("metrics") or {}
    return " ".join([text, *(f"{k}={_short(v)}" for k, v in metrics.items())])


class ProgressFile:
    """Reads the JSON lines the leader's ``strategyjob.report`` appends; keeps the last, and
    every report's metrics in :attr:`history`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._offset = 0
        self._partial = ""
        self.last: dict[str, Any] | None = None
        self.history = MetricHistory()

    def poll(self) -> dict[str, Any] | None:
        try:
            with open(self.path, encoding="utf-8") as f:
                f.seek(self._offset)
                chunk = f.read()
                self._offset = f.tell()
        except OSError:
            return self.last
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()  # an unfinished line waits for the next poll
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                self.last = record
                if "points" in record:
                    self.history.add_points(record["points"])
                elif isinstance(record.get("metrics"), dict):  # a reporter without points
                    self.history.add(record["step"], record["metrics"])
        return self.last
