"""``strategyjob tensorboard``: TensorBoard over a job's summaries (issue 31).

TensorBoard runs here, as a child process, over a local directory: the run's own logdir for
``strategyjob run`` (``--logdir``), or for a cluster job the copy of its leader's logdir that
:meth:`StrategyJobClient.copy_summaries` makes and refreshes while TensorBoard serves. It is
an extra (``pip install 'strategyjob[tensorboard]'``): without it the command says so in one
line, and ``--copy-only`` still copies.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

INSTALL = "pip install 'strategyjob[tensorboard]'"
#: How often a cluster job's copy is refreshed while TensorBoard serves it, by default.
DEFAULT_REFRESH_SECONDS = 30.0


def missing() -> str | None:
    """Why TensorBoard cannot be served here, or None when it can."""
    if importlib.util.find_spec("tensorboard") is None:
        return f"TensorBoard is not installed: {INSTALL} (or pip install tensorboard)"
    return None


def default_copy_dir(namespace: str, name: str) -> Path:
    """Where a cluster job's summaries are copied unless ``--copy-to`` says otherwise: kept
    across runs of the command, so the curves stay once the job's pods are gone."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "strategyjob" / "summaries" / namespace / name


def command(logdir: Path, port: int, host: str) -> list[str]:
    """TensorBoard's command line for ``logdir``."""
    return [
        sys.executable,
        "-m",
        "tensorboard.main",
        "--logdir",
        str(logdir),
        "--port",
        str(port),
        "--host",
        host,
    ]


def serve(
    logdir: Path,
    port: int,
    host: str,
    refresh: Callable[[], None] | None = None,
    every: float = DEFAULT_REFRESH_SECONDS,
) -> int:
    """Serve ``logdir`` until TensorBoard exits or the user interrupts (Ctrl-C: TensorBoard
    is stopped, never left behind), calling ``refresh`` every ``every`` seconds meanwhile.
    Returns TensorBoard's exit code (0 after an interrupt)."""
    print(f"TensorBoard over {logdir} at http://{host}:{port}/ (Ctrl-C stops it)", flush=True)
    child = subprocess.Popen(command(logdir, port, host))
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops TensorBoard too
    try:
        while True:
            try:
                return child.wait(timeout=every if refresh is not None else None)
            except subprocess.TimeoutExpired:
                assert refresh is not None
                refresh()
    except KeyboardInterrupt:
        return 0
    finally:
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
