"""The launcher's terminal output: replica lines prefixed with their role and
index, and (on a TTY) a live block kept below them: the status line, and above it what
``--curves`` draws."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from strategyjob._history import MetricHistory


def _terminal_columns() -> int:
    return shutil.get_terminal_size().columns


def _erase(rows: int) -> str:
    """Back to the start of a block ``rows`` rows high that ends at the cursor, erased (one
    row or none: the cursor's line)."""
    return f"\r\x1b[{rows - 1}A\x1b[J" if rows > 1 else "\r\x1b[K"


class Console:
    """Thread-safe writer shared by the replicas' reader threads and the launcher.

    The live block (on a TTY only) is written last, without a final newline, so the cursor
    stays on its last row: a replica line erases it (back up as many rows as it took, a
    wrapped line counting each of its rows, ``columns`` giving the terminal's width), takes
    its place, and the block is written again below it."""

    def __init__(
        self, out: TextIO, live_status: bool, columns: Callable[[], int] = _terminal_columns
    ) -> None:
        self._out = out
        self._live = live_status
        self._columns = columns
        self._above: list[str] = []  # the block's lines above the status line
        self._status = ""
        self._rows = 0  # the rows the block takes on the screen now (0: none shown)
        self._lock = threading.Lock()
        self._closed = False  # the reader went away (e.g. `strategyjob run ... | head`)

    @property
    def live(self) -> bool:
        """Whether the live block is drawn (stdout is a terminal, and not ``--no-status``)."""
        return self._live

    def _write(self, text: str) -> None:
        if self._closed:
            return
        try:
            self._out.write(text)
            self._out.flush()
        except (BrokenPipeError, ValueError, OSError):
            # Keep supervising the job even when nobody reads its output any more.
            self._closed = True

    def _height(self, lines: Sequence[str]) -> int:
        columns = max(1, self._columns())
        return sum(max(1, -(-len(line) // columns)) for line in lines)

    def _block(self) -> str:
        """The block's text; sets :attr:`_rows` to the rows it takes."""
        lines = [*self._above, self._status]
        self._rows = self._height(lines)
        return "\n".join(lines)

    def replica_line(self, name: str, line: str) -> None:
        self.line(f"[{name}] {line}")

    def line(self, text: str) -> None:
        with self._lock:
            if self._rows:
                self._write(_erase(self._rows) + text + "\n" + self._block())
            else:
                self._write(text + "\n")

    def status(self, text: str, above: Sequence[str] = ()) -> None:
        """Replace the live block: the ``above`` lines (one row each at most, or they wrap),
        then the status line ``text``. Only the status line is rewritten when ``above`` is
        unchanged. A no-op unless live status is on."""
        if not self._live:
            return
        with self._lock:
            if self._rows and list(above) == self._above:
                erase = _erase(self._height([self._status]))
                self._status = text
                self._rows = self._height([*self._above, text])
                self._write(erase + text)
                return
            erase = _erase(self._rows)  # nothing shown yet: the line the cursor is on
            self._above, self._status = list(above), text
            self._write(erase + self._block())

    def clear_status(self) -> None:
        """Erase the live block (before a summary, which stays below the replicas' lines)."""
        with self._lock:
            if self._rows:
                self._write(_erase(self._rows))
            self._above, self._status, self._rows = [], "", 0


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
