"""Input types the sharding understands beyond plain iterables.

``FileDataset`` declares the files it reads, so ``AutoShardPolicy.FILE`` (and AUTO) can give
each worker its own files instead of making every worker read everything. ``shard`` keeps every
n-th global batch of any iterable and accepts ``SHARD_HINT`` placeholders for
``AutoShardPolicy.HINT``.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

from .. import _nest
from .options import SHARD_HINT

__all__ = ["FileDataset", "ShardedDataset", "shard"]

PathLike = str | os.PathLike


def _check_shard(num_shards: int, index: int) -> None:
    if num_shards == SHARD_HINT or index == SHARD_HINT:
        if num_shards != index:
            raise ValueError(
                "shard(num_shards, index): use SHARD_HINT for both arguments or for neither, "
                f"got ({num_shards}, {index})"
            )
        return
    if num_shards < 1 or not 0 <= index < num_shards:
        raise ValueError(
            f"shard(num_shards, index) needs num_shards >= 1 and 0 <= index < num_shards, "
            f"got ({num_shards}, {index})"
        )


def _stack(examples: list[Any]) -> Any:
    def stack(*leaves: Any) -> torch.Tensor:
        return torch.stack([torch.as_tensor(x) for x in leaves])

    return _nest.map_structure(stack, *examples)


class FileDataset:
    """Examples read from a list of files, batched with the global batch size.

    ``reader(path)`` returns an iterable of examples (a tensor, or a nested tuple/list/dict of
    tensors, without a batch dimension); consecutive examples, across file boundaries, are
    stacked into batches of ``batch_size`` (the last one partial unless ``drop_remainder``).
    Because it declares ``files``, ``experimental_distribute_dataset`` shards it by file.
    """

    def __init__(
        self,
        files: Sequence[PathLike],
        reader: Callable[[str], Iterable[Any]],
        batch_size: int,
        drop_remainder: bool = False,
    ) -> None:
        if isinstance(files, (str, os.PathLike)):
            raise TypeError("FileDataset takes a list of files; wrap a single path in a list.")
        if not callable(reader):
            raise TypeError(f"FileDataset reader must be callable, got {type(reader).__name__}")
        if int(batch_size) < 1:
            raise ValueError(f"FileDataset batch_size must be >= 1, got {batch_size}")
        self._files = tuple(os.fspath(f) for f in files)
        self._reader = reader
        self.batch_size = int(batch_size)
        self.drop_remainder = bool(drop_remainder)
        self._shard: tuple[int, int] = (1, 0)

    @property
    def files(self) -> tuple[str, ...]:
        """The files this dataset reads, after any concrete ``shard``."""
        num_shards, index = self._shard
        if num_shards == SHARD_HINT:
            return self._files
        return self._files[index::num_shards]

    @property
    def has_shard_hint(self) -> bool:
        return self._shard[0] == SHARD_HINT

    def with_files(self, files: Sequence[PathLike]) -> FileDataset:
        """The same reader and batching over other files (no shard applied)."""
        return FileDataset(files, self._reader, self.batch_size, self.drop_remainder)

    def shard(self, num_shards: int, index: int) -> FileDataset:
        """Keep files ``index, index + num_shards, …``; ``SHARD_HINT`` defers to the strategy."""
        _check_shard(num_shards, index)
        sharded = self.with_files(self.files)
        sharded._shard = (num_shards, index)
        return sharded

    def resolve_shard_hint(self, num_shards: int, index: int) -> FileDataset:
        """Replace a ``SHARD_HINT`` placeholder by a concrete shard."""
        if not self.has_shard_hint:
            return self
        return self.with_files(self._files).shard(num_shards, index)

    def examples(self) -> Iterator[Any]:
        """Every example of every file, in file order."""
        for path in self.files:
            yield from self._reader(path)

    def __iter__(self) -> Iterator[Any]:
        pending: list[Any] = []
        for example in self.examples():
            pending.append(example)
            if len(pending) == self.batch_size:
                yield _stack(pending)
                pending = []
        if pending and not self.drop_remainder:
            yield _stack(pending)

    def __repr__(self) -> str:
        return f"FileDataset(files={list(self.files)!r}, batch_size={self.batch_size})"


class ShardedDataset:
    """Every ``num_shards``-th element of ``source``, starting at ``index`` (``Dataset.shard``)."""

    def __init__(self, source: Iterable[Any], num_shards: int, index: int) -> None:
        _check_shard(num_shards, index)
        self.source = source
        self.num_shards = num_shards
        self.index = index

    @property
    def batch_size(self) -> int | None:
        return getattr(self.source, "batch_size", None)

    @property
    def has_shard_hint(self) -> bool:
        return self.num_shards == SHARD_HINT

    def resolve_shard_hint(self, num_shards: int, index: int) -> ShardedDataset:
        if not self.has_shard_hint:
            return self
        return ShardedDataset(self.source, num_shards, index)

    def __iter__(self) -> Iterator[Any]:
        num_shards, index = (1, 0) if self.has_shard_hint else (self.num_shards, self.index)
        return itertools.islice(iter(self.source), index, None, num_shards)


def shard(dataset: Iterable[Any], num_shards: int, index: int) -> ShardedDataset:
    """``Dataset.shard`` for any iterable of batches; ``shard(ds, SHARD_HINT, SHARD_HINT)`` lets
    ``AutoShardPolicy.HINT`` fill in ``(num_workers, worker_index)``."""
    return ShardedDataset(dataset, num_shards, index)
