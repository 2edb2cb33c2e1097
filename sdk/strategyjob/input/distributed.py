"""``DistributedDataset`` and ``DistributedIterator``: per-replica batches, one step at a time.

Each step takes one entry per local replica from a step stream (``rebatch.py``). While any
worker still has data, replicas whose input ran out get empty batches (dim 0 of size 0) so that
every replica keeps taking part in the collectives of the step; when no worker has data the
iterator ends on all workers at the same step.

Knowing that takes an agreement between workers. Where every worker knows exactly how many
steps its pass has (a DataLoader over a map-style dataset), they exchange the counts once, at
the first step of the pass, and agree again only for the steps beyond the smallest count: one
agreement per step beyond it, none before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from .. import _nest
from .._devices import Topology
from ..errors import InvalidArgumentError, OutOfRangeError
from .structure import empty_like, to_device

__all__ = ["DistributedDataset", "DistributedIterator", "InputExtended", "Optional"]


class _InputAgreement(Protocol):
    """The agreements of a ``collective.backend.CollectiveBackend`` the input layer uses."""

    def least_count(self, count: int | None) -> int: ...

    def start_any_has_data(self, flag: bool) -> Callable[[], bool]: ...


class InputExtended(Protocol):
    """What the input layer asks of a strategy's ``extended``: where its replicas are, and how
    workers agree on the end of the input (``strategies.base.StrategyExtended`` declares it)."""

    @property
    def topology(self) -> Topology: ...

    @property
    def collectives(self) -> _InputAgreement: ...


_NEXT_IN_REPLICA_FN = (
    "next(iterator) should be called from outside of replica_fn. e.g. "
    "strategy.run(replica_fn, args=(next(iterator),))"
)
_END_OF_SEQUENCE = "End of sequence"
_END = object()


def _torch_device(device: Any) -> torch.device:
    device = getattr(device, "torch_device", device)
    return device if isinstance(device, torch.device) else torch.device(device)


def _in_replica_fn() -> bool:
    from .._context import in_replica_context_of_real_strategy

    return in_replica_context_of_real_strategy()


class Optional:
    """A maybe-absent value (``tf.experimental.Optional``), from ``get_next_as_optional()``."""

    __slots__ = ("_value",)

    def __init__(self, value: Any = _END) -> None:
        self._value = value

    @staticmethod
    def from_value(value: Any) -> Optional:
        return Optional(value)

    @staticmethod
    def empty() -> Optional:
        return Optional()

    def has_value(self) -> bool:
        return self._value is not _END

    def get_value(self) -> Any:
        if self._value is _END:
            raise InvalidArgumentError(
                "The Optional has no value: the iterator reached the end of its input. Check "
                "has_value() before calling get_value()."
            )
        return self._value

    def __repr__(self) -> str:
        return f"Optional({self._value!r})" if self.has_value() else "Optional(<empty>)"


class DistributedIterator:
    """Iterates per-replica batches: a ``PerReplica`` (per tensor of the element structure) when
    this worker has several replicas, the plain batch when it has one."""

    def __init__(
        self,
        steps: Iterator[list[Any]],
        extended: InputExtended,
        *,
        fetch_to_device: bool,
        step_count: int | None = None,
    ) -> None:
        self._steps = steps
        self._step_count = step_count  # this worker's steps in the pass, where known exactly
        self._agreed_steps: int | None = None  # steps every worker has data for (first next)
        self._taken = 0
        self._extended = extended
        self._devices = tuple(_torch_device(d) for d in extended.topology.local_devices)
        self._fetch_to_device = fetch_to_device
        self._last_present: Any = None  # shapes the empty batches of exhausted replicas
        self._finished = False
        self._unconfirmed: Callable[[], bool] | None = None  # the last step's agreement

    def __iter__(self) -> DistributedIterator:
        return self

    def __next__(self) -> Any:
        try:
            return self.get_next()
        except OutOfRangeError:
            raise StopIteration from None

    def get_next(self) -> Any:
        """The next per-replica batch; ``OutOfRangeError`` at the end of the input."""
        value = self._next_or_end()
        if value is _END:
            raise OutOfRangeError(_END_OF_SEQUENCE)
        return value

    def get_next_as_optional(self) -> Optional:
        """The next per-replica batch as an ``Optional``, empty at the end of the input."""
        return Optional(self._next_or_end())

    def _next_or_end(self) -> Any:
        if _in_replica_fn():
            raise ValueError(_NEXT_IN_REPLICA_FN)
        if self._finished:
            return _END
        if self._agreed_steps is None:
            self._agreed_steps = self._extended.collectives.least_count(self._step_count)
        step = next(self._steps, None)
        if self._taken < self._agreed_steps:
            if step is None:
                raise InvalidArgumentError(
                    f"The input of worker {self._extended.topology.worker_index} ended after "
                    f"{self._taken} steps although its len() promised {self._step_count}, so "
                    "the other workers cannot know when this pass ends. Give the DataLoader a "
                    "sampler whose __len__ is the number of indices it yields."
                )
            self._taken += 1
            return self._assemble(step)
        if step is None:
            step = [None] * len(self._devices)
        has_data = any(entry is not None for entry in step)
        if self._unconfirmed is not None:
            self._unconfirmed()  # done long ago; raises if the agreement failed
            self._unconfirmed = None
        # Every worker takes part in one agreement per step, but only a worker without data
        # waits for its answer: one with data knows it already (some worker has data), so the
        # round trip overlaps with its step instead of delaying it.
        answer = self._extended.collectives.start_any_has_data(has_data)
        if has_data:
            self._unconfirmed = answer
        elif not answer():
            self._finished = True
            return _END
        return self._assemble(step)

    def _assemble(self, step: list[Any]) -> Any:
        present = next((entry for entry in step if entry is not None), None)
        if present is not None:
            self._last_present = present
        if any(entry is None for entry in step):
            if self._last_present is None:
                raise InvalidArgumentError(
                    f"Worker {self._extended.topology.worker_index} has no input at all while "
                    "other workers still have data, so its replicas have no batch to shape their "
                    "empty batches after. Give every worker a non-empty share of the input "
                    "(e.g. more, or more evenly sized, files)."
                )
            empty = empty_like(self._last_present)
            step = [empty if entry is None else entry for entry in step]
        if self._fetch_to_device:
            step = [to_device(entry, device) for entry, device in zip(step, self._devices)]
        if len(step) == 1:
            return step[0]
        from .._values import PerReplica

        return _nest.map_structure(lambda *values: PerReplica(values), *step)


class DistributedDataset:
    """An iterable of per-replica batches; each ``iter()`` starts a new pass over the input.

    Not a dataset: it offers no further transformations (as in TensorFlow).
    """

    def __init__(
        self,
        make_pass: Callable[[], tuple[Iterator[list[Any]], int | None]],
        extended: InputExtended,
        *,
        fetch_to_device: bool,
    ) -> None:
        self._make_pass = make_pass  # a new pass: its steps, and how many where known exactly
        self._extended = extended
        self._fetch_to_device = fetch_to_device

    def __iter__(self) -> DistributedIterator:
        steps, count = self._make_pass()
        return DistributedIterator(
            steps, self._extended, fetch_to_device=self._fetch_to_device, step_count=count
        )

    def __repr__(self) -> str:
        count = len(self._extended.topology.local_devices)
        return f"<DistributedDataset over {count} local replica(s)>"
