"""What the strategy, the coordinator and the remote variables need from "the cluster".

``PSTransport`` is the whole of it: run operations on ps task ``i`` (``run_ps_ops``), reach
worker ``w`` (``worker(w)``, a ``WorkerClient`` that runs closures and builds per-worker
resources there and tells whether the worker is up) and ``close``. Two implementations:

* ``GrpcTransport``: the real cluster, over ``_transport``'s gRPC clients and ``_direct``'s
  streams (the hot path and every deadline are theirs, unchanged);
* ``ps._inmemory.InMemoryTransport``: ps state and workers in this process, for unit tests of
  the coordinator's scheduling, retries and errors without sockets or subprocesses.

Errors are the same whichever transport runs: a ps that cannot be reached raises
``errors.UnavailableError`` naming ``/job:ps/replica:0/task:i``, a worker that is lost raises
``errors.UnavailableError`` from its client's calls, a refused token ``PermissionDeniedError``.

One transport is current per process (``use``/``current``): the remote variables and module
parameters that closures carry call it, on the coordinator and on a worker alike (a worker
process uses the gRPC one, configured by its ``Server``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

import grpc
import torch
from google.protobuf.message import DecodeError

from strategyjob import errors
from strategyjob.ps import _cluster_file, _transport
from strategyjob.ps import strategyjob_ps_pb2 as pb
from strategyjob.ps._transport import Op

__all__ = [
    "GrpcTransport",
    "GrpcWorkerClient",
    "PSTransport",
    "WorkerClient",
    "current",
    "run_ps_ops",
    "use",
    "worker_name",
]

RUN_CLOSURE_STREAM = "/strategyjob.ps.Worker/RunClosureStream"
CREATE_RESOURCE = "/strategyjob.ps.Worker/CreateResource"
WORKER_STATUS = "/strategyjob.ps.Worker/GetStatus"


def worker_name(index: int) -> str:
    """The worker's task name, as errors and logs name it (TensorFlow's form)."""
    return f"/job:worker/replica:0/task:{index}"


@runtime_checkable
class WorkerClient(Protocol):
    """The coordinator's connection to one worker (used by that worker's closure threads).

    ``run_closure`` and ``create_resource`` raise ``errors.UnavailableError`` when the worker
    is lost (the coordinator then puts the closure back, for another worker, and waits for this
    one's return with ``status``); ``errors.PermissionDeniedError`` when it refuses the call.
    """

    name: str
    traffic: list[int]  # bytes sent to / received from the worker so far (benchmarks)

    def status(self, timeout: float) -> str:
        """The worker's incarnation id (a new one after a restart: its resources and shipped
        functions are gone); ``UnavailableError`` if it does not answer within ``timeout``."""
        ...

    def run_closure(self, request: pb.Closure) -> pb.ClosureResult:
        """Run one closure there (closures of one client run one at a time, in order)."""
        ...

    def create_resource(self, request: pb.Closure) -> pb.ClosureResult:
        """Build a per-worker resource (a dataset, an iterator) there."""
        ...

    def close(self) -> None:
        """Release what the calling thread holds open to the worker (its stream)."""
        ...


@runtime_checkable
class PSTransport(Protocol):
    """The cluster as the strategy and the coordinator see it."""

    @property
    def num_ps(self) -> int: ...

    @property
    def num_workers(self) -> int: ...

    def workers(self) -> dict[int, str]:
        """The workers in the cluster now: index -> address (its identity: a task whose address
        changes is a new worker). The coordinator polls it a few times a second to follow a
        resize, so it must be cheap; a transport whose workers are fixed returns the same.
        ``GrpcTransport`` on the chief follows ``STRATEGYJOB_CLUSTER_FILE`` when it is set."""
        ...

    def run_ps_ops(self, task: int, ops: list[Op], *, wait: bool = False) -> list[torch.Tensor]:
        """Run ``ops`` on ps ``task`` in one request; the tensors they return, in order.
        ``wait``: the ps may not be up yet (the cluster is starting), wait for it a while.
        Inside ``_transport.step_scope``, an update carries its step's update id."""
        ...

    def worker(self, index: int) -> WorkerClient:
        """A new client of worker ``index``."""
        ...

    def close(self) -> None:
        """Close every connection (the process is done with the cluster)."""
        ...


# ---------------------------------------------------------------------------------------------
# gRPC


