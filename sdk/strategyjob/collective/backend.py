"""The collectives a strategy runs between its workers, behind one small interface.

Why: every strategy needs the same handful of cross-worker operations (reduce, gather,
broadcast the chief's values, agree on the end of the input), and only two implementations
of them exist: within one process they are identities, across processes they run on a
:class:`~strategyjob.collective.process_group.CollectiveGroup`, over the whole cluster or over
a torch sub-group (TPUStrategy's replica dimension). A strategy's ``extended.collectives``
holds one; the code above (reductions, gathers, variables, input, gradient buckets,
checkpoints) calls it without knowing which.

``CollectiveBackend`` is a ``typing.Protocol`` rather than a base class so that tests can hand
a strategy any object with these members (a fake peer), and so that an implementation may bind
its hot-path methods straight to the group's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from strategyjob._reduce import ReduceOp

if TYPE_CHECKING:
    from strategyjob.collective.process_group import CollectiveGroup

__all__ = [
    "IN_PROCESS",
    "CollectiveBackend",
    "InProcessCollectives",
    "PendingAllReduce",
    "ProcessGroupCollectives",
    "reduce_op_name",
]


class PendingAllReduce(Protocol):
    """An all-reduce started by :meth:`CollectiveBackend.all_reduce_async`."""

    def wait(self) -> None:
        """Return once the result is in place; raise the collective's error, if any."""


@runtime_checkable
class CollectiveBackend(Protocol):
    """Collectives between the workers of one strategy (each worker: one process).

    Every worker issues the same calls in the same order (the strategy guarantees it). Inputs
    are never modified unless a method says so.
    """

    #: Workers taking part in the reductions and gathers (1: this process alone).
    num_workers: int
    #: Size of a gradient bucket in bytes (0: ``grad_sync``'s default).
    bucket_bytes: int
    #: Seconds a collective (or replicas at a merge call) may wait; None: forever.
    timeout_seconds: float | None

    def all_reduce(self, tensors: Sequence[torch.Tensor], op: ReduceOp | str) -> list[torch.Tensor]:
        """``op`` ("sum"/"mean" or a ``ReduceOp``) of each tensor across workers. The results
        may be the inputs themselves when nothing is reduced."""

    def all_reduce_async(self, flat: torch.Tensor) -> PendingAllReduce:
        """Start a SUM all-reduce of ``flat`` in place; ``wait()`` on the result is bounded by
        :attr:`timeout_seconds`."""

    def all_gather(self, tensor: torch.Tensor, axis: int) -> torch.Tensor:
        """Every worker's ``tensor`` concatenated along ``axis`` in worker order (sizes along
        ``axis`` may differ between workers)."""

    def broadcast_from_chief(self, tensor: torch.Tensor) -> torch.Tensor:
        """A copy of the chief's ``tensor`` (the input itself when there are no peers)."""

    def broadcast_from_chief_in_place(self, tensors: Sequence[torch.Tensor]) -> None:
        """Overwrite ``tensors`` with the chief's values (module parameters)."""

    def any_has_data(self, flag: bool) -> bool:
        """True if ``flag`` is true on any worker."""

    def start_any_has_data(self, flag: bool) -> Callable[[], bool]:
        """Start :meth:`any_has_data`; calling the result gives the answer (a worker that knows
        the answer need not wait for it)."""

    def least_count(self, count: int | None) -> int:
        """How many steps of a pass of the input every worker is known to have, given this
        worker's exact step ``count`` (None: unknown): the smallest count, 0 if any is unknown.
        A distributed iterator skips the per-step :meth:`start_any_has_data` for that many
        steps; 0 keeps it at every step (what a lone worker answers: its agreement is free)."""


_OP_NAMES: dict[Any, str] = {
    ReduceOp.SUM: "sum",
    ReduceOp.MEAN: "mean",
    "sum": "sum",
    "mean": "mean",
    "SUM": "sum",
    "MEAN": "mean",
}


def reduce_op_name(op: ReduceOp | str) -> str:
    """``"sum"`` or ``"mean"`` for ``op``; anything else is refused in one line."""
    try:
        return _OP_NAMES[op]
    except (KeyError, TypeError):
        raise ValueError(
            f"Unsupported reduce op {op!r} for a collective: use ReduceOp.SUM, ReduceOp.MEAN, "
            '"sum" or "mean".'
        ) from None


class _Done:
    """The handle of an all-reduce that had nothing to wait for."""

    __slots__ = ()

    def wait(self) -> None:
        return None


_DONE = _Done()


