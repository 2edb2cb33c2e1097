"""gRPC clients of the parameter servers and workers, shared by everything in one process.

The cluster (a ``ClusterSpec``) is configured once per process: by the strategy on the
coordinator, by ``Server`` on a worker. Calls carry ``STRATEGYJOB_TOKEN`` (when set) in their
metadata; a dead ps surfaces as ``UnavailableError`` naming its task: every ps call has a
deadline (``set_timeout``, from ``CommunicationOptions.timeout_seconds``), and a ps that stops
answering gRPC's keepalive pings is declared lost within 30 s whatever the deadline.

The requests of every step (a worker's reads and gathers, then its gradients; the
coordinator's closures) travel on streaming calls kept open (``open_stream``), each a framed
message whose tensors are read in place (``_wire.pack``): per request, that costs the server one
message instead of a call, and nobody a protobuf copy of the tensors. Both ends of those
streams run on the threads that use them (``_direct``), not through grpc's own threads.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grpc
import torch

from strategyjob import _names, errors
from strategyjob.ps import _direct
from strategyjob.ps import strategyjob_ps_pb2 as pb
from strategyjob.ps._wire import CHANNEL_OPTIONS, pack, tensor_meta, unpack

__all__ = [
    "TOKEN_ENV",
    "Op",
    "PermissionDeniedError",
    "configure",
    "ps_device",
    "run_ps_ops",
    "set_timeout",
    "step_scope",
]

TOKEN_ENV = _names.ENV_TOKEN
TOKEN_METADATA = "strategyjob-token"
# How long a coordinator waits for a ps that is not up yet (they start concurrently).
CONNECT_TIMEOUT_ENV = _names.ENV_PS_CONNECT_TIMEOUT
# The deadline of every ps call, in seconds (``set_timeout`` in a process; this variable
# for the worker and ps processes, which read it at start).
TIMEOUT_ENV = _names.ENV_PS_TIMEOUT
# Without ``timeout_seconds``: long enough for a step of the largest message (1 GiB) on a
# slow ps; a ps that is gone or frozen is found by keepalive long before.
DEFAULT_TIMEOUT_SECONDS = 300.0


PermissionDeniedError = errors.PermissionDeniedError  # where the transport raises it


def ps_device(task: int) -> str:
    return f"/job:ps/replica:0/task:{task}/device:CPU:0"


def _positive_seconds(value: Any, what: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"{what} must be a positive number of seconds, got {value!r}")
    return seconds


def _initial_timeout() -> float:
    value = os.environ.get(TIMEOUT_ENV)
    return DEFAULT_TIMEOUT_SECONDS if not value else _positive_seconds(value, TIMEOUT_ENV)


_timeout: float | None = None


def set_timeout(options: Any) -> None:
    """The deadline of every later ps call: a ``CommunicationOptions`` (its
    ``timeout_seconds``; None keeps the default, ``DEFAULT_TIMEOUT_SECONDS`` or
    ``STRATEGYJOB_PS_TIMEOUT``) or a number of seconds."""
    global _timeout
    seconds = getattr(options, "timeout_seconds", options)
    _timeout = None if seconds is None else _positive_seconds(seconds, "timeout_seconds")


def timeout() -> float:
    """The deadline of a ps call, in seconds."""
    return _timeout if _timeout is not None else _initial_timeout()


def metadata() -> tuple[tuple[str, str], ...]:
    token = os.environ.get(TOKEN_ENV)
    return ((TOKEN_METADATA, token),) if token else ()


class Op:
    """One operation on a variable held by a ps (a ``VarOp`` message once encoded)."""

    __slots__ = ("indices", "name", "op", "optimizer", "read_back", "value")

    def __init__(
        self,
        op: str,
        name: str,
        value: torch.Tensor | None = None,
        indices: torch.Tensor | None = None,
        optimizer: str = "",
        read_back: bool = False,
    ) -> None:
        self.op = op
        self.name = name
        self.value = value
        self.indices = indices
        self.optimizer = optimizer
        self.read_back = read_back

    def __repr__(self) -> str:
        return f"Op({self.op!r}, {self.name!r})"


# Operations that only read: a request of these alone is no update (and needs no id).
READ_OPS = frozenset(("read", "gather", "read_slots"))


class _Step(threading.local):
    """The scheduled function (step) this thread runs, if any, and its updates so far."""

    id = ""
    updates: dict[int, int] | None = None


_step = _Step()


@contextlib.contextmanager
def step_scope(step_id: str) -> Iterator[None]:
    """Within it, this thread's ps updates belong to step ``step_id`` (the same id for every
    attempt of one scheduled function): each request that updates ps ``task`` carries the id
    ``"<step_id>/<n>"``, its position ``n`` among the step's updates to that ps, so that a ps
    skips the updates of a retried step it already applied. An empty id tags nothing."""
    previous = (_step.id, _step.updates)
    _step.id, _step.updates = step_id, {}
    try:
        yield
    finally:
        _step.id, _step.updates = previous


def next_update_id(task: int, ops: list[Op]) -> str:
    """The id of the request ``ops`` to ps ``task`` in this thread's step ("" if none)."""
    updates = _step.updates
    if updates is None or not _step.id or all(op.op in READ_OPS for op in ops):
        return ""
    n = updates.get(task, 0)
    updates[task] = n + 1
    return f"{_step.id}/{n}"


