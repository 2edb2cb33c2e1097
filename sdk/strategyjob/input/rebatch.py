"""Streams that turn global batches into per-replica sub-batches and group them into steps.

A *step* is a list with one entry per local replica: a (possibly empty) batch, or None when the
replica's input ran out. ``DistributedIterator`` turns the Nones into empty batches while any
worker still has data.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from .splitting import ceil_fill_sizes, offsets
from .structure import batch_size_of, concat, slice_batch, tensors_of

__all__ = [
    "balanced_sub_batches",
    "ceil_fill_sub_batches",
    "group_steps",
    "round_robin",
    "zip_steps",
]

Step = list[Any]


def checked_batches(batches: Iterable[Any], num_replicas: int) -> Iterator[tuple[Any, int]]:
    """``(batch, size)`` for every input batch, rejecting input without a batch dimension."""
    for batch in batches:
        batch = tensors_of(batch, num_replicas)
        yield batch, batch_size_of(batch, num_replicas)


def ceil_fill_sub_batches(batches: Iterable[Any], num_replicas: int) -> Iterator[Any]:
    """Exactly ``R`` sub-batches per input batch, chunks of ``ceil(b / R)`` then empty ones."""
    for batch, size in checked_batches(batches, num_replicas):
        for start, stop in offsets(ceil_fill_sizes(size, num_replicas)):
            yield slice_batch(batch, start, stop)


def balanced_sub_batches(
    batches: Iterable[Any], sizes: list[int], num_replicas: int
) -> Iterator[Any]:
    """Sub-batches whose sizes cycle through ``sizes`` (TF's ``rebatch(batch_sizes)``).

    Rows flow across input batches as if the input were unbatched and re-batched, so a short
    batch in the middle of the stream borrows rows from the next one; at the end of the input
    the last sub-batch is partial and the stream stops.
    """
    source = checked_batches(batches, num_replicas)
    pending: collections.deque[tuple[Any, int]] = collections.deque()
    rows = 0
    exhausted = False
    for size in itertools.cycle(sizes):
        while not exhausted and (rows == 0 or rows < size):
            item = next(source, None)
            if item is None:
                exhausted = True
            else:
                pending.append(item)
                rows += item[1]
        if rows == 0:
            return
        need = min(size, rows)
        parts: list[Any] = []
        while need > 0 or not parts:
            head, head_rows = pending[0]
            if head_rows <= need:
                parts.append(head)
                pending.popleft()
                need -= head_rows
                rows -= head_rows
            else:
                parts.append(slice_batch(head, 0, need))
                pending[0] = (slice_batch(head, need, head_rows), head_rows - need)
                rows -= need
                need = 0
        yield concat(parts)


def round_robin(stream: Iterable[Any], num_shards: int, index: int) -> Iterator[Any]:
    """Elements ``index, index + num_shards, …`` of ``stream`` (``Dataset.shard``)."""
    if num_shards == 1:
        return iter(stream)
    return itertools.islice(stream, index, None, num_shards)


def group_steps(stream: Iterable[Any], num_local_replicas: int) -> Iterator[Step]:
    """Consecutive sub-batches, ``Rw`` per step; the last step is padded with None."""
    iterator = iter(stream)
    while True:
        step = list(itertools.islice(iterator, num_local_replicas))
        if not step:
            return
        yield step + [None] * (num_local_replicas - len(step))


def exact_length(source: Any) -> int | None:
    """How many elements ``source`` yields, where its ``len()`` is exact: a list or a tuple,
    or a DataLoader over a map-style dataset (its batch sampler's length). None otherwise: an
    iterable-style dataset's ``len()`` is only a hint."""
    if isinstance(source, (list, tuple)):
        return len(source)
    if isinstance(source, DataLoader) and not isinstance(source.dataset, IterableDataset):
        try:
            return len(source)
        except TypeError:  # a sampler without a length
            return None
    return None


def step_count(num_elements: int | None, num_local_replicas: int) -> int | None:
    """The number of steps :func:`group_steps` makes of ``num_elements`` (None: unknown)."""
    if num_elements is None:
        return None
    return -(-num_elements // num_local_replicas)


def zip_steps(streams: list[Iterable[Any]]) -> Iterator[Step]:
    """One element from each replica's own stream per step (PER_REPLICA input)."""
    iterators: list[Iterator[Any] | None] = [iter(s) for s in streams]
    while True:
        step: Step = []
        for i, iterator in enumerate(iterators):
            value = None if iterator is None else next(iterator, None)
            if value is None:
                iterators[i] = None
            step.append(value)
        if all(iterator is None for iterator in iterators):
            return
        yield step
