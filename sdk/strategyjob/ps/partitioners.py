"""Variable partitioners (``tf.distribute.experimental.partitioners``).

A partitioner is called as ``partitioner(shape=torch.Size, dtype=torch.dtype)`` and returns the
number of partitions per axis. Only the first axis is ever split; ``div_partition`` gives the
rows of each shard the way TensorFlow's "div" strategy does.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from typing import Any

import torch

__all__ = [
    "FixedShardsPartitioner",
    "MaxSizePartitioner",
    "MinSizePartitioner",
    "Partitioner",
    "div_partition",
    "num_partitions",
]


def _element_size(dtype: Any, bytes_per_string: int) -> int:
    if dtype in (str, bytes, "string"):
        return bytes_per_string
    return torch.empty((), dtype=dtype).element_size()


def _num_elements(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


class Partitioner(abc.ABC):
    """Base class of partitioners: ``__call__(shape, dtype, axis=0)`` returns a per-axis list."""

    @abc.abstractmethod
    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        """The number of partitions along each axis of a variable of ``shape``."""


class FixedShardsPartitioner(Partitioner):
    """Split along ``axis`` into ``num_shards`` shards (fewer when the axis is shorter)."""

    def __init__(self, num_shards: int) -> None:
        self._num_shards = num_shards

    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        result = [1] * len(shape)
        result[axis] = min(self._num_shards, int(shape[axis]))
        return result


def _check_positive(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"Argument `{name}` must be positive. Received: {value}")


class MinSizePartitioner(Partitioner):
    """As many shards as keep each at least ``min_shard_bytes``, at most ``max_shards``."""

    def __init__(
        self, min_shard_bytes: int = 256 << 10, max_shards: int = 1, bytes_per_string: int = 16
    ) -> None:
        _check_positive("min_shard_bytes", min_shard_bytes)
        _check_positive("max_shards", max_shards)
        _check_positive("bytes_per_string", bytes_per_string)
        self._min_shard_bytes = min_shard_bytes
        self._max_shards = max_shards
        self._bytes_per_string = bytes_per_string

    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        if axis >= len(shape):
            raise ValueError(
                f"Cannot partition variable along axis {axis} when shape is only {tuple(shape)}"
            )
        total = _num_elements(shape) * _element_size(dtype, self._bytes_per_string)
        result = [1] * len(shape)
        result[axis] = max(
            1,
            min(int(shape[axis]), self._max_shards, math.ceil(total / self._min_shard_bytes)),
        )
        return result


class MaxSizePartitioner(Partitioner):
    """As few shards as keep each at most ``max_shard_bytes`` (capped by ``max_shards``)."""

    def __init__(
        self, max_shard_bytes: int, max_shards: int | None = None, bytes_per_string: int = 16
    ) -> None:
        if max_shard_bytes < 1:
            raise ValueError(
                f"Argument `max_shard_bytes` must be positive. Received {max_shard_bytes}"
            )
        if max_shards is not None and max_shards < 1:
            raise ValueError(f"Argument `max_shards` must be positive. Received {max_shards}")
        if bytes_per_string < 1:
            raise ValueError(
                f"Argument `bytes_per_string` must be positive. Received {bytes_per_string}"
            )
        self._max_shard_bytes = max_shard_bytes
        self._max_shards = max_shards
        self._bytes_per_string = bytes_per_string

    def __call__(self, shape: Sequence[int], dtype: Any, axis: int = 0) -> list[int]:
        if axis >= len(shape):
            raise ValueError(
                f"Cannot partition variable along axis {axis} when shape is only {tuple(shape)}"
            )
        elem = _element_size(dtype, self._bytes_per_string)
        slice_bytes = _num_elements(shape) / int(shape[axis]) * elem
        slices_per_shard = max(1, math.floor(self._max_shard_bytes / slice_bytes))
        shards = math.ceil(int(shape[axis]) / slices_per_shard)
        if self._max_shards is not None:
            shards = min(shards, self._max_shards)
        result = [1] * len(shape)
        result[axis] = shards
        return result


def num_partitions(partitioner: Any, shape: torch.Size, dtype: torch.dtype) -> int:
    """Call ``partitioner`` and check its result as TensorFlow does; the shard count (≥ 1)."""
    result = partitioner(shape=shape, dtype=dtype)
    valid = (
        isinstance(result, (list, tuple))
        and len(result) > 0
        and int(result[0]) != 0
        and all(int(r) == 1 for r in result[1:])
    )
    if not valid:
        raise ValueError(
            "variable_partitioner must return a list/tuple whose elements are 1 besides the "
            f"first element (non-zero), got: {result!r}"
        )
    return min(int(result[0]), int(shape[0]))


def div_partition(rows: int, num_shards: int) -> list[tuple[int, int]]:
    """``(offset, size)`` of each shard: the first ``rows % n`` shards get one extra row."""
    base, extra = divmod(rows, num_shards)
    parts, offset = [], 0
    for i in range(num_shards):
        size = base + (1 if i < extra else 0)
        parts.append((offset, size))
        offset += size
    return parts