class InProcessCollectives:
    """This process is the only worker: every collective is an identity.

    The strategies of one process (Mirrored, OneDevice, CentralStorage, the default strategy,
    MultiWorkerMirrored in local mode) hold one; ``timeout_seconds`` still bounds how long
    local replicas wait for each other at a merge call.
    """

    __slots__ = ("bucket_bytes", "timeout_seconds")

    num_workers = 1

    def __init__(self, timeout_seconds: float | None = None, bucket_bytes: int = 0) -> None:
        self.timeout_seconds = timeout_seconds
        self.bucket_bytes = bucket_bytes

    def __repr__(self) -> str:
        return f"InProcessCollectives(timeout_seconds={self.timeout_seconds!r})"

    def __deepcopy__(self, memo: dict) -> InProcessCollectives:
        return self  # immutable in use; copies of a strategy share it

    def all_reduce(self, tensors: Sequence[torch.Tensor], op: ReduceOp | str) -> list[torch.Tensor]:
        return list(tensors)

    def all_reduce_async(self, flat: torch.Tensor) -> PendingAllReduce:
        return _DONE

    def all_gather(self, tensor: torch.Tensor, axis: int) -> torch.Tensor:
        return tensor

    def broadcast_from_chief(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def broadcast_from_chief_in_place(self, tensors: Sequence[torch.Tensor]) -> None:
        return None

    def any_has_data(self, flag: bool) -> bool:
        return bool(flag)

    def start_any_has_data(self, flag: bool) -> Callable[[], bool]:
        answer = bool(flag)
        return lambda: answer

    def least_count(self, count: int | None) -> int:
        return 0  # keep the per-step agreement: it costs nothing here


#: The backend of strategies that never have peers (no timeout, default bucket size).
IN_PROCESS = InProcessCollectives()


class _Pending:
    """An in-flight all-reduce on a :class:`CollectiveGroup`; ``wait()`` is bounded by the
    group's timeout and names a dead peer."""

    __slots__ = ("_group", "_work")

    def __init__(self, group: CollectiveGroup, work: Any) -> None:
        self._group = group
        self._work = work

    def wait(self) -> None:
        self._group.wait(self._work, "gradient all-reduce")


class ProcessGroupCollectives:
    """Collectives of a multi-process cluster on its :class:`CollectiveGroup`.

    Reductions and gathers run across ``sub_group`` (a torch process group; None: every
    process of the cluster). Broadcasts from the chief and the agreements on the input
    (:meth:`any_has_data`, :meth:`least_count`) always involve every process of the cluster:
    each needs the chief's parameters and must stop at the same step, also those outside the
    reduction group (TPUStrategy's other logical devices). ``chief`` is the chief's rank in
    the cluster (the default group); ``workers`` the sub-group's members (cluster ranks) in
    worker order, the order of :meth:`all_gather` (default: ascending rank).
    """

    def __init__(
        self,
        group: CollectiveGroup,
        sub_group: Any = None,
        chief: int = 0,
        workers: Sequence[int] | None = None,
    ) -> None:
        self.group = group
        self.chief = int(chief)
        reducer = group if sub_group is None else group.over(sub_group, workers)
        self._reducer = reducer
        self.num_workers = int(reducer.world_size)
        self.bucket_bytes = int(group.options.bytes_per_pack or 0)
        self.timeout_seconds = group.options.timeout_seconds
        self._alone = self.num_workers == 1
        # hot path: bound once
        self._all_reduce = reducer.all_reduce
        self._start = reducer.all_reduce_async
        self.start_any_has_data = group.any_async
        self.any_has_data = group.any
        self.least_count = group.least_count

    def __repr__(self) -> str:
        return (
            f"ProcessGroupCollectives(num_workers={self.num_workers}, chief={self.chief}, "
            f"timeout_seconds={self.timeout_seconds!r})"
        )

    def __deepcopy__(self, memo: dict) -> ProcessGroupCollectives:
        return self  # one process group per process: copies of a strategy share it

    def all_reduce(self, tensors: Sequence[torch.Tensor], op: ReduceOp | str) -> list[torch.Tensor]:
        try:
            name = _OP_NAMES[op]  # inline: the loss is reduced every step
        except (KeyError, TypeError):
            name = reduce_op_name(op)  # raises the one-line error
        if self._alone:
            return list(tensors)
        return self._all_reduce(tensors, name)

    def all_reduce_async(self, flat: torch.Tensor) -> PendingAllReduce:
        if self._alone:
            return _DONE
        return _Pending(self._reducer, self._start(flat))

    def all_gather(self, tensor: torch.Tensor, axis: int) -> torch.Tensor:
        if self._alone:
            return tensor
        return self._reducer.all_gather(tensor, axis)

    def broadcast_from_chief(self, tensor: torch.Tensor) -> torch.Tensor:
        result = torch.as_tensor(tensor).detach().clone()
        self.group.broadcast([result], src=self.chief)
        return result

    def broadcast_from_chief_in_place(self, tensors: Sequence[torch.Tensor]) -> None:
        if tensors:
            self.group.broadcast(list(tensors), src=self.chief)

    # bound to the group's methods in __init__ (declared here for readers and type checkers)
    any_has_data: Callable[[bool], bool]
    start_any_has_data: Callable[[bool], Callable[[], bool]]
    least_count: Callable[[int | None], int]