def encode_ops(ops: list[Op], update_id: str = "") -> bytes:
    """``ops`` as a framed ``VarOps`` message (the tensors' bytes copied once, into ``raw``)."""
    messages, tensors = [], []
    for op in ops:
        fields: dict[str, Any] = {"op": op.op, "name": op.name}
        if op.value is not None:
            fields["value"] = tensor_meta(op.value)
            tensors.append(op.value)
        if op.indices is not None:
            fields["indices"] = tensor_meta(op.indices)
            tensors.append(op.indices)
        if op.optimizer:
            fields["optimizer"] = op.optimizer
        if op.read_back:
            fields["read_back"] = True
        messages.append(pb.VarOp(**fields))
    return pack(pb.VarOps(ops=messages, update_id=update_id).SerializeToString(), tensors)


def encode_results(values: list[torch.Tensor]) -> bytes:
    """The framed ``VarResults`` message of ``values``."""
    header = pb.VarResults(values=[tensor_meta(v) for v in values]).SerializeToString()
    return pack(header, values)


def decode_results(data: bytes) -> list[torch.Tensor]:
    """The tensors of a framed ``VarResults`` message (views of ``data``, not copies)."""
    reply = unpack(data, pb.VarResults)
    return [reply.tensor(meta) for meta in reply.message.values]


_lock = threading.Lock()
#: Each job's task addresses by index; None where a sparse job (TF_CONFIG's dict form, an
#: elastic job's removed worker) has no task at that index.
_cluster: dict[str, list[str | None]] = {}
_channels: dict[str, grpc.Channel] = {}
_raw_stubs: dict[tuple[str, str], Any] = {}
_idle_streams: dict[tuple[str, tuple], list[Any]] = {}


def configure(cluster: Mapping[str, Sequence[str | None]]) -> None:
    """Remember the cluster's addresses (``{job: [host:port, ...]}``; None at a sparse job's
    gaps)."""
    with _lock:
        _cluster.clear()
        _cluster.update({job: list(tasks) for job, tasks in cluster.items()})


def num_tasks(job: str) -> int:
    """How many tasks ``job`` has in the configured cluster (0 when none)."""
    with _lock:
        return len(_cluster.get(job, ()))


def address(job: str, task: int) -> str:
    """The address of ``/job:{job}/task:{task}``; a task the cluster does not hold (not
    configured, past its end, or a sparse job's gap) is refused, naming the cluster."""
    try:
        found = _cluster[job][task]
    except (KeyError, IndexError):
        found = None
    if found is None:
        raise ValueError(
            f"No address for /job:{job}/task:{task}: the cluster of this process is "
            f"{_cluster or 'not configured'}. Create the ParameterServerStrategy (coordinator) or "
            "start the Server (worker) before using parameter-server variables."
        )
    return found


def channel(addr: str) -> grpc.Channel:
    with _lock:
        ch = _channels.get(addr)
        if ch is None:
            ch = grpc.insecure_channel(addr, options=CHANNEL_OPTIONS)
            _channels[addr] = ch
        return ch


def close_channels() -> None:
    with _lock:
        channels = list(_channels.values())
        streams = [s for idle in _idle_streams.values() for s in idle]
        _channels.clear()
        _raw_stubs.clear()
        _idle_streams.clear()
    for stream in streams:
        stream.close()
    for ch in channels:
        ch.close()


