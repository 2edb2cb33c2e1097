"""`strategyjob run` in the background, for tests that act on a job while it runs (freeze or
kill a replica once it has got somewhere) and time what it printed."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path


class Launch:
    """`strategyjob run` in the background: its output lines as they come, with their times;
    stopped (SIGTERM: it stops its replicas) if the test ends first."""

    def __init__(self, manifest: Path, env: dict[str, str], *extra: str) -> None:
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "strategyjob", "run", str(manifest), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    @property
    def text(self) -> list[str]:
        return [line for _, line in self.lines]

    @property
    def transcript(self) -> str:
        """Every line, each with its time since the first: whole in a failed assertion's
        message (pytest shortens a list there, not a string)."""
        start = self.lines[0][0] if self.lines else 0.0
        return "\n".join(f"{t - start:7.2f} {line}" for t, line in list(self.lines))

    def wait_line(self, prefix: str, timeout: float) -> float:
        """When the first line starting with ``prefix`` came, waiting for it at most
        ``timeout`` s (or until the launcher's output ends)."""
        deadline = time.monotonic() + timeout
        while True:
            ended = not self._reader.is_alive()
            found = [t for t, line in list(self.lines) if line.startswith(prefix)]
            if found:
                return found[0]
            if ended or time.monotonic() > deadline:
                raise AssertionError(f"no line {prefix!r} within {timeout} s:\n{self.transcript}")
            time.sleep(0.05)

    def finish(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"still running after {timeout} s:\n{self.transcript}") from None
        self._reader.join(5)
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
