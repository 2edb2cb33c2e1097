"""``strategyjob.experimental.coordinator``: ClusterCoordinator, RemoteValue, PerWorkerValues.

The coordinator (the chief's program) schedules functions onto the workers: one thread per
worker takes closures from a shared FIFO queue, ships each to its worker by value and records
the result in the closure's ``RemoteValue``. Failures follow TensorFlow's rules: a worker that
dies has its closure put back and is reconnected (its per-worker resources rebuilt) when it
returns; a ps that stays down and a user function's error surface on the next ``schedule`` /
``join`` / ``done``, once, after which scheduling works again.

A worker alive but stuck in a closure (``_closure_watch``: longer than the job's stuck-peer
bound) is taken out: its closure is put back for the others, and it gets no closure until that
one ends (its result is dropped). With no other worker left, ``join`` raises
``DeadlineExceededError`` naming it. While a closure runs longer than its function ever did, the
coordinator says every few seconds whom it waits for.

A closure put back after a failure (a ps unavailable for a moment, a worker lost) runs again,
but each ps applies its updates once: every attempt carries the closure's step id, and a ps
skips an update of that step it already applied (the n-th update of the step to that ps;
see ``_transport.step_scope``). A retried step thus updates each shard once, as long as it
makes the same updates in the same order as the attempt that failed.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import enum
import hashlib
import itertools
import logging
import os
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

import cloudpickle
import torch

from strategyjob import _names, _nest, errors
from strategyjob.collective import stuck, waiting
from strategyjob.ps import _closure_watch, _cluster, _membership, _remote
from strategyjob.ps import strategyjob_ps_pb2 as pb
from strategyjob.ps._wire import dumps, loads

__all__ = [
    "ClosureInputError",
    "ClusterCoordinator",
    "CoordinatedExtended",
    "PerWorkerValues",
    "RemoteValue",
    "RemoteValueStatus",
    "get_current_worker_index",
]

log = logging.getLogger(__name__)

RUN_CLOSURE_STREAM = _cluster.RUN_CLOSURE_STREAM
CANCELLED_MESSAGE = "The corresponding function is cancelled. Please reschedule the function."
ABORTED_MESSAGE = "The corresponding function is aborted. Please reschedule the function."
QUEUE_LIMIT = 256 * 1024
# How long a worker thread waits for its worker to come back before giving up on it.
RECONNECT_TIMEOUT_S = 3600.0


class ClosureInputError(errors.OpError):
    """A scheduled function's per-worker input (a dataset or iterator) failed."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(
            f"Input has an error, the original exception is {original!r}, error message is "
            f"{original}."
        )
        self.original_exception = original


# ---------------------------------------------------------------------------------------------
# values


class RemoteValueStatus(enum.Enum):
    NOT_READY = "NOT_READY"
    ABORTED = "ABORTED"
    READY = "READY"


def _to_numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return value


