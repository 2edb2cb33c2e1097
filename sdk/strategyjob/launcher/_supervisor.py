"""Starting, watching and stopping the replicas' local processes.

:class:`ProcessSupervisor` is the seam between the launcher's loop and the
operating system; :class:`LocalProcessSupervisor` implements it with one process
group per replica, so stopping a replica also stops whatever it spawned.
"""

from __future__ import annotations

import abc
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from strategyjob.errors import exit_error_line
from strategyjob.launcher._decision import ReplicaExit, ReplicaKey
from strategyjob.launcher._output import Console
from strategyjob.launcher._plan import ReplicaLaunch

#: Exit code reported for a command that could not be started (as a shell does).
COMMAND_NOT_STARTED = 127
_READER_FLUSH_SECONDS = 2.0
#: The last output lines kept per replica to find the error it ended with (a traceback's
#: frames and its exception line; the kubelet keeps 80 for a failed container).
_TAIL_LINES = 80


class ProcessSupervisor(abc.ABC):
    """Runs replica processes and reports how they ended."""

    @abc.abstractmethod
    def start(self, launch: ReplicaLaunch) -> None:
        """Start (or restart) ``launch``'s replica. A command that cannot be started
        is reported as an exit with code 127, not raised."""

    @abc.abstractmethod
    def exits(self) -> dict[ReplicaKey, ReplicaExit]:
        """The replicas of the current processes that have exited, and how."""

    @abc.abstractmethod
    def running(self) -> list[ReplicaKey]:
        """The replicas started and not yet exited."""

    @abc.abstractmethod
    def wait(self, timeout: float) -> None:
        """Block until a replica exits, :meth:`wake` is called, or ``timeout`` passes."""

    @abc.abstractmethod
    def wake(self) -> None:
        """Make a pending :meth:`wait` return now (safe from a signal handler)."""

    @abc.abstractmethod
    def stop(
        self, keys: Iterable[ReplicaKey] | None = None, grace: float = 10.0
    ) -> set[ReplicaKey]:
        """Stop the running replicas among ``keys`` (all by default): SIGTERM to each
        replica's process, SIGKILL to its process group once it exited or after ``grace``
        seconds. Returns the replicas stopped."""

    @abc.abstractmethod
    def kill_all(self) -> None:
        """SIGKILL every replica now, without a grace period (safe from a signal handler)."""

    @abc.abstractmethod
    def forget(self, keys: Iterable[ReplicaKey] | None = None) -> None:
        """Drop the (stopped) replicas among ``keys`` (all by default) and their exits: before
        the job is started again, or the workers a resize removed."""


@dataclass
class _Replica:
    launch: ReplicaLaunch
    process: subprocess.Popen[bytes] | None
    exit: ReplicaExit | None = None
    threads: list[threading.Thread] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=_TAIL_LINES))


class LocalProcessSupervisor(ProcessSupervisor):
    """Each replica in its own session and process group, its stdout and stderr
    streamed line by line to the console as ``[<type>-<index>] <line>``."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._replicas: dict[ReplicaKey, _Replica] = {}
        self._changed = threading.Event()
        self._lock = threading.Lock()
        self._sequence = 0

    @property
    def pids(self) -> dict[ReplicaKey, int]:
        return {k: r.process.pid for k, r in self._replicas.items() if r.process is not None}

    def start(self, launch: ReplicaLaunch) -> None:
        try:
            process = subprocess.Popen(
                list(launch.argv),
                cwd=launch.cwd,
                env=dict(launch.env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            self._console.replica_line(
                launch.name, f"strategyjob: cannot start {launch.argv[0]!r}: {e}"
            )
            replica = _Replica(launch, None)
            self._replicas[launch.key] = replica
            self._record_exit(replica, COMMAND_NOT_STARTED)
            return
        replica = _Replica(launch, process)
        self._replicas[launch.key] = replica
        reader = threading.Thread(
            target=self._read_output, args=(replica,), name=f"output-{launch.name}", daemon=True
        )
        waiter = threading.Thread(
            target=self._wait_exit, args=(replica, reader), name=f"wait-{launch.name}", daemon=True
        )
        replica.threads = [reader, waiter]
        reader.start()
        waiter.start()

    def _read_output(self, replica: _Replica) -> None:
        assert replica.process is not None and replica.process.stdout is not None
        name = replica.launch.name
        with replica.process.stdout as stream:
            for raw in iter(stream.readline, b""):
                line = raw.decode(errors="replace").rstrip("\r\n")
                replica.tail.append(line)
                self._console.replica_line(name, line)

    def _wait_exit(self, replica: _Replica, reader: threading.Thread) -> None:
        assert replica.process is not None
        returncode = replica.process.wait()
        # Let the last lines (a traceback) reach the console before the exit is seen.
        reader.join(_READER_FLUSH_SECONDS)
        self._record_exit(replica, returncode)

    def _record_exit(self, replica: _Replica, returncode: int) -> None:
        with self._lock:
            self._sequence += 1
            error = exit_error_line(returncode, list(replica.tail))
            replica.exit = ReplicaExit(returncode, self._sequence, error)
        replica.done.set()
        self._changed.set()

    def exits(self) -> dict[ReplicaKey, ReplicaExit]:
        with self._lock:
            return {k: r.exit for k, r in self._replicas.items() if r.exit is not None}

    def running(self) -> list[ReplicaKey]:
        with self._lock:
            return [k for k, r in self._replicas.items() if r.exit is None]

    def wait(self, timeout: float) -> None:
        self._changed.wait(timeout)
        self._changed.clear()

    def wake(self) -> None:
        self._changed.set()

    def stop(
        self, keys: Iterable[ReplicaKey] | None = None, grace: float = 10.0
    ) -> set[ReplicaKey]:
        selected = [
            self._replicas[k]
            for k in (self._replicas if keys is None else keys)
            if k in self._replicas
        ]
        stopping = [r for r in selected if not r.done.is_set()]
        # SIGTERM to the replica's own process only, as a container runtime sends it to the
        # container's first process: a training script's helpers (DataLoader workers, which
        # keep SIGTERM's default action) must live on while it saves a checkpoint in the
        # grace period. The whole group gets SIGKILL below. SIGCONT after it: a stopped
        # (frozen) replica would otherwise sit on its SIGTERM for the whole grace period.
        for replica in stopping:
            _signal_process(replica, signal.SIGTERM)
            _signal_process(replica, signal.SIGCONT)
        deadline = time.monotonic() + grace
        for replica in stopping:
            replica.done.wait(max(0.0, deadline - time.monotonic()))
        for replica in selected:
            # SIGKILL what ignored SIGTERM, and anything a finished replica left behind.
            _signal_group(replica, signal.SIGKILL)
        for replica in selected:
            for thread in replica.threads:
                thread.join(_READER_FLUSH_SECONDS)
        return {r.launch.key for r in stopping}

    def kill_all(self) -> None:
        """SIGKILL every replica's process group now (safe from a signal handler)."""
        for replica in list(self._replicas.values()):
            _signal_group(replica, signal.SIGKILL)

    def forget(self, keys: Iterable[ReplicaKey] | None = None) -> None:
        """Drop the (stopped) replicas among ``keys``, every one by default."""
        if keys is not None:
            for key in keys:
                self._replicas.pop(key, None)
            return
        self._replicas.clear()
        self._changed.clear()


def _signal_process(replica: _Replica, signum: int) -> None:
    if replica.process is None or replica.process.returncode is not None:
        return
    try:
        replica.process.send_signal(signum)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_group(replica: _Replica, signum: int) -> None:
    if replica.process is None:
        return
    try:
        os.killpg(replica.process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass
