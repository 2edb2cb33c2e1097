"""A command in a real pseudo-terminal, and the screen its output leaves: for tests of what
`strategyjob run` draws on a terminal (escape sequences only a terminal interprets)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
from collections.abc import Callable, Sequence

_CONTROL = re.compile(r"\x1b\[(\d*)([A-Za-z])|[\r\n]")


def run_in_terminal(
    argv: Sequence[str],
    env: dict[str, str],
    columns: int = 100,
    lines: int = 30,
    timeout: float = 60.0,
    seen: Callable[[str], object] | None = None,
) -> tuple[int, str]:
    """Run ``argv`` with a pseudo-terminal ``columns`` x ``lines`` as its stdout and stderr;
    its exit code and everything it wrote, given to ``seen`` too as it comes. Past ``timeout``
    s it gets SIGTERM (the launcher stops its replicas then) and the test fails."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    process = subprocess.Popen(argv, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if not ready:
                continue
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: the command closed the terminal
                break
            if not data:
                break
            chunks.append(data)
            if seen is not None:
                seen(b"".join(chunks).decode(errors="replace"))
    finally:
        os.close(leader)
        if time.monotonic() >= deadline:
            process.terminate()
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
    output = b"".join(chunks).decode()
    assert time.monotonic() < deadline, f"still running after {timeout} s:\n{output}"
    return code, output


def screen(text: str, columns: int) -> list[str]:
    """The rows ``text`` leaves on a terminal ``columns`` wide and high enough that nothing
    scrolls off: characters (a full row wraps at the next one, as terminals do), carriage
    return, newline, and the sequences the launcher writes: ``n A`` (up), ``K`` (erase the
    rest of the row) and ``J`` (erase the rest of the screen)."""
    rows: list[list[str]] = [[]]
    row = col = 0

    def put(char: str) -> None:
        nonlocal row, col
        if col >= columns:  # the pending wrap
            row, col = row + 1, 0
        while len(rows) <= row:
            rows.append([])
        cells = rows[row]
        cells.extend(" " * (col + 1 - len(cells)))
        cells[col] = char
        col += 1

    position = 0
    for match in _CONTROL.finditer(text):
        for char in text[position : match.start()]:
            put(char)
        position = match.end()
        if match.group(0) == "\r":
            col = 0
        elif match.group(0) == "\n":
            row, col = row + 1, 0
            while len(rows) <= row:
                rows.append([])
        elif match.group(2) == "A":
            row = max(0, row - int(match.group(1) or 1))
        elif match.group(2) in "KJ":
            del rows[row][col:]
            if match.group(2) == "J":
                del rows[row + 1 :]
        else:
            raise AssertionError(f"an escape sequence this screen does not know: {match[0]!r}")
    for char in text[position:]:
        put(char)
    return ["".join(cells).rstrip() for cells in rows]
