"""``InMemoryTransport``: a whole parameter-server cluster inside this process, for tests.

The ps tasks are the servers' own stores (``ps_server.Store``: the same op execution, update ids
and errors as a ps process) and the workers the servers' own closure runners
(``ps_server.WorkerService``, each with its own parameters and resources), reached through the
same encoded requests as over gRPC, without sockets, threads of their own or subprocesses.
Tests make a worker or a ps unavailable (``set_worker_available``, ``lose_worker_on_next``,
``set_ps_available``) or restart a worker (``restart_worker``); the coordinator then sees the
same ``UnavailableError`` the gRPC transport raises. They resize it too (``add_worker``,
``remove_worker``): the membership the coordinator follows (``workers()``) changes.
"""

from __future__ import annotations

import threading
import uuid

import torch

from strategyjob import errors
from strategyjob.ps import _remote, _transport
from strategyjob.ps import server as ps_server
from strategyjob.ps import strategyjob_ps_pb2 as pb
from strategyjob.ps._cluster import worker_name
from strategyjob.ps._transport import Op

__all__ = ["InMemoryTransport"]


class _Worker:
    """One in-process worker task: its closure runner and its state (one incarnation)."""

    def __init__(self, index: int) -> None:
        self.incarnation = uuid.uuid4().hex
        self.service = ps_server.WorkerService()
        self.service.task_index = index
        self.state = _remote.WorkerState()
        self.available = True
        self.lose_on_next: bool | None = None  # lose it on its next closure: after running?