class _Result:
    """What a scheduled function's ``RemoteValue`` waits for: the closure's worker thread sets
    it (``RemoteValue`` keeps TensorFlow's public API, ``fetch`` and ``get``)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._status = RemoteValueStatus.NOT_READY
        self._value: Any = None
        self._error: BaseException | None = None

    @property
    def status(self) -> RemoteValueStatus:
        return self._status

    def set_value(self, value: Any) -> None:
        self._value, self._error = value, None
        self._status = RemoteValueStatus.READY
        self._event.set()

    def set_error(self, error: BaseException) -> None:
        self._error = error
        self._status = RemoteValueStatus.READY
        self._event.set()

    def wait(self) -> Any:
        """The value, once set; the error, raised."""
        self._event.wait()
        if self._error is not None:
            raise self._error
        return self._value


class RemoteValue:
    """The future result of a scheduled function (``tf.distribute``'s ``RemoteValue``)."""

    def __init__(self, result: _Result) -> None:
        self._result = result

    def fetch(self) -> Any:
        """Wait for the result and return it with numpy arrays in place of tensors."""
        return _nest.map_structure(_to_numpy, self._result.wait())

    def get(self) -> Any:
        """Wait for the result and return it as tensors on the coordinator."""
        return self._result.wait()

    def _status_name(self) -> str:
        return self._result.status.value


class PerWorkerValues:
    """One value per worker; a scheduled function receives its worker's component."""

    def __init__(self, values: Any) -> None:
        self._values = tuple(values)

    @property
    def values(self) -> tuple:
        return self._values

    def __repr__(self) -> str:
        return f"PerWorkerValues({self.values!r})"


# ---------------------------------------------------------------------------------------------
# resources (per-worker datasets and iterators)


class _ResourceRef:
    """Ships as a reference to the object a worker built for resource ``id``."""

    def __init__(self, resource_id: int) -> None:
        self.resource_id = resource_id


def _shipping_hook(obj: Any) -> Any:
    """Persistent ids for what a function may close over: resources and ps parameters."""
    if isinstance(obj, _ResourceRef):
        return ("resource", obj.resource_id)
    return _remote.coordinator_hook(obj)


class _Resource:
    def __init__(self, resource_id: int, creator: Callable[[], Any]) -> None:
        self.id = resource_id
        self.payload, self.tensors = dumps(creator, _shipping_hook)


# The reference each per-worker resource ships as, whichever the worker (``PerWorkerDataset``
# and the like keep TensorFlow's public API, so the coordinator looks it up here).
_resource_refs: weakref.WeakKeyDictionary[PerWorkerValues, _ResourceRef] = (
    weakref.WeakKeyDictionary()
)


def _component(values: PerWorkerValues, worker_index: int) -> Any:
    """What a function scheduled on worker ``worker_index`` receives for ``values``."""
    ref = _resource_refs.get(values)
    if ref is not None:
        return ref
    return values.values[worker_index]


class _PerWorkerResource(PerWorkerValues):
    """A resource built on every worker, those that join later included (before they take a
    closure): its ``values`` follow the coordinator's current workers."""

    def __init__(
        self, coordinator: ClusterCoordinator, pool: _WorkerPool, creator: Callable[[], Any]
    ) -> None:
        self._coordinator = coordinator
        self._pool = pool
        resource = pool.add_resource(creator)
        super().__init__(())
        self._resource_id = resource.id
        _resource_refs[self] = _ResourceRef(resource.id)

    @property
    def values(self) -> tuple:
        ref = _ResourceRef(self._resource_id)
        return tuple(ref for _ in self._coordinator.worker_indices())


@runtime_checkable
class DeferredDataset(Protocol):
    """A dataset a strategy hands out to be built on each worker (``ParameterServerStrategy``'s
    ``experimental_distribute_dataset`` and ``distribute_datasets_from_function``):
    ``create_per_worker_dataset`` builds it there with ``creator``."""

    @property
    def creator(self) -> Callable[[], Any]:
        """Builds the dataset (called on each worker)."""
        ...


def _make_iterator(dataset: Any) -> Iterator[Any]:
    return iter(dataset)


class PerWorkerDistributedIterator(_PerWorkerResource):
    """Per-worker iterators: pass it to scheduled functions, which call ``next`` on it."""

    def __next__(self) -> Any:
        raise NotImplementedError(
            "Iterating over an `AsyncDistributedIterator` is not supported right now."
        )

    def get_next(self) -> Any:
        return self.__next__()


class PerWorkerDataset(_PerWorkerResource):
    """A dataset built on every worker by ``create_per_worker_dataset``."""

    def __iter__(self) -> PerWorkerDistributedIterator:
        ref = _ResourceRef(self._resource_id)
        return PerWorkerDistributedIterator(
            self._coordinator, self._pool, lambda: _make_iterator(ref)
        )


# ---------------------------------------------------------------------------------------------
# closures and the queue


# Step ids: unique to this coordinator process (a restarted one starts a new prefix), so a ps
# never mistakes a new step for one it applied.
_STEP_PREFIX = uuid.uuid4().hex[:16]
_step_counter = itertools.count()


class _Closure:
    def __init__(self, function: _ShippedFunction, args: tuple, kwargs: dict) -> None:
        self.function = function
        self.args = args
        self.kwargs = kwargs
        # The same for every attempt: a ps skips the updates of a retried attempt that an
        # earlier one applied (see ``_transport.step_scope``).
        self.step_id = f"{_STEP_PREFIX}-{next(_step_counter)}"
        self.result = _Result()  # set by the worker thread that runs it
        self.output = RemoteValue(self.result)
        self.ps_failures: collections.Counter[str] = collections.Counter()

    def payload(self, worker_index: int) -> tuple[bytes, list]:
        def hook(obj: Any) -> Any:
            if isinstance(obj, PerWorkerValues):
                component = _component(obj, worker_index)
                if isinstance(component, _ResourceRef):
                    return ("resource", component.resource_id)
                if isinstance(component, RemoteValue):
                    return ("value", component.get())
                return ("value", component)
            return _shipping_hook(obj)

        return dumps((self.args, self.kwargs), hook)


class _ShippedFunction:
    """A function pickled once (by value), with a digest workers cache it under."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.payload, self.tensors = dumps(fn, _shipping_hook)
        self.name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        digest = hashlib.sha256(self.payload)
        for t in self.tensors:
            digest.update(t.SerializeToString())
        self.digest = digest.hexdigest()


class _ClosureQueue:
    """FIFO of closures with TensorFlow's error semantics (first error wins, then cancel)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: collections.deque[_Closure] = collections.deque()
        self._inflight = 0
        self._error: BaseException | None = None
        self._stopped = False

    def put(self, closure: _Closure) -> None:
        with self._cond:
            self._cond.wait_for(lambda: len(self._queue) < QUEUE_LIMIT or self._stopped)
            self._queue.append(closure)
            self._cond.notify_all()

    def get(self, timeout: float | None = None) -> _Closure | None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._queue or self._stopped, timeout):
                return None
            if self._stopped:
                return None
            closure = self._queue.popleft()
            self._inflight += 1
            self._cond.notify_all()
            return closure

    def mark_finished(self) -> None:
        with self._cond:
            self._inflight -= 1
            self._cond.notify_all()

    def put_back(self, closure: _Closure) -> None:
        with self._cond:
            self._inflight -= 1
            if self._error is not None:
                closure.result.set_error(errors.CancelledError(CANCELLED_MESSAGE))
            else:
                self._queue.appendleft(closure)
            self._cond.notify_all()

    def mark_failed(self, error: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = error
            self._inflight -= 1
            while self._queue:
                self._queue.popleft().result.set_error(errors.CancelledError(CANCELLED_MESSAGE))
            self._cond.notify_all()

    def record_error(self, error: BaseException) -> None:
        """A failure outside any closure (e.g. a worker refusing our token)."""
        with self._cond:
            if self._error is None:
                self._error = error
            while self._queue:
                self._queue.popleft().result.set_error(errors.CancelledError(CANCELLED_MESSAGE))
            self._cond.notify_all()

    def raise_if_error(self) -> None:
        """Raise the recorded error once (after in-flight closures finish), then clear it."""
        with self._cond:
            if self._error is None:
                return
            self._cond.wait_for(lambda: self._inflight == 0)
            while self._queue:
                self._queue.popleft().result.set_error(errors.CancelledError(CANCELLED_MESSAGE))
            error, self._error = self._error, None
        raise error

    def wait(self) -> None:
        with self._cond:
            self._cond.wait_for(
                lambda: self._error is not None or (not self._queue and self._inflight == 0)
            )
        self.raise_if_error()

    def done(self) -> bool:
        self.raise_if_error()
        return self.idle()

    def idle(self) -> bool:
        """Nothing queued or running (errors aside)."""
        with self._cond:
            return not self._queue and self._inflight == 0

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()


# ---------------------------------------------------------------------------------------------
# workers

_worker_index = threading.local()


@contextlib.contextmanager
def worker_index_scope(index: int) -> Iterator[None]:
    """Run a closure as worker ``index`` (what ``get_current_worker_index`` returns in it): the
    worker's closure runner (``ps.server``) enters it."""
    previous = getattr(_worker_index, "value", None)
    _worker_index.value = index
    try:
        yield
    finally:
        _worker_index.value = previous


def get_current_worker_index() -> int:
    """Inside a scheduled function: the index of the worker running it (shard data with it)."""
    index = getattr(_worker_index, "value", None)
    if index is None:
        raise RuntimeError("Cannot retrieve the worker index outside of a scheduled function.")
    return index


class _WorkerFailure(Exception):
    pass


def _say(line: str) -> None:
    print(f"strategyjob: {line}", file=sys.stderr, flush=True)


class _Running:
    """A closure a worker thread has sent and waits for since ``start`` (monotonic), and when
    to say so next (every ``interval`` seconds)."""

    def __init__(self, closure: _Closure, start: float, interval: float) -> None:
        self.closure = closure
        self.start = start
        self.reporter = waiting.Reporter(interval, start)


class _Worker:
    """The coordinator's side of one worker: a thread that runs closures on it."""

    def __init__(self, pool: _WorkerPool, index: int, client: _cluster.WorkerClient) -> None:
        self._pool = pool
        self.index = index
        self._client = client
        self._queue = pool.queue
        self._incarnation: str | None = None
        self._sent: set[str] = set()
        self._resources_built: set[int] = set()
        self._stop = threading.Event()
        self._setup_lock = threading.Lock()  # connection and resources: one thread at a time
        self._down = threading.Event()  # set until connected, and again after a failure
        self._down.set()
        # The closures its threads wait for (by thread), and the threads whose closure was
        # taken out as stuck (the worker takes no closure while any is left).
        self._watch_lock = threading.Lock()
        self._running: dict[int, _Running] = {}
        self._taken_out: set[int] = set()
        self._report_seconds = pool.report_seconds
        # One closure at a time per worker, as in TensorFlow. More in flight (the next one is
        # already on the worker when the current one ends; the worker still runs them one at a
        # time, in arrival order, which may then differ from the queue's) is a tuning knob.
        in_flight = max(1, int(os.environ.get(_names.ENV_CLOSURES_IN_FLIGHT_PER_WORKER, "1")))
        self._threads = [
            threading.Thread(
                target=self._loop,
                name=f"WorkerClosureProcessingLoop-{index}" + (f".{k}" if k else ""),
                daemon=True,
            )
            for k in range(in_flight)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def name(self) -> str:
        return self._client.name

    @property
    def traffic(self) -> list[int]:
        """Bytes sent to / received from the worker (benchmarks reset it in place)."""
        return self._client.traffic

    def stop(self) -> None:
        """Take no new closure (it left the cluster, or the coordinator shuts down); a closure
        in flight still ends: its result is used, or it is put back if the worker is lost."""
        self._stop.set()

    def alive(self) -> bool:
        """Whether a thread of it still runs (a closure in flight after ``stop``)."""
        return any(thread.is_alive() for thread in self._threads)

    def join(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s per thread) for its threads to end after ``stop``."""
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout)

    @property
    def taken_out(self) -> bool:
        """Whether a closure of this worker was taken out as stuck and has not ended."""
        with self._watch_lock:
            return bool(self._taken_out)

    def running(self) -> list[_Running]:
        """The closures this worker's threads wait for."""
        with self._watch_lock:
            return list(self._running.values())

    def take_out(self, stuck: _Running) -> list[_Running]:
        """Take this worker out because ``stuck`` is: the closures its threads wait for are
        the caller's to put back or fail; their replies, if any come, are dropped. Nothing
        (an empty list) when ``stuck`` has ended meanwhile: the worker stays in."""
        with self._watch_lock:
            if not any(running is stuck for running in self._running.values()):
                return []
            taken = list(self._running.values())
            self._taken_out.update(self._running)
            self._running.clear()
            return taken

    # -- connection ----------------------------------------------------------------------
    def _connect(self, deadline: float) -> None:
        """Wait until the worker answers; a new incarnation gets its resources rebuilt."""
        while not self._stop.is_set():
            try:
                incarnation = self._client.status(timeout=1.0)
            except errors.UnavailableError:
                if time.monotonic() > deadline:
                    raise errors.UnavailableError(
                        f"Worker {self.name} did not come back."
                    ) from None
                continue
            if incarnation != self._incarnation:
                if self._incarnation is not None:
                    log.warning("Worker %s restarted; rebuilding its resources.", self.name)
                self._incarnation = incarnation
                self._sent.clear()
                self._resources_built.clear()
            return

    def _ensure_resources(self) -> None:
        for resource in self._pool.resources():
            if resource.id in self._resources_built:
                continue
            reply = self._call(
                self._client.create_resource,
                pb.Closure(
                    payload=resource.payload, tensors=resource.tensors, resource_id=resource.id
                ),
            )
            if reply.error_kind:
                raise ClosureInputError(_remote_error(reply))
            self._resources_built.add(resource.id)

    @staticmethod
    def _call(
        method: Callable[[pb.Closure], pb.ClosureResult], request: pb.Closure
    ) -> pb.ClosureResult:
        """``method(request)`` (one of the client's): a lost worker is a ``_WorkerFailure``."""
        try:
            return method(request)
        except errors.UnavailableError as exc:
            raise _WorkerFailure(str(exc)) from None

    # -- the loop ------------------------------------------------------------------------
    def _loop(self) -> None:
        # TF's staggered start: worker i waits i x DELAY seconds (capped by DELAY_MAX, if set).
        delay = float(os.environ.get("TF_COORDINATOR_SCHEDULE_START_DELAY", "0")) * self.index
        cap = float(os.environ.get("TF_COORDINATOR_SCHEDULE_START_DELAY_MAX", "0"))
        if delay:
            self._stop.wait(min(delay, cap) if cap else delay)
        try:
            while not self._stop.is_set():
                if self._down.is_set():
                    # Take no closure while the worker is unreachable: the others run them.
                    self._wait_for_return()
                    continue
                if self.taken_out:  # stuck in a closure, which another thread waits for
                    self._stop.wait(0.5)
                    continue
                closure = self._queue.get(timeout=0.5)
                if closure is None:
                    continue
                if self._stop.is_set():  # it left the cluster while waiting for this closure
                    self._queue.put_back(closure)
                    break
                try:
                    self._process(closure)
                except BaseException as exc:
                    closure.result.set_error(exc)
                    self._queue.mark_failed(exc)
        finally:
            self._client.close()

    def _process(self, closure: _Closure) -> None:
        if self._down.is_set():
            self._queue.put_back(closure)
            return
        try:
            with self._setup_lock:
                try:
                    self._ensure_resources()
                except ClosureInputError as exc:
                    closure.result.set_error(exc)
                    self._queue.mark_failed(exc)
                    return
            reply = self._run_watched(closure)
        except _WorkerFailure as exc:
            if not self._down.is_set():
                log.warning("Worker %s failed (%s); its closures are rescheduled.", self.name, exc)
            self._down.set()
            self._queue.put_back(closure)
            return
        if reply is None:  # taken out as stuck: the watch put the closure back, or failed it
            return
        kind = reply.error_kind
        if not kind:
            payload = loads(reply.payload, reply.tensors)
            closure.result.set_value(payload)
            self._queue.mark_finished()
        elif kind == "missing_resource":
            self._resources_built.clear()
            self._queue.put_back(closure)
        elif kind == "ps_unavailable":
            closure.ps_failures[reply.ps_task] += 1
            limit = int(os.environ.get("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES", "3"))
            failures = closure.ps_failures[reply.ps_task]
            if failures <= limit:
                # A ps that just failed is often still reconnecting, and gRPC refuses calls at
                # once meanwhile (for up to a second): retrying at once would use every retry
                # up in that second.
                self._stop.wait(ps_retry_delay(failures))
                self._queue.put_back(closure)
            else:
                error = errors.UnavailableError(
                    f"Parameter server {reply.ps_task} is unavailable: {reply.error_message} "
                    "Restart the coordinator, recreate the variables and restore a checkpoint."
                )
                closure.result.set_error(error)
                self._queue.mark_failed(error)
        else:
            failure = _remote_error(reply)
            if kind == "input":
                failure = ClosureInputError(failure)
            closure.result.set_error(failure)
            self._queue.mark_failed(failure)

    def _run_watched(self, closure: _Closure) -> pb.ClosureResult | None:
        """``_execute(closure)`` as the coordinator's watch sees it: None when the closure was
        taken out as stuck meanwhile (its reply or failure is dropped: another worker runs it)."""
        thread = threading.get_ident()
        running = _Running(closure, time.monotonic(), self._report_seconds)
        with self._watch_lock:
            self._running[thread] = running
        try:
            reply = self._execute(closure)
        except _WorkerFailure:
            if self._ended(thread, lost=True):
                raise
            self._down.set()  # lost while taken out: reconnect before taking closures again
            return None
        if not self._ended(thread, lost=False):
            return None
        if not reply.error_kind:
            seconds = time.monotonic() - running.start
            self._pool.history.record(closure.function.digest, seconds)
        return reply

    def _ended(self, thread: int, lost: bool) -> bool:
        """The closure ``thread`` waited for ended (``lost``: with the worker); False if it
        had been taken out (the worker then takes closures again, once none of its threads
        waits for a stuck one)."""
        with self._watch_lock:
            if self._running.pop(thread, None) is not None:
                return True
            self._taken_out.discard(thread)
            back = not self._taken_out
        if back and not lost:
            _say(f"{self.name} finished its stuck closure; it takes closures again")
        return False

    def _execute(self, closure: _Closure) -> pb.ClosureResult:
        function = closure.function
        payload, tensors = closure.payload(self.index)
        request = pb.Closure(
            payload=payload,
            tensors=tensors,
            function_digest=function.digest,
            step_id=closure.step_id,
        )
        for _ in range(2):
            if function.digest not in self._sent:
                request.function = function.payload
                del request.function_tensors[:]
                request.function_tensors.extend(function.tensors)
            reply = self._call(self._client.run_closure, request)
            if reply.error_kind != "missing_function":
                self._sent.add(function.digest)
                return reply
            self._sent.discard(function.digest)
        raise _WorkerFailure("the worker lost the function twice")

    def _wait_for_return(self) -> None:
        """Reconnect (rebuilding resources of a restarted worker) and mark the worker up."""
        try:
            with self._setup_lock:
                if self._down.is_set():
                    self._connect(time.monotonic() + RECONNECT_TIMEOUT_S)
                    if self._stop.is_set():
                        return
                    with contextlib.suppress(ClosureInputError):  # failed with a closure, later
                        self._ensure_resources()  # before it takes a closure (a new worker)
                    self._down.clear()
        except _WorkerFailure:
            pass  # lost again while building its resources: still down, wait again
        except errors.UnavailableError:
            log.error("Worker %s did not come back within %s s.", self.name, RECONNECT_TIMEOUT_S)
            self._stop.set()
        except errors.PermissionDeniedError as exc:
            self._queue.record_error(exc)  # raised by the next schedule/join/done
            self._stop.set()


def ps_retry_delay(failures: int) -> float:
    """Seconds before a closure's retry after its ``failures``-th unavailable ps: 0.5, 1, 2, …
    up to 8 (the default three retries span 3.5 s, past gRPC's reconnection backoff)."""
    return min(0.5 * 2 ** (failures - 1), 8.0)


def _remote_error(reply: pb.ClosureResult) -> BaseException:
    if reply.error:
        try:
            error = cloudpickle.loads(reply.error)
            if isinstance(error, BaseException):
                return error
        except Exception:
            pass
    return errors.OpError(reply.error_message)


# ---------------------------------------------------------------------------------------------
# the coordinator


class CoordinatedExtended(Protocol):
    """What ``ClusterCoordinator`` needs from its strategy's ``extended`` (the strategies sit
    above this layer, so they implement this; ``ParameterServerStrategyExtended`` does).

    The coordinator reaches the cluster through ``transport`` only, and the strategy learns
    what the coordinator is doing through ``ClusterCoordinator.idle()`` only.
    """

    @property
    def transport(self) -> _cluster.PSTransport:
        """The cluster: its ps tasks and workers (``num_workers`` worker threads are started)."""
        ...

    @property
    def coordinator(self) -> ClusterCoordinator | None:
        """The coordinator attached to the strategy, if any (one per strategy)."""
        ...

    def attach_coordinator(self, coordinator: ClusterCoordinator) -> None:
        """Called once, by the coordinator being created for this strategy."""
        ...

    def before_schedule(self) -> None:
        """Called by ``schedule`` before it queues a function (e.g. send the parameters still
        waiting to go to the ps; the chief's copies of ps values may then go stale)."""
        ...

    def before_create_resources(self) -> None:
        """Called before per-worker resources (datasets) are built from the chief's objects."""
        ...


# The strategies a coordinator schedules for: ParameterServerStrategy registers itself when it
# loads (the strategies sit above this layer).
_coordinated_types: tuple[type[Any], ...] = ()


def register_coordinated_strategy(cls: type) -> None:
    """Let ``ClusterCoordinator`` accept strategies of ``cls``."""
    global _coordinated_types
    _coordinated_types = (*_coordinated_types, cls)


class _WorkerPool:
    """The coordinator's workers and what their threads share with it: the closure queue, the
    per-worker resources, the closures' run times and the watch over the closures in flight.

    ``ClusterCoordinator`` keeps TensorFlow's public API and delegates here. The worker threads,
    the closure watch and the exit handler hold the pool, never the coordinator, so that a
    coordinator no longer used is collected (its ``__del__`` shuts the pool down).
    """

    def __init__(self) -> None:
        self.queue = _ClosureQueue()
        self._resources: list[_Resource] = []
        self._resources_lock = threading.Lock()
        # A bad setting is refused here, before any closure runs.
        self._stuck_policy = stuck.policy_from_env()
        self.report_seconds = waiting.positive_seconds(
            waiting.ENV_WAITING_REPORT_SECONDS, waiting.DEFAULT_REPORT_SECONDS
        )
        self.history = _closure_watch.History()
        self.watch_stop = threading.Event()
        # The workers closures are scheduled onto (replaced whole on a resize, so that readers
        # need no lock) and those that left with a closure still in flight.
        self._membership_lock = threading.Lock()
        self._members: dict[int, str] = {}
        self.workers: dict[int, _Worker] = {}
        self._leaving: list[_Worker] = []

    # -- per-worker resources -------------------------------------------------------------
    def add_resource(self, creator: Callable[[], Any]) -> _Resource:
        """A new resource, built by every worker before its next closure."""
        with self._resources_lock:
            resource = _Resource(len(self._resources), creator)
            self._resources.append(resource)
            return resource

    def resources(self) -> list[_Resource]:
        """The resources so far, in creation order."""
        with self._resources_lock:
            return list(self._resources)

    # -- membership -----------------------------------------------------------------------
    def refresh(self, transport: _cluster.PSTransport) -> _membership.Change:
        """Follow ``transport``'s membership (see ``ClusterCoordinator.refresh_workers``)."""
        with self._membership_lock:
            members = transport.workers()
            change = _membership.change(self._members, members)
            if not change:
                return change
            initial = not self._members
            workers = dict(self.workers)
            for index in change.removed:
                leaving = workers.pop(index)
                leaving.stop()
                self._leaving.append(leaving)
            for index in change.added:
                workers[index] = _Worker(self, index, transport.worker(index))
            self.workers = dict(sorted(workers.items()))
            self._members = dict(members)
        if not initial:
            _say(_membership_line(change, tuple(self.workers)))
        return change

    def all_workers(self) -> list[_Worker]:
        """Current workers and those that left with a closure still in flight."""
        with self._membership_lock:
            self._leaving = [w for w in self._leaving if w.alive()]
            return [*self.workers.values(), *self._leaving]

    # -- stuck closures -------------------------------------------------------------------
    def check(self, worker: _Worker, now: float) -> None:
        """Say whom ``worker``'s closures keep waiting, or take it out if one is stuck."""
        for running in worker.running():
            function = running.closure.function
            seconds = now - running.start
            completed, longest = self.history.of(function.digest)
            policy = self._stuck_policy
            limit = None if policy is None else _closure_watch.bound(policy, completed, longest)
            if limit is not None and seconds >= limit.seconds:
                self.take_out(worker, running, seconds, limit)
                return
            if running.reporter.due(now) and seconds > longest:
                line = _closure_watch.waiting_line(
                    function.name, worker.name, seconds, completed, longest, limit
                )
                _say(line)

    def take_out(
        self, worker: _Worker, stuck_run: _Running, seconds: float, limit: _closure_watch.Bound
    ) -> None:
        """Take ``worker`` out: its closures go back to the queue for the others; with no
        other worker left, the stuck one fails the job (``join`` raises)."""
        taken = worker.take_out(stuck_run)
        if not taken:  # it ended meanwhile: the worker and its closures stay as they are
            return
        function = stuck_run.closure.function.name
        if all(w.taken_out for w in self.workers.values()):
            error = errors.DeadlineExceededError(
                _closure_watch.stuck_message(function, worker.name, seconds, limit)
            )
            for running in taken:
                if running is not stuck_run:
                    self.queue.put_back(running.closure)
            stuck_run.closure.result.set_error(error)
            self.queue.mark_failed(error)
            return
        _say(_closure_watch.taken_out_line(function, worker.name, seconds, limit))
        for running in taken:
            self.queue.put_back(running.closure)

    # -- shutdown -------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop the worker threads (at exit, or when the coordinator is collected)."""
        self.watch_stop.set()
        workers = self.all_workers()
        for worker in workers:
            worker.stop()
        self.queue.stop()
        for worker in workers:
            if not worker.taken_out:  # else a thread waits for a stuck closure: see _stop_all
                worker.join(timeout=2.0)

    def join(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s each) for the worker threads still running."""
        for worker in self.all_workers():
            worker.join(timeout)


class ClusterCoordinator:
    """Schedules functions onto the workers of a ``ParameterServerStrategy``.

    One coordinator per strategy: constructing a second returns the first. Its own ps calls
    have the chief's ``STRATEGYJOB_PS_TIMEOUT`` deadline, the functions' calls their worker's
    (see ``ParameterServerStrategy``).
    """

    def __new__(cls, strategy: Any) -> ClusterCoordinator:
        if not isinstance(strategy, _coordinated_types):
            raise ValueError(
                "Only `tf.distribute.experimental.ParameterServerStrategy` is supported to work "
                "with `tf.distribute.experimental.coordinator.ClusterCoordinator` currently."
            )
        extended: CoordinatedExtended = strategy.extended
        existing = extended.coordinator
        if existing is not None:
            return existing
        coordinator = super().__new__(cls)
        coordinator._init(strategy, extended)
        extended.attach_coordinator(coordinator)
        return coordinator

    def _init(self, strategy: Any, extended: CoordinatedExtended) -> None:
        self._strategy = strategy
        self._extended = extended
        self._functions: dict[int, tuple[Any, _ShippedFunction]] = {}
        self._pool = _WorkerPool()
        _live.add(self._pool)
        self.refresh_workers()
        threading.Thread(
            target=_watch,
            args=(weakref.ref(self), self._pool),
            name="ClosureWatch",
            daemon=True,
        ).start()

    def __init__(self, strategy: Any) -> None:  # state is set once, in __new__
        pass

    @property
    def strategy(self) -> Any:
        return self._strategy

    def worker_indices(self) -> tuple[int, ...]:
        """The indices of the workers closures are scheduled onto now (a strategyjob addition:
        they change while the job is resized)."""
        return tuple(self._pool.workers)

    def refresh_workers(self) -> _membership.Change:
        """Follow the transport's membership (``PSTransport.workers``): a worker that joined
        gets its threads (it connects, builds its per-worker resources, then takes closures),
        one that left takes no new closure (the one in flight ends there, or is put back if the
        worker is lost first). The coordinator calls it every ``WATCH_TICK``; a strategyjob
        addition, public so that a caller that just resized need not wait for the tick."""
        return self._pool.refresh(self._extended.transport)

    def _shipped(self, fn: Callable[..., Any]) -> _ShippedFunction:
        entry = self._functions.get(id(fn))
        if entry is None or entry[0] is not fn:
            entry = (fn, _ShippedFunction(fn))
            self._functions[id(fn)] = entry
        return entry[1]

    def schedule(
        self, fn: Callable[..., Any], args: Any = None, kwargs: dict[str, Any] | None = None
    ) -> RemoteValue:
        """Queue ``fn(*args, **kwargs)`` to run (at least once) on some worker; a retried run's
        ps updates that an earlier run applied are not applied again."""
        if not callable(fn):
            raise TypeError(
                "`tf.distribute.experimental.coordinator.ClusterCoordinator.schedule` only "
                "accepts a `tf.function` or a concrete function."
            )
        args = tuple(args or ())
        kwargs = dict(kwargs or {})
        for leaf in _nest.flatten((args, kwargs)):
            if isinstance(leaf, RemoteValue):
                raise ValueError(
                    "`tf.distribute.experimental.coordinator.RemoteValue` used as an input to "
                    "scheduled function is not yet supported."
                )
        self._pool.queue.raise_if_error()
        self._extended.before_schedule()
        closure = _Closure(self._shipped(fn), args, kwargs)
        self._pool.queue.put(closure)
        return closure.output

    def join(self) -> None:
        """Block until every scheduled function has finished; raise the first error."""
        self._pool.queue.wait()

    def done(self) -> bool:
        """Whether every scheduled function has finished (raises the first error)."""
        return self._pool.queue.done()

    def idle(self) -> bool:
        """Whether no scheduled function is queued or running, errors aside (a strategyjob
        addition, for the strategy: the ps values are then settled). Raises nothing."""
        return self._pool.queue.idle()

    def fetch(self, val: Any) -> Any:
        """``val`` with every ``RemoteValue`` replaced by its fetched result."""
        return _nest.map_structure(lambda v: v.fetch() if isinstance(v, RemoteValue) else v, val)

    def create_per_worker_dataset(self, dataset_fn: Any) -> PerWorkerDataset:
        """Build ``dataset_fn()`` (or the given dataset) on every worker; iterate it with
        ``iter()`` and pass the iterator to scheduled functions."""
        if isinstance(dataset_fn, DeferredDataset):  # from experimental_distribute_dataset & co.
            creator = dataset_fn.creator
        elif callable(dataset_fn) and not hasattr(dataset_fn, "__iter__"):
            creator = dataset_fn
        else:
            dataset = dataset_fn

            def creator() -> Any:
                return dataset

        self._extended.before_create_resources()
        return PerWorkerDataset(self, self._pool, creator)

    def _create_per_worker_resources(self, fn: Callable[[], Any]) -> PerWorkerValues:
        return _PerWorkerResource(self, self._pool, fn)

    def __del__(self) -> None:
        pool = getattr(self, "_pool", None)  # None: refused while being created
        if pool is not None:
            pool.shutdown()


# The pools of the coordinators alive, or of those whose worker threads still run.
_live: weakref.WeakSet[_WorkerPool] = weakref.WeakSet()
WATCH_TICK = 0.25  # seconds between two looks at the closures in flight


def _watch(ref: weakref.ref[ClusterCoordinator], pool: _WorkerPool) -> None:
    """Every tick: follow the membership, say whom the coordinator waits for, take out a worker
    stuck in a closure (holds the coordinator only while it looks, so that it can still be
    collected)."""
    while not pool.watch_stop.wait(WATCH_TICK):
        coordinator = ref()
        if coordinator is None:
            return
        try:
            coordinator.refresh_workers()
        except Exception as exc:  # (a transport's membership source failing): try next tick
            log.warning("Could not refresh the workers' membership: %s", exc)
        del coordinator
        for worker in pool.all_workers():
            pool.check(worker, time.monotonic())


def _membership_line(change: _membership.Change, now: tuple[int, ...]) -> str:
    """What a resize did, for the job's log."""
    parts = []
    if change.added:
        parts.append("joined: " + ", ".join(_cluster.worker_name(i) for i in change.added))
    if change.removed:
        parts.append("left: " + ", ".join(_cluster.worker_name(i) for i in change.removed))
    indices = ", ".join(map(str, now)) or "none"
    return f"workers resized ({'; '.join(parts)}); now {len(now)} (tasks {indices})"


@atexit.register
def _stop_all() -> None:
    pools = list(_live)
    for pool in pools:
        pool.shutdown()
    # Closing the channels cancels the calls still in flight: a thread that waits for a
    # stuck closure wakes and ends now. Left to wake while the interpreter finalizes, it
    # would abort the process (SIGABRT: "terminate called without an active exception")
    # after the program had succeeded.
    _cluster.close_grpc()
    for pool in pools:
        pool.join(timeout=2.0)