def raw_unary(addr: str, method: str) -> Any:
    """A (cached) callable for ``method`` at ``addr`` that sends and returns bytes as is."""
    stub = _raw_stubs.get((addr, method))
    if stub is None:
        stub = channel(addr).unary_unary(method)
        with _lock:
            if addr in _channels:  # not closed meanwhile
                _raw_stubs[(addr, method)] = stub
    return stub


def unary(addr: str, method: str, request_cls: Any, response_cls: Any) -> Any:
    return channel(addr).unary_unary(
        method,
        request_serializer=request_cls.SerializeToString,
        response_deserializer=response_cls.FromString,
    )


def raise_for_rpc_error(exc: grpc.RpcError, what: str) -> None:
    """Translate a gRPC failure into the error TensorFlow would raise."""
    raise_for_status(exc.code(), exc.details(), what)


def raise_for_status(code: grpc.StatusCode, details: str, what: str) -> None:
    """Raise the error TensorFlow would for a call to ``what`` that ended with ``code``
    (also what the in-memory transport raises for a ps request its store refused)."""
    if code == grpc.StatusCode.UNAUTHENTICATED or code == grpc.StatusCode.PERMISSION_DENIED:
        raise PermissionDeniedError(f"{what} refused the call: {details}") from None
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
        raise ValueError(details) from None
    if code == grpc.StatusCode.NOT_FOUND:
        raise errors.OpError(f"{what}: {details}") from None
    raise errors.UnavailableError(
        f"{what} is unavailable ({code.name}: {details}). GRPC error information from remote "
        f"target {what}"
    ) from None


RUN_METHOD = "/strategyjob.ps.ParameterServer/Run"
RUN_STREAM_METHOD = "/strategyjob.ps.ParameterServer/RunStream"
# Streams kept open per ps (and token) for the next calls; more are opened when several
# threads call at once, and closed after use.
MAX_IDLE_STREAMS = 2
_END = object()


class _IteratorStream:
    """``open_stream``'s stream on grpc's own streaming call (where ``_direct`` cannot be
    used): requests go through an iterator that grpc drains on a thread of its own."""

    def __init__(self, addr: str, method: str, md: tuple) -> None:
        self.metadata = md
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        call = channel(addr).stream_stream(method)
        self._replies = call(iter(self._requests.get, _END), metadata=md)

    def call(self, request: bytes) -> bytes:
        self._requests.put(request)
        return next(self._replies)

    def alive(self) -> bool:
        """False once the call has ended (e.g. the connection broke while it was idle): a
        request sent now would not reach the server."""
        return not self._replies.done()

    def close(self) -> None:
        self._requests.put(_END)
        self._replies.cancel()

    def expire(self) -> None:
        """From another thread: end the call (its deadline passed)."""
        self._replies.cancel()


class _Deadlines:
    """Ends the requests on kept-open streams that outlive their deadline (a stream has no
    deadline of its own, as it serves many requests): one thread per process checks the
    requests in flight every ``TICK`` seconds and expires the late ones' streams."""

    TICK = 0.25

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due: dict[int, tuple[float, Any]] = {}  # id(stream) -> (deadline, stream)
        self._thread: threading.Thread | None = None

    def begin(self, stream: Any, seconds: float) -> None:
        with self._lock:
            self._due[id(stream)] = (time.monotonic() + seconds, stream)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="strategyjob-ps-deadlines", daemon=True
                )
                self._thread.start()

    def end(self, stream: Any) -> bool:
        """The request on ``stream`` is over: False if its deadline had passed (the stream was
        expired and must not be used again)."""
        with self._lock:
            return self._due.pop(id(stream), None) is not None

    def _watch(self) -> None:
        tick = threading.Event()  # never set: a wait that is not a sleep of the caller's
        while True:
            tick.wait(self.TICK)
            now = time.monotonic()
            with self._lock:  # (``end`` cannot return True for a stream expired here)
                late = [key for key, (due, _) in self._due.items() if due <= now]
                for key in late:
                    try:
                        self._due.pop(key)[1].expire()
                    except Exception:  # the call already ended: nothing to stop
                        pass


_deadlines = _Deadlines()