class InMemoryTransport:
    """``PSTransport`` over ``num_ps`` ps stores and ``num_workers`` workers in this process.

    ``closures`` records ``(worker index, step id)`` of every closure a worker ran (a retried
    closure appears once per attempt that ran), ``resources`` ``(worker index, resource id)``
    of every per-worker resource built.
    """

    def __init__(self, num_workers: int = 2, num_ps: int = 1) -> None:
        if num_workers < 1 or num_ps < 1:
            raise ValueError(
                f"An in-memory cluster needs at least one worker and one ps, got "
                f"num_workers={num_workers}, num_ps={num_ps}"
            )
        self._cond = threading.Condition()
        self._ps = [ps_server.Store(_ps_name(i)) for i in range(num_ps)]
        self._ps_up = [True] * num_ps
        # The worker processes (a removed one may still run, as a terminating pod does) and
        # those in the cluster's membership.
        self._workers = {i: _Worker(i) for i in range(num_workers)}
        self._members = set(self._workers)
        self.closures: list[tuple[int, str]] = []
        self.resources: list[tuple[int, int]] = []
        self._closed = False

    @property
    def num_ps(self) -> int:
        return len(self._ps)

    @property
    def num_workers(self) -> int:
        with self._cond:
            return len(self._members)

    def workers(self) -> dict[int, str]:
        with self._cond:
            return {i: f"in-memory:{i}" for i in sorted(self._members)}

    # -- PSTransport ---------------------------------------------------------------------------
    def run_ps_ops(self, task: int, ops: list[Op], *, wait: bool = False) -> list[torch.Tensor]:
        what = _ps_name(task)
        with self._cond:
            if not 0 <= task < len(self._ps):
                raise ValueError(f"No address for /job:ps/task:{task}: the cluster has no such ps")
            up = self._ps_up[task]
        if not up:
            raise errors.UnavailableError(
                f"{what} is unavailable (UNAVAILABLE: the in-memory ps is down). GRPC error "
                f"information from remote target {what}"
            )
        request = _transport.encode_ops(ops, _transport.next_update_id(task, ops))
        try:
            reply = self._ps[task].run(request)
        except ps_server.PS_REQUEST_ERRORS as exc:
            status = ps_server.ps_status(exc)
            _transport.raise_for_status(status.code, status.details, what)
            raise  # (raise_for_status always raises)
        return _transport.decode_results(reply)

    def worker(self, index: int) -> _WorkerClient:
        with self._cond:
            if index not in self._members:
                raise ValueError(f"No worker {index}: the cluster has {sorted(self._members)}")
        return _WorkerClient(self, index)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for worker in self._workers.values():
                worker.available = False
            self._cond.notify_all()

    # -- resizing ------------------------------------------------------------------------------
    def add_worker(self, index: int) -> None:
        """Worker ``index`` joins the cluster: a new process (unless one still runs there from
        before its removal, which then serves again, its state kept)."""
        with self._cond:
            if index in self._members:
                raise ValueError(f"Worker {index} is already in the cluster")
            if index not in self._workers or not self._workers[index].available:
                self._workers[index] = _Worker(index)
            self._members.add(index)
            self._cond.notify_all()

    def remove_worker(self, index: int) -> None:
        """Worker ``index`` leaves the cluster's membership; its process keeps serving (a
        terminating pod finishing its closure) until ``set_worker_available(index, False)``."""
        with self._cond:
            if index not in self._members:
                raise ValueError(f"Worker {index} is not in the cluster")
            self._members.discard(index)

    # -- faults --------------------------------------------------------------------------------
    def set_worker_available(self, index: int, available: bool) -> None:
        """Make worker ``index`` unreachable (its calls raise ``UnavailableError``, as a lost
        worker's do) or reachable again (the same incarnation: its state kept)."""
        with self._cond:
            self._workers[index].available = available
            self._cond.notify_all()

    def lose_worker_on_next(self, index: int, *, after_running: bool) -> None:
        """Lose worker ``index`` on its next closure: before running it (the call fails as a
        broken connection does) or ``after_running`` it (its ps updates are applied, the reply
        never comes). The call raises ``UnavailableError``; the worker stays unavailable until
        ``set_worker_available`` or ``restart_worker``."""
        with self._cond:
            self._workers[index].lose_on_next = after_running

    def worker_available(self, index: int) -> bool:
        with self._cond:
            return self._workers[index].available

    def restart_worker(self, index: int) -> None:
        """Worker ``index`` comes back as a new incarnation: no functions, no resources."""
        with self._cond:
            self._workers[index] = _Worker(index)
            self._cond.notify_all()

    def set_ps_available(self, task: int, available: bool) -> None:
        """Make ps ``task`` fail every request with ``UnavailableError`` (or serve again)."""
        with self._cond:
            self._ps_up[task] = available

    # -- the workers' side -----------------------------------------------------------------------
    def _up(self, index: int) -> _Worker:
        with self._cond:
            worker = self._workers[index]
            if not worker.available:
                raise errors.UnavailableError(f"{worker_name(index)} is unavailable (lost)")
            return worker

    def worker_status(self, index: int, timeout: float) -> str:
        """Worker ``index``'s incarnation, once it is reachable (what its client's ``status``
        answers); ``UnavailableError`` after ``timeout`` seconds."""
        with self._cond:
            self._cond.wait_for(lambda: self._workers[index].available or self._closed, timeout)
            if not self._workers[index].available:
                raise errors.UnavailableError(
                    f"{worker_name(index)} is unavailable (no answer within {timeout:g} s)"
                )
            return self._workers[index].incarnation

    def run_on_worker(self, index: int, request: pb.Closure, *, resource: bool) -> pb.ClosureResult:
        """Run ``request`` on worker ``index``: a closure, or the creation of a per-worker
        ``resource`` (what its client's ``run_closure`` / ``create_resource`` send)."""
        worker = self._up(index)
        lose = None
        if not resource:
            with self._cond:
                lose, worker.lose_on_next = worker.lose_on_next, None
        if lose is False:
            self.set_worker_available(index, False)
            raise errors.UnavailableError(f"{worker_name(index)} is unavailable (lost)")
        # Through the wire format, as over gRPC: what does not serialize fails here too.
        request = pb.Closure.FromString(request.SerializeToString())
        with _remote.worker_state_scope(worker.state):
            if resource:
                reply = worker.service.create_resource(request, None)
            else:
                reply = worker.service.run_closure(request, None)
        with self._cond:
            if resource:
                self.resources.append((index, request.resource_id))
            else:
                self.closures.append((index, request.step_id))
        if lose:
            self.set_worker_available(index, False)
            raise errors.UnavailableError(f"{worker_name(index)} was lost before replying")
        return pb.ClosureResult.FromString(reply.SerializeToString())


class _WorkerClient:
    """``WorkerClient`` of an in-process worker."""

    def __init__(self, transport: InMemoryTransport, index: int) -> None:
        self._transport = transport
        self.index = index
        self.name = worker_name(index)
        self.traffic = [0, 0]

    def status(self, timeout: float) -> str:
        return self._transport.worker_status(self.index, timeout)

    def run_closure(self, request: pb.Closure) -> pb.ClosureResult:
        return self._transport.run_on_worker(self.index, request, resource=False)

    def create_resource(self, request: pb.Closure) -> pb.ClosureResult:
        return self._transport.run_on_worker(self.index, request, resource=True)

    def close(self) -> None:
        pass


def _ps_name(task: int) -> str:
    return f"/job:ps/replica:0/task:{task}"
