"""Input types the sharding understands beyond plain iterables.

``FileDataset`` declares the files it reads, so ``AutoShardPolicy.FILE`` (and AUTO) can give
each worker its own files instead of making every worker read everything. ``shard`` keeps every
n-th global batch of any iterable and accepts ``SHARD_HINT`` placeholders for
``AutoShardPolicy.HINT``. ``NumpyDataset`` (what ``experimental_make_numpy_dataset`` returns)
serves in-memory arrays as examples without copying them.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch

from .. import _nest
from .options import SHARD_HINT

__all__ = ["FileDataset", "NumpyBatches", "NumpyDataset", "ShardedDataset", "shard"]

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
        sharded: FileDataset = self.with_files(self.files)  # a FileDataset sets its own shard
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


def _shared_tensor(leaf: Any) -> torch.Tensor:
    """A tensor over ``leaf``'s memory where torch can view it, else over one copy of it.

    ``torch.from_numpy`` shares memory for writable, native-byte-order arrays with
    non-negative strides and a dtype torch has; read-only, byte-swapped or reversed arrays are
    copied once (viewing read-only memory would let an in-place op write into it).
    """
    if isinstance(leaf, torch.Tensor):
        return leaf
    array = np.asarray(leaf)
    if array.ndim == 0:
        raise ValueError(
            "experimental_make_numpy_dataset slices its arrays into examples along dimension 0, "
            f"so they need rank >= 1; got a scalar {leaf!r} (Unbatching a tensor is only "
            "supported for rank >= 1)."
        )
    viewable = (
        array.flags.writeable
        and array.dtype.isnative
        and all(stride >= 0 for stride in array.strides)
    )
    if not viewable:
        array = np.array(array, dtype=array.dtype.newbyteorder("="), order="C", copy=True)
    return torch.from_numpy(array)


class NumpyDataset(torch.utils.data.Dataset):
    """The examples of a nest of arrays, sliced along dim 0 (TF's ``from_tensor_slices``).

    What ``Strategy.experimental_make_numpy_dataset`` returns. The arrays are shared with torch,
    not copied (see :func:`_shared_tensor`). Batch it for ``experimental_distribute_dataset``
    with a ``DataLoader(ds, batch_size=GLOBAL_BATCH)`` or, as in TF, ``ds.batch(GLOBAL_BATCH)``
    (views of the arrays, no copy per batch). A top-level list of arrays is stacked into one
    array, as TF does.
    """

    def __init__(self, numpy_input: Any) -> None:
        if isinstance(numpy_input, list):
            numpy_input = np.stack(numpy_input)
        self._structure = _nest.map_structure(_shared_tensor, numpy_input)
        lengths = {len(leaf) for leaf in _nest.flatten(self._structure)}
        if len(lengths) != 1:
            raise ValueError(
                "All arrays given to experimental_make_numpy_dataset must have the same length "
                f"along dimension 0; got lengths {sorted(lengths)}."
            )
        self._length = lengths.pop()

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> Any:
        return _nest.map_structure(lambda leaf: leaf[index], self._structure)

    def __iter__(self) -> Iterator[Any]:
        """The examples in order (unbatched, like iterating TF's dataset)."""
        for index in range(self._length):
            yield self[index]

    def batch(self, batch_size: int, drop_remainder: bool = False) -> NumpyBatches:
        """Consecutive examples in batches of ``batch_size`` (``tf.data.Dataset.batch``)."""
        return NumpyBatches(self._structure, self._length, batch_size, drop_remainder)


class NumpyBatches:
    """``NumpyDataset.batch(n)``: slices of the arrays (views), the last one partial unless
    ``drop_remainder``. Declares ``batch_size``, so distributing it splits every global batch
    the way TF splits a dataset batched with that size."""

    def __init__(self, structure: Any, length: int, batch_size: int, drop_remainder: bool) -> None:
        if isinstance(batch_size, bool) or int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        self._structure = structure
        self._length = length
        self.batch_size = int(batch_size)
        self.drop_remainder = bool(drop_remainder)

    def __len__(self) -> int:
        full, rest = divmod(self._length, self.batch_size)
        return full + (1 if rest and not self.drop_remainder else 0)

    def __iter__(self) -> Iterator[Any]:
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            yield _slice_nest(self._structure, start, min(start + self.batch_size, self._length))


def _slice_nest(structure: Any, start: int, stop: int) -> Any:
    return _nest.map_structure(lambda leaf: leaf[start:stop], structure)
