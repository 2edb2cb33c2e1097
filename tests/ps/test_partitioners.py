"""Partitioner arithmetic (pure): TensorFlow's examples from sharded_variable_test."""

from __future__ import annotations

import re

import pytest
import torch
from strategyjob.ps.partitioners import (
    FixedShardsPartitioner,
    MaxSizePartitioner,
    MinSizePartitioner,
    Partitioner,
    div_partition,
    num_partitions,
)


def rows(total: int, n: int) -> list[list[int]]:
    return [list(range(o, o + s)) for o, s in div_partition(total, n)]


def test_div_partition_gives_extra_rows_to_first_shards():
    assert rows(13, 5) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10], [11, 12]]
    assert [s for _, s in div_partition(10, 4)] == [3, 3, 2, 2]


@pytest.mark.parametrize(
    ("shape", "shards", "expected"), [([10, 3], 2, [2, 1]), ([3, 3], 5, [3, 1])]
)
def test_fixed_shards(shape, shards, expected):
    assert FixedShardsPartitioner(shards)(torch.Size(shape), torch.float32) == expected


@pytest.mark.parametrize(
    ("args", "shape", "dtype", "expected"),
    [
        ((4, 2), [6, 1], torch.float32, [2, 1]),
        ((4, 10), [6, 1], torch.float32, [6, 1]),
        ((256 << 10, 16), [1024, 1024], torch.float32, [16, 1]),
        ((256 << 10, 3), [100, 10], torch.float32, [1, 1]),
        ((10, 4), [5, 1], torch.float32, [2, 1]),
        ((32, 10), [10], str, [5]),
    ],
)
def test_min_size(args, shape, dtype, expected):
    assert MinSizePartitioner(*args)(shape=torch.Size(shape), dtype=dtype) == expected


@pytest.mark.parametrize("arg", ["min_shard_bytes", "max_shards", "bytes_per_string"])
def test_min_size_rejects_non_positive(arg):
    with pytest.raises(ValueError, match=f"Argument `{arg}` must be positive. Received: 0"):
        MinSizePartitioner(**{arg: 0})


def test_min_size_scalar():
    with pytest.raises(
        ValueError, match=r"Cannot partition variable along axis 0 when shape is only \(\)"
    ):
        MinSizePartitioner()(torch.Size([]), torch.float32)


@pytest.mark.parametrize(
    ("args", "shape", "expected"),
    [
        ((4,), [6, 1], [6, 1]),
        ((4, 2), [6, 1], [2, 1]),
        ((1024,), [6, 1], [1, 1]),
        ((17,), [10, 1], [3, 1]),
        ((10,), [6, 2], [6, 1]),
    ],
)
def test_max_size(args, shape, expected):
    assert MaxSizePartitioner(*args)(torch.Size(shape), torch.float32) == expected


def test_max_size_rejects_non_positive():
    with pytest.raises(
        ValueError, match=re.escape("Argument `max_shard_bytes` must be positive. Received 0")
    ):
        MaxSizePartitioner(0)
    with pytest.raises(
        ValueError, match=re.escape("Argument `max_shards` must be positive. Received -1")
    ):
        MaxSizePartitioner(4, max_shards=-1)


@pytest.mark.parametrize("bad", [None, [], [0, 1, 1], [2, 2, 1]])
def test_invalid_partitioner_result(bad):
    with pytest.raises(ValueError, match="variable_partitioner must return a list/tuple"):
        num_partitions(lambda shape, dtype: bad, torch.Size([4, 1, 1]), torch.float32)


def test_custom_partitioner_and_cap_at_rows():
    class Four(Partitioner):
        def __call__(self, shape, dtype, axis=0):
            return [4] + [1] * (len(shape) - 1)

    assert num_partitions(Four(), torch.Size([3, 2]), torch.float32) == 3
    assert rows(3, 3) == [[0], [1], [2]]
