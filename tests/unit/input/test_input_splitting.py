"""The two splitting algorithms and the sharding decisions, as pure functions (§4.2, §4.3)."""

from __future__ import annotations

import pytest
from strategyjob.errors import InvalidArgumentError
from strategyjob.input import AutoShardPolicy, FileDataset, batch_sizes_for_worker
from strategyjob.input.sharding import (
    Split,
    effective_policy,
    select_files,
    split_for,
    static_batch_size,
    sub_batch_ids_for_worker,
)
from strategyjob.input.splitting import ceil_fill_sizes, offsets


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((7, 1, 3, 0), [3, 2, 2]),
        ((7, 2, 2, 1), [2, 1, 2, 2]),
        ((4, 1, 3, 0), [2, 1, 1]),
        ((10, 1, 4, 0), [3, 3, 2, 2]),
        ((7, 2, 2, 0), [2, 2, 2, 1]),
        ((2, 1, 4, 0), [1, 1, 0, 0]),
    ],
)
def test_balanced_split_examples(args: tuple[int, int, int, int], expected: list[int]) -> None:
    assert batch_sizes_for_worker(*args) == expected


def test_balanced_split_workers_consume_one_global_batch_per_step() -> None:
    # At every step, the Rw slots each worker takes add up to B across the workers.
    B, W, Rw = 11, 3, 2
    per_worker = [batch_sizes_for_worker(B, W, Rw, w) for w in range(W)]
    for step in range(W):
        taken = sum(sum(sizes[step * Rw : (step + 1) * Rw]) for sizes in per_worker)
        assert taken == B


@pytest.mark.parametrize(
    "bad", [(-1, 1, 1, 0), (4, 0, 1, 0), (4, 1, 0, 0), (4, 2, 1, 2), (4, 2, 1, -1)]
)
def test_balanced_split_rejects_bad_arguments(bad: tuple[int, int, int, int]) -> None:
    with pytest.raises(ValueError):
        batch_sizes_for_worker(*bad)


@pytest.mark.parametrize(
    ("b", "r", "expected"),
    [
        (4, 2, [2, 2]),
        (1, 2, [1, 0]),
        (7, 3, [3, 3, 1]),
        (4, 3, [2, 2, 0]),
        (6, 4, [2, 2, 2, 0]),
        (5, 4, [2, 2, 1, 0]),
        (2, 4, [1, 1, 0, 0]),
        (0, 2, [0, 0]),
    ],
)
def test_ceil_fill_sizes(b: int, r: int, expected: list[int]) -> None:
    assert ceil_fill_sizes(b, r) == expected


def test_offsets_are_consecutive() -> None:
    assert offsets([3, 0, 2]) == [(0, 3), (3, 3), (3, 5)]


def _files(n: int) -> FileDataset:
    return FileDataset([f"f{i}" for i in range(n)], reader=lambda path: [], batch_size=2)


def test_auto_policy_is_file_for_declared_files_and_data_otherwise() -> None:
    assert effective_policy(AutoShardPolicy.AUTO, _files(4), 2) == AutoShardPolicy.FILE
    assert effective_policy(AutoShardPolicy.AUTO, [1, 2], 2) == AutoShardPolicy.DATA
    # Fewer files than workers: AUTO falls back to DATA instead of failing.
    assert effective_policy(AutoShardPolicy.AUTO, _files(1), 2) == AutoShardPolicy.DATA
    for policy in (
        AutoShardPolicy.OFF,
        AutoShardPolicy.FILE,
        AutoShardPolicy.DATA,
        AutoShardPolicy.HINT,
    ):
        assert effective_policy(policy, _files(4), 2) == policy


def test_split_is_ceil_fill_under_data_or_unknown_batch_size() -> None:
    assert split_for(AutoShardPolicy.DATA, 8) == Split.CEIL_FILL
    assert split_for(AutoShardPolicy.OFF, None) == Split.CEIL_FILL
    for policy in (AutoShardPolicy.OFF, AutoShardPolicy.FILE, AutoShardPolicy.HINT):
        assert split_for(policy, 8) == Split.BALANCED


def test_file_selection_is_round_robin() -> None:
    files = [f"f{i}" for i in range(5)]
    assert select_files(files, 2, 0) == ["f0", "f2", "f4"]
    assert select_files(files, 2, 1) == ["f1", "f3"]


def test_file_selection_with_fewer_files_than_workers_is_an_error() -> None:
    with pytest.raises(InvalidArgumentError, match=r"only has 1 file\(s\).*required 2 shards"):
        select_files(["f0"], 2, 0)
    with pytest.raises(InvalidArgumentError, match="does not declare its files"):
        select_files(None, 2, 0)


def test_data_sharding_sub_batch_ids() -> None:
    assert sub_batch_ids_for_worker(4, 2, 0) == [0, 2]
    assert sub_batch_ids_for_worker(4, 2, 1) == [1, 3]
    assert sub_batch_ids_for_worker(3, 1, 0) == [0, 1, 2]


def test_static_batch_size() -> None:
    import torch

    size = len
    assert static_batch_size([torch.zeros(4), torch.zeros(4), torch.zeros(1)], size) == 4
    assert static_batch_size([torch.zeros(2), torch.zeros(4)], size) is None
    assert static_batch_size(iter([torch.zeros(4)]), size) is None
    assert static_batch_size(_files(2), size) == 2
