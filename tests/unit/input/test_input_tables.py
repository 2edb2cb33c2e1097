"""Every row of the single-worker splitting tables of semantics §4.2, for every kind of input."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest
import torch
from input_fakes import FakeExtended, range_batches, steps_of
from strategyjob.input import AutoShardPolicy, InputOptions, InputReplicationMode
from strategyjob.input import distribute_dataset as _distribute_dataset
from torch.utils.data import DataLoader, TensorDataset


def distribute(dataset: Iterable[Any], num_local: int, **kwargs: Any) -> list[list[Any]]:
    extended = FakeExtended(num_local)
    return steps_of(_distribute_dataset(dataset, extended=extended, **kwargs), num_local)


def as_list(n: int, b: int, drop: bool = False) -> list[torch.Tensor]:
    return range_batches(n, b, drop)


def as_generator(n: int, b: int, drop: bool = False) -> Iterable[torch.Tensor]:
    return (batch for batch in range_batches(n, b, drop))


def as_loader(n: int, b: int, drop: bool = False) -> DataLoader:
    # DataLoader over a tensor dataset yields tensors directly via a custom collate.
    return DataLoader(torch.arange(n), batch_size=b, drop_last=drop)


INPUTS: dict[str, Callable[..., Iterable[Any]]] = {
    "list": as_list,
    "generator": as_generator,
    "dataloader": as_loader,
}

# (R, n, B, drop_remainder, expected steps) — the AUTO rows of §4.2.
AUTO_ROWS = [
    (2, 10, 4, False, [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8], [9]]]),
    (2, 5, 4, False, [[[0, 1], [2, 3]], [[4], []]]),
    (2, 9, 4, True, [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]),
    (3, 10, 5, False, [[[0, 1], [2, 3], [4]], [[5, 6], [7, 8], [9]]]),
    (3, 7, 7, False, [[[0, 1, 2], [3, 4, 5], [6]]]),
    (3, 8, 4, False, [[[0, 1], [2, 3], []], [[4, 5], [6, 7], []]]),
    (4, 10, 8, False, [[[0, 1], [2, 3], [4, 5], [6, 7]], [[8], [9], [], []]]),
    (4, 13, 8, False, [[[0, 1], [2, 3], [4, 5], [6, 7]], [[8, 9], [10, 11], [12], []]]),
    (4, 6, 6, False, [[[0, 1], [2, 3], [4, 5], []]]),
]


@pytest.mark.parametrize("kind", sorted(INPUTS))
@pytest.mark.parametrize(("r", "n", "b", "drop", "expected"), AUTO_ROWS)
def test_auto_rows(kind: str, r: int, n: int, b: int, drop: bool, expected: list) -> None:
    assert distribute(INPUTS[kind](n, b, drop), r) == expected


def test_auto_rows_explicit_data_policy_match() -> None:
    assert distribute(as_list(7, 7), 3, auto_shard_policy=AutoShardPolicy.DATA) == [
        [[0, 1, 2], [3, 4, 5], [6]]
    ]


@pytest.mark.parametrize("kind", ["list", "dataloader"])
@pytest.mark.parametrize(
    "policy", [AutoShardPolicy.OFF, AutoShardPolicy.FILE, AutoShardPolicy.HINT]
)
def test_balanced_rows_r3_range7_batch7(kind: str, policy: AutoShardPolicy) -> None:
    steps = distribute(INPUTS[kind](7, 7), 3, auto_shard_policy=policy)
    assert steps == [[[0, 1, 2], [3, 4], [5, 6]]]


@pytest.mark.parametrize("kind", ["list", "dataloader"])
def test_balanced_row_r4_range10_batch10_off(kind: str) -> None:
    steps = distribute(INPUTS[kind](10, 10), 4, auto_shard_policy=AutoShardPolicy.OFF)
    assert steps == [[[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]]


@pytest.mark.parametrize("kind", ["list", "dataloader"])
def test_balanced_row_r4_range13_batch8_off(kind: str) -> None:
    steps = distribute(INPUTS[kind](13, 8), 4, auto_shard_policy=AutoShardPolicy.OFF)
    assert steps == [[[0, 1], [2, 3], [4, 5], [6, 7]], [[8, 9], [10, 11], [12], []]]


def test_unknown_batch_size_falls_back_to_ceil_fill_even_when_off() -> None:
    # A generator does not declare its batch size (TF: compute_batch_size == -1).
    steps = distribute(as_generator(10, 10), 4, auto_shard_policy=AutoShardPolicy.OFF)
    assert steps == [[[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]]


def test_balanced_split_borrows_rows_across_a_short_middle_batch() -> None:
    # rebatch(batch_sizes) behaves as unbatch + batch with cyclic sizes.
    batches = [torch.arange(0, 4), torch.arange(4, 8), torch.arange(8, 9)]
    steps = distribute(batches, 2, auto_shard_policy=AutoShardPolicy.OFF)
    assert steps == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8], []]]
    uneven = [torch.arange(0, 4), torch.arange(4, 6), torch.arange(6, 10)]
    loader_like = type("Declared", (), {"batch_size": 4, "__iter__": lambda s: iter(uneven)})()
    steps = distribute(loader_like, 2, auto_shard_policy=AutoShardPolicy.OFF)
    assert steps == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], []]]


def test_one_replica_is_not_rebatched() -> None:
    # OneDeviceStrategy: range(5).batch(2) => [0,1], [2,3], [4].
    assert distribute(as_list(5, 2), 1) == [[[0, 1]], [[2, 3]], [[4]]]


def test_nested_elements_keep_their_structure() -> None:
    # ({'a': range(4)}, range(4) * 10).batch(4) on 2 replicas => ({'a': [[0,1],[2,3]]}, ...).
    data = torch.arange(4)
    element = ({"a": data}, data * 10)
    (value,) = list(_distribute_dataset([element], extended=FakeExtended(2)))
    assert isinstance(value, tuple) and isinstance(value[0], dict)
    assert [v.tolist() for v in value[0]["a"].values] == [[0, 1], [2, 3]]
    assert [v.tolist() for v in value[1].values] == [[0, 10], [20, 30]]


def test_nested_elements_from_a_tensor_dataset_loader() -> None:
    features = torch.arange(10, dtype=torch.float32).reshape(5, 2)
    labels = torch.arange(5)
    loader = DataLoader(TensorDataset(features, labels), batch_size=4)
    steps = list(_distribute_dataset(loader, extended=FakeExtended(2)))
    x, y = steps[1]
    assert [v.tolist() for v in y.values] == [[4], []]
    assert [tuple(v.shape) for v in x.values] == [(1, 2), (0, 2)]  # empty keeps trailing dims
    assert x.values[1].dtype == torch.float32


def test_numpy_batches_are_accepted() -> None:
    import numpy as np

    steps = distribute([np.arange(4)], 2)
    assert steps == [[[0, 1], [2, 3]]]


UNBATCHED = (
    "Call the `batch` method on the input Dataset in order to be able to split your input "
    "across 2 replicas.\n Please see the tf.distribute.Strategy guide. "
)


@pytest.mark.parametrize(
    "dataset",
    [
        [torch.tensor(1), torch.tensor(2)],
        [1, 2, 3],
        (x for x in [(torch.tensor(1.0), torch.tensor(0))]),
    ],
    ids=["scalar-tensors", "python-numbers", "scalar-tuples"],
)
def test_unbatched_input_raises_tf_value_error(dataset: Iterable[Any]) -> None:
    with pytest.raises(ValueError) as err:
        distribute(dataset, 2)
    assert str(err.value).startswith(UNBATCHED)


def test_unbatched_dataloader_is_rejected_up_front() -> None:
    loader = DataLoader(torch.arange(4), batch_size=None)
    with pytest.raises(ValueError) as err:
        _distribute_dataset(loader, extended=FakeExtended(2))
    assert str(err.value).startswith(UNBATCHED)
    assert "batch_size=None" in str(err.value)


def test_unbatched_input_is_fine_with_one_replica() -> None:
    assert distribute([torch.tensor(1), torch.tensor(2)], 1) == [[1], [2]]


def test_mismatched_batch_dims_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"different batch sizes \[3, 4\]"):
        distribute([(torch.zeros(4), torch.zeros(3))], 2)


def test_non_tensor_leaves_are_rejected() -> None:
    with pytest.raises(TypeError, match="holding a str"):
        distribute([("a", torch.zeros(2))], 2)


def test_replicas_must_divide_among_workers() -> None:
    extended = FakeExtended(num_local=1, num_workers=2, num_replicas=3)
    with pytest.raises(ValueError) as err:
        _distribute_dataset(as_list(4, 2), extended=extended)
    assert str(err.value) == (
        "tf.distribute expects every worker to have the same number of replicas. However, "
        "encountered `num_replicas_in_sync` (3) that cannot be divided by `num_workers` (2)"
    )


def test_per_replica_mode_is_refused() -> None:
    options = InputOptions(experimental_replication_mode=InputReplicationMode.PER_REPLICA)
    with pytest.raises(NotImplementedError) as err:
        _distribute_dataset(as_list(4, 2), extended=FakeExtended(2), options=options)
    assert str(err.value) == (
        "InputReplicationMode.PER_REPLICA is only supported in `distribute_datasets_from_function`."
    )


def test_bad_policy_and_non_iterable_input() -> None:
    with pytest.raises(ValueError, match="auto_shard_policy must be"):
        _distribute_dataset(as_list(4, 2), extended=FakeExtended(2), auto_shard_policy=7)
    with pytest.raises(TypeError, match="iterable of batches"):
        _distribute_dataset(42, extended=FakeExtended(2))


def test_policy_accepts_tf_integer_values() -> None:
    steps = distribute(as_list(7, 7), 3, auto_shard_policy=-1)  # OFF
    assert steps == [[[0, 1, 2], [3, 4], [5, 6]]]


def test_rebatch_false_takes_whole_elements_per_replica() -> None:
    steps = distribute(as_list(5, 2), 2, rebatch=False)
    assert steps == [[[0, 1], [2, 3]], [[4], []]]


def test_policy_names_are_not_policies() -> None:
    with pytest.raises(ValueError, match=r"got 'AUTO'"):
        _distribute_dataset(as_list(4, 2), extended=FakeExtended(2), auto_shard_policy="AUTO")
