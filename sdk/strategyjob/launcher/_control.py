"""Resizing a job that ``strategyjob run`` runs, from another terminal (issue 30):
``strategyjob scale NAME --replicas N --local``.

The running launcher keeps a directory per job, ``<tmp>/strategyjob-runs/<job>/``, with its pid.
The command writes a request there (one JSON file, renamed into place whole) and waits for the
launcher's answer, which the launcher writes once it has acted (or refused) at its next status
refresh (every 0.5 s). Files, not a socket: nothing listens, any user who can run the job can
read what it did, and a launcher that died leaves a pid that no longer runs, which the command
recognises.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

#: Where the launchers' control directories live (one per running job name; the directory
#: goes when the last run ends).
RUNS_DIR = Path(tempfile.gettempdir()) / "strategyjob-runs"
_REQUEST, _ANSWER, _PID = "request.json", "answer.json", "pid"


def run_dir(job_name: str) -> Path:
    return RUNS_DIR / job_name


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _running_pid(directory: Path) -> int | None:
    try:
        pid = int((directory / _PID).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) else None


def _write_whole(path: Path, data: dict[str, object]) -> None:
    """Write ``path`` so that a reader sees all of it or nothing (a rename)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(data), encoding="utf-8")
    partial.replace(path)


@dataclass(frozen=True)
class ResizeRequest:
    id: str
    replicas: object  # what the command was given: the launcher checks it


class ResizeInbox:
    """The launcher's side: its control directory and the requests that arrive there."""

    def __init__(self, job_name: str) -> None:
        self.dir = run_dir(job_name)
        self.dir.mkdir(parents=True, exist_ok=True)
        other = _running_pid(self.dir)
        #: False when another live launcher runs a job of this name: that one is resized.
        self.owned = other is None or other == os.getpid()
        if self.owned:
            (self.dir / _REQUEST).unlink(missing_ok=True)
            (self.dir / _PID).write_text(str(os.getpid()), encoding="utf-8")

    def take(self) -> ResizeRequest | None:
        """The request waiting, if any (taken: it is answered once)."""
        if not self.owned:
            return None
        path = self.dir / _REQUEST
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        path.unlink(missing_ok=True)
        if not isinstance(raw, dict):
            return None
        return ResizeRequest(str(raw.get("id")), raw.get("replicas"))

    def answer(self, request: ResizeRequest, ok: bool, message: str) -> None:
        _write_whole(self.dir / _ANSWER, {"id": request.id, "ok": ok, "message": message})

    def close(self) -> None:
        """Remove this run's directory, and the runs' directory when no other run has one."""
        if self.owned and _running_pid(self.dir) == os.getpid():
            shutil.rmtree(self.dir, ignore_errors=True)
            try:
                self.dir.parent.rmdir()
            except OSError:  # another run's directory is there
                pass


def request_resize(job_name: str, replicas: int, timeout: float = 120.0) -> tuple[bool, str]:
    """Ask the launcher running ``job_name`` for ``replicas`` workers and wait for its answer:
    (done, the launcher's line, or why nothing was asked)."""
    directory = run_dir(job_name)
    if _running_pid(directory) is None:
        return False, (
            f"no job named {job_name} runs under strategyjob run on this machine (looked in "
            f"{directory}); start it with strategyjob run, or leave out --local to resize a "
            "job on the cluster"
        )
    request_id = uuid.uuid4().hex
    _write_whole(directory / _REQUEST, {"id": request_id, "replicas": replicas})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            answer = json.loads((directory / _ANSWER).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            answer = None
        if isinstance(answer, dict) and answer.get("id") == request_id:
            return bool(answer.get("ok")), str(answer.get("message"))
        if _running_pid(directory) is None:
            return False, f"the strategyjob run of {job_name} ended before it answered"
        time.sleep(0.1)
    return False, f"strategyjob run of {job_name} did not answer within {timeout:.0f} s"