class GrpcTransport:
    """The real cluster over gRPC: a thin face over ``_transport`` (process-wide channels and
    streams), so that its hot path is exactly ``_transport.run_ps_ops``."""

    def __init__(self, cluster: dict[str, list[str]] | None = None) -> None:
        """``cluster`` (``{job: [host:port, ...]}``) configures the process's addresses; None
        uses those configured already (by ``Server`` on a worker)."""
        if cluster is not None:
            _transport.configure(cluster)
        # This transport's workers (a resize changes them here, not in the process-wide
        # addresses, which another strategy's coordinator in this process may still follow).
        self._workers: dict[int, str] | None = (
            None if cluster is None else dict(enumerate(cluster.get("worker", ())))
        )
        # On the chief (a cluster given), the resizes a ``STRATEGYJOB_CLUSTER_FILE`` says.
        self._file = None if cluster is None else _cluster_file.from_env()

    @property
    def num_ps(self) -> int:
        return _transport.num_tasks("ps")

    @property
    def num_workers(self) -> int:
        return len(self.workers())

    def workers(self) -> dict[int, str]:
        if self._file is not None:
            resized = self._file.poll()
            if resized is not None:
                self._workers = resized
        if self._workers is None:  # a worker's process: the addresses its Server configured
            count = _transport.num_tasks("worker")
            return {i: _transport.address("worker", i) for i in range(count)}
        return dict(self._workers)

    def set_workers(self, workers: Mapping[int, str]) -> None:
        """Resize: the workers are now ``workers`` (index -> host:port, sparse indices
        allowed); the coordinator follows within a second (``refresh_workers``)."""
        self._workers = dict(workers)

    def run_ps_ops(self, task: int, ops: list[Op], *, wait: bool = False) -> list[torch.Tensor]:
        return _transport.run_ps_ops(task, ops, wait=wait)

    def worker(self, index: int) -> GrpcWorkerClient:
        address = self.workers().get(index)
        if address is None:
            raise ValueError(f"No worker {index}: the cluster's workers are {self.workers()}")
        return GrpcWorkerClient(index, address)

    def close(self) -> None:
        _transport.close_channels()


class GrpcWorkerClient:
    """A worker over gRPC: closures on a ``RunClosureStream`` call per calling thread (opened
    when needed, dropped when it fails), resources and status on unary calls."""

    def __init__(self, index: int, address: str) -> None:
        self.index = index
        self.address = address
        self.name = worker_name(index)
        self.traffic = [0, 0]
        self._streams = threading.local()
        self._create = _transport.channel(address).unary_unary(CREATE_RESOURCE)
        self._status = _transport.unary(address, WORKER_STATUS, pb.Ping, pb.Status)

    def status(self, timeout: float) -> str:
        try:
            reply = self._status(
                pb.Ping(), metadata=_transport.metadata(), wait_for_ready=True, timeout=timeout
            )
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                _transport.raise_for_rpc_error(exc, self.name)
            raise errors.UnavailableError(
                f"{self.name} is unavailable ({exc.code().name}: {exc.details()})"
            ) from None
        return reply.incarnation

    def run_closure(self, request: pb.Closure) -> pb.ClosureResult:
        return self._call(None, request)

    def create_resource(self, request: pb.Closure) -> pb.ClosureResult:
        return self._call(self._create, request)

    def close(self) -> None:
        stream = getattr(self._streams, "stream", None)
        if stream is not None:
            stream.close()
            self._streams.stream = None

    def _call(self, stub: Callable[..., bytes] | None, request: pb.Closure) -> pb.ClosureResult:
        """``request`` to ``stub`` (a unary method), or on this thread's closure stream when
        ``stub`` is None."""
        stream = None
        try:
            data = request.SerializeToString()
            md = _transport.metadata()
            if stub is not None:
                reply = stub(data, metadata=md)
            else:
                stream = getattr(self._streams, "stream", None)
                if stream is None or stream.metadata != md or not stream.alive():
                    if stream is not None:
                        stream.close()
                    stream = self._streams.stream = _transport.open_stream(
                        self.address, RUN_CLOSURE_STREAM, md
                    )
                reply = stream.call(data)
            self.traffic[0] += len(data)
            self.traffic[1] += len(reply)
            return pb.ClosureResult.FromString(reply)
        except DecodeError as exc:  # as gRPC's own deserializer failing would be
            raise errors.UnavailableError(f"cannot decode the reply: {exc}") from None
        except (grpc.RpcError, StopIteration) as exc:
            if stream is not None:
                stream.close()
                self._streams.stream = None
            if not isinstance(exc, grpc.RpcError):
                raise errors.UnavailableError("the worker ended the stream of closures") from None
            if exc.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
                _transport.raise_for_rpc_error(exc, self.name)
            raise errors.UnavailableError(f"{exc.code().name}: {exc.details()}") from None


# ---------------------------------------------------------------------------------------------
# the process's transport

_default = GrpcTransport()
_current: PSTransport = _default


def use(transport: PSTransport | None) -> PSTransport:
    """Make ``transport`` (None: the gRPC one) the process's; the previous one is returned."""
    global _current
    previous, _current = _current, transport if transport is not None else _default
    return previous


def current() -> PSTransport:
    """The process's transport: what remote variables and parameters call."""
    return _current


def run_ps_ops(task: int, ops: list[Op], *, wait: bool = False) -> list[torch.Tensor]:
    """``current().run_ps_ops(...)``: the remote variables' way to their ps."""
    return _current.run_ps_ops(task, ops, wait=wait)


def close_grpc() -> None:
    """Close the process's gRPC channels and streams (at exit)."""
    _default.close()
