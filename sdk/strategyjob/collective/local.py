"""In-process rendezvous of one process's replica threads (MirroredStrategy-style ``run``).

Each local replica runs ``fn`` in its own thread. The calling thread coordinates: it waits until
every replica has either finished or paused in ``merge_call``, then runs the merge function once
(in cross-replica context) and hands each replica its component of the result — TensorFlow's
``mirrored_run`` design. ``ReplicaContext.all_reduce``/``all_gather`` are merge calls, so every
collective of a step is issued from the calling thread, one at a time, in replica order.

Replicas take turns by default (TensorFlow's order): replica 0 runs until it finishes or pauses
in a merge call, then replica 1, and so on, which keeps random draws and side effects
deterministic.

Failure handling: an exception in any replica (or in ``merge_fn``) releases the paused replicas
and is re-raised in the caller, as TensorFlow re-raises a replica thread's error in the main
thread, with a note naming the replica it came from; replicas that disagree on the number of
merge calls end the run with TensorFlow's error; with a timeout, replicas that do not all reach a
merge call in time end it with ``DeadlineExceededError``. An exception of the calling thread's
own (Ctrl-C's ``KeyboardInterrupt``) ends the run at once: a replica still computing is left
behind (a daemon thread) instead of awaited, so that Ctrl-C stops the program promptly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import torch

from strategyjob import _context, _values, errors

__all__ = ["DIFFERENT_MERGE_CALLS", "run_replicas"]

DIFFERENT_MERGE_CALLS = (
    "Some replicas made a different number of replica_context().merge_call() calls."
)

_RUNNING, _MERGING, _DONE = "running", "merging", "done"


class _Aborted(BaseException):
    """Unwinds a paused replica thread when the run has failed elsewhere (not user-catchable
    by ``except Exception``)."""


class _Replica:
    def __init__(self, local_id: int) -> None:
        self.local_id = local_id
        self.status = _RUNNING
        self.result: Any = None
        self.error: BaseException | None = None
        self.merge_request: tuple[Callable[..., Any], tuple, dict] | None = None
        self.merge_result: Any = None


class _ReplicaGroup:
    """The shared state of one ``run``: a condition variable guards every field."""

    def __init__(self, strategy: Any, count: int, timeout: float | None, sequential: bool) -> None:
        self.strategy = strategy
        self.replicas = [_Replica(i) for i in range(count)]
        self.cond = threading.Condition()
        self.aborted = False
        self.timeout = timeout
        # Sequential (TensorFlow's order): one replica runs at a time, in replica order, until
        # it finishes or pauses in merge_call; `turn` is the local id allowed to run.
        self.sequential = sequential
        self.turn: int | None = 0

    # --- called in replica threads (with `cond` held for the _turn helpers) -----------------
    def _wait_for_turn(self, replica: _Replica) -> None:
        while self.sequential and self.turn != replica.local_id and not self.aborted:
            self.cond.wait()
        if self.aborted:
            raise _Aborted()

    def _pass_turn(self, replica: _Replica) -> None:
        if self.sequential:
            following = replica.local_id + 1
            self.turn = following if following < len(self.replicas) else None
        self.cond.notify_all()

    def start(self, replica: _Replica) -> None:
        with self.cond:
            self._wait_for_turn(replica)

    def merge_call(self, local_id: int, merge_fn: Callable[..., Any], args: tuple, kwargs: dict):
        replica = self.replicas[local_id]
        with self.cond:
            if self.aborted:
                raise _Aborted()
            replica.merge_request = (merge_fn, args, kwargs)
            replica.status = _MERGING
            self._pass_turn(replica)
            while replica.status == _MERGING and not self.aborted:
                self.cond.wait()
            self._wait_for_turn(replica)
            result, replica.merge_result = replica.merge_result, None
            return result

    def finish(self, replica: _Replica, result: Any, error: BaseException | None) -> None:
        with self.cond:
            replica.result = result
            replica.error = error
            replica.status = _DONE
            if error is not None:
                self.aborted = True  # replicas reaching a merge call now unwind at once
            self._pass_turn(replica)

    # --- called in the coordinating thread ------------------------------------------------
    def abort(self) -> None:
        with self.cond:
            self.aborted = True
            self.cond.notify_all()

    def _wait_until_settled(self) -> None:
        """Block until no replica is running (each finished or paused in merge_call)."""
        deadline: float | None = None
        with self.cond:
            while any(r.status == _RUNNING for r in self.replicas):
                if self.timeout is not None and any(r.status == _MERGING for r in self.replicas):
                    deadline = deadline or time.monotonic() + self.timeout
                    left = deadline - time.monotonic()
                    if left <= 0:
                        late = [r.local_id for r in self.replicas if r.status == _RUNNING]
                        raise errors.DeadlineExceededError(
                            f"Local replicas {late} did not reach merge_call/all_reduce within "
                            f"{self.timeout} seconds of the others; the step was abandoned."
                        )
                    self.cond.wait(left)
                else:
                    self.cond.wait()

    def coordinate(self) -> list[Any]:
        while True:
            self._wait_until_settled()
            errors = [r.error for r in self.replicas if r.error is not None]
            if errors:
                raise errors[0]
            merging = [r for r in self.replicas if r.status == _MERGING]
            if not merging:
                return [r.result for r in self.replicas]
            if len(merging) != len(self.replicas):
                raise RuntimeError(DIFFERENT_MERGE_CALLS)
            self._run_merge()

    def _run_merge(self) -> None:
        requests = cast(
            "list[tuple[Callable[..., Any], tuple, dict]]", [r.merge_request for r in self.replicas]
        )  # every replica is merging: each made its request
        merge_fn = requests[0][0]
        args = _values.regroup(tuple(req[1] for req in requests))
        kwargs = _values.regroup(tuple(req[2] for req in requests))
        with _context.enter_mode(_context.cross_replica_mode(self.strategy)):
            result = merge_fn(self.strategy, *args, **kwargs)
        with self.cond:
            for replica in self.replicas:
                replica.merge_request = None
                replica.merge_result = _values.select_replica(replica.local_id, result)
                replica.status = _RUNNING
            self.turn = 0
            self.cond.notify_all()


def _replica_main(
    group: _ReplicaGroup,
    replica: _Replica,
    context: Any,
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    device: torch.device | None,
    grad_enabled: bool,
) -> None:
    result: Any = None
    error: BaseException | None = None
    try:
        group.start(replica)
        with (
            context,
            torch.set_grad_enabled(grad_enabled),
        ):
            if device is not None and device.type == "cuda":
                with torch.cuda.device(device):
                    result = fn(*args, **kwargs)
            else:
                result = fn(*args, **kwargs)
    except _Aborted:
        pass
    except BaseException as exc:  # re-raised in the calling thread
        error = exc
        _name_replica(exc, context, replica.local_id, len(group.replicas))
    group.finish(replica, result, error)


def _name_replica(error: BaseException, context: Any, local_id: int, count: int) -> None:
    """Note on ``error`` which replica raised it: re-raised in the calling thread, its
    traceback would otherwise not say (the message and type stay the user's)."""
    replica_id = getattr(context, "replica_id_in_sync_group", local_id)
    note = f"(raised in replica {int(replica_id)}, local replica {local_id} of {count})"
    if note not in getattr(error, "__notes__", ()):
        error.add_note(note)


def run_replicas(
    strategy: Any,
    fn: Callable[..., Any],
    contexts: Sequence[Any],
    args_per_replica: Sequence[tuple],
    kwargs_per_replica: Sequence[dict],
    devices: Sequence[torch.device | None] | None = None,
    timeout: float | None = None,
    sequential: bool = True,
) -> list[Any]:
    """Run ``fn(*args_per_replica[i], **kwargs_per_replica[i])`` in one thread per replica.

    ``contexts[i]`` is replica i's ``ReplicaContext``; its ``merge_call`` is routed through this
    run's rendezvous. Returns the per-replica results in replica order; re-raises the first
    failing replica's exception (by replica id) after releasing the others.

    ``sequential`` (the default, as in TensorFlow) runs one replica at a time in replica order
    between merge calls, so replicas draw random numbers, print and touch shared Python state in
    a fixed order; device work still overlaps because CUDA kernels launch asynchronously.
    ``sequential=False`` lets the replica threads run concurrently.
    """
    count = len(contexts)
    group = _ReplicaGroup(strategy, count, timeout, sequential)
    grad_enabled = torch.is_grad_enabled()
    devices = list(devices) if devices is not None else [None] * count
    threads: list[threading.Thread] = []
    for replica, context in zip(group.replicas, contexts):
        _context.route_merge_calls(context, group)
        thread = threading.Thread(
            target=_replica_main,
            args=(
                group,
                replica,
                context,
                fn,
                args_per_replica[replica.local_id],
                kwargs_per_replica[replica.local_id],
                devices[replica.local_id],
                grad_enabled,
            ),
            name=f"replica-{replica.local_id}",
            daemon=True,
        )
        threads.append(thread)
    wait_for_running: float | None = timeout
    try:
        for thread in threads:
            thread.start()
        return group.coordinate()
    except BaseException as exc:
        group.abort()
        if not any(replica.error is exc for replica in group.replicas):
            wait_for_running = 0  # the caller's own (Ctrl-C): a busy replica is not awaited
        raise
    finally:
        # Paused replicas unwind at once; running ones finish their current work first. After
        # a timeout, a replica that never arrives is left behind (daemon) rather than awaited.
        for thread in threads:
            thread.join(wait_for_running)
        for context in contexts:
            _context.route_merge_calls(context, None)