def _deadline_error(what: str, seconds: float) -> errors.UnavailableError:
    return errors.UnavailableError(
        f"{what} is unavailable (DEADLINE_EXCEEDED: no reply within {seconds:g} s; "
        f"CommunicationOptions.timeout_seconds or {TIMEOUT_ENV} sets this deadline). "
        f"GRPC error information from remote target {what}"
    )


_direct_client = _direct.CLIENT_SUPPORTED


def open_stream(addr: str, method: str, md: tuple) -> Any:
    """One bidirectional streaming call to ``method`` at ``addr``, used as a series of unary
    ones: ``call(request)`` returns the reply (bytes in and out). Cheaper per request than a
    call each: the server keeps one handler running instead of setting up a call, a thread
    hand-off and a status for every request. A failed call raises ``grpc.RpcError`` (or
    ``StopIteration`` if the server ended it without one); the stream is then of no further
    use: ``close()`` it. ``alive()`` is False once it is known to have ended, ``metadata`` is the
    metadata it was opened with. One thread at a time uses a stream."""
    global _direct_client
    if _direct_client:
        try:
            return _direct.DirectStream(channel(addr), method, md)
        except (AttributeError, TypeError):  # grpc's private layer is not what _direct expects
            _direct_client = False
    return _IteratorStream(addr, method, md)


def _stream_call(addr: str, request: bytes, what: str) -> bytes:
    md = metadata()
    key = (addr, md)  # a stream carries the token it was opened with
    with _lock:
        idle = _idle_streams.get(key)
        stream = idle.pop() if idle else None
    if stream is not None and not stream.alive():
        stream.close()
        stream = None
    if stream is None:
        stream = open_stream(addr, RUN_STREAM_METHOD, md)
    seconds = timeout()
    _deadlines.begin(stream, seconds)
    try:
        reply = stream.call(request)
    except BaseException as exc:
        in_time = _deadlines.end(stream)
        stream.close()  # failed (the server ended the call) or interrupted
        if not in_time and isinstance(exc, (grpc.RpcError, StopIteration)):
            raise _deadline_error(what, seconds) from None
        raise
    if not _deadlines.end(stream):  # expired as the reply came in: the stream is cancelled
        stream.close()
        return reply
    with _lock:
        idle = _idle_streams.setdefault(key, [])
        if len(idle) < MAX_IDLE_STREAMS and addr in _channels:
            idle.append(stream)
            stream = None
    if stream is not None:
        stream.close()
    return reply


def run_ps_ops(task: int, ops: list[Op], *, wait: bool = False) -> list[torch.Tensor]:
    """Run ``ops`` on ps ``task`` in one request; the tensors they return, in order.

    ``wait`` (used by the coordinator while the cluster starts) waits for the ps to come up,
    at most ``STRATEGYJOB_PS_CONNECT_TIMEOUT`` seconds (default 120); otherwise a ps that is
    down fails at once with ``UnavailableError``, as does a call without a reply within
    ``timeout()`` seconds. Requests travel on a ``RunStream`` call kept
    open to the ps (a ``Run`` call each when waiting). Inside a ``step_scope``, a request that
    updates carries its update id.
    """
    addr = address("ps", task)
    what = f"/job:ps/replica:0/task:{task}"
    request = encode_ops(ops, next_update_id(task, ops))
    try:
        if wait:
            timeout = float(os.environ.get(CONNECT_TIMEOUT_ENV, "120"))
            stub = raw_unary(addr, RUN_METHOD)
            try:
                reply = stub(request, metadata=metadata(), wait_for_ready=True, timeout=timeout)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise
                # gRPC's "Deadline Exceeded" alone does not say that the ps never answered
                detail = (
                    f"no answer within {timeout:g} s of waiting for it to start, "
                    f"{CONNECT_TIMEOUT_ENV}; check that it runs and listens there (its log)"
                )
                raise_for_status(exc.code(), detail, what)
        else:
            reply = _stream_call(addr, request, what)
    except grpc.RpcError as exc:
        raise_for_rpc_error(exc, what)
    except StopIteration:  # the ps ended the stream without a status (it is going away)
        raise errors.UnavailableError(
            f"/job:ps/replica:0/task:{task} is unavailable (the stream of requests ended). "
            f"GRPC error information from remote target /job:ps/replica:0/task:{task}"
        ) from None
    return decode_results(reply)
