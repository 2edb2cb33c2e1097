"""The input layer through the real single-process strategies (logical CPU devices)."""

from __future__ import annotations

import pytest
import strategyjob as sj
import torch
from input_fakes import as_lists, range_batches
from strategyjob.experimental import AutoShardPolicy
from strategyjob.input import InputContext
from torch.utils.data import DataLoader, TensorDataset


@pytest.fixture
def mirrored() -> sj.MirroredStrategy:
    return sj.MirroredStrategy(["cpu:0", "cpu:1"])


def local_steps(strategy: sj.Strategy, distributed) -> list:
    return [[as_lists(v) for v in strategy.experimental_local_results(x)] for x in distributed]


def test_mirrored_splits_global_batches(mirrored: sj.MirroredStrategy) -> None:
    distributed = mirrored.experimental_distribute_dataset(range_batches(10, 4))
    assert local_steps(mirrored, distributed) == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8], [9]]]


def test_mirrored_takes_the_policy_keyword() -> None:
    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"])
    auto = strategy.experimental_distribute_dataset(range_batches(7, 7))
    off = strategy.experimental_distribute_dataset(
        range_batches(7, 7), auto_shard_policy=AutoShardPolicy.OFF
    )
    assert local_steps(strategy, auto) == [[[0, 1, 2], [3, 4, 5], [6]]]
    assert local_steps(strategy, off) == [[[0, 1, 2], [3, 4], [5, 6]]]


def test_run_consumes_per_replica_batches_and_partial_steps(
    mirrored: sj.MirroredStrategy,
) -> None:
    distributed = mirrored.experimental_distribute_dataset(range_batches(5, 4))
    sums = []
    for batch in distributed:
        per_replica = mirrored.run(lambda x: x.sum().reshape(1), args=(batch,))
        sums.append(mirrored.reduce("SUM", per_replica, axis=None).item())
    assert sums == [6, 4]  # step 2: replica 1 gets an empty batch, its sum is 0


def test_nested_batches_reach_each_replica(mirrored: sj.MirroredStrategy) -> None:
    features = torch.arange(8, dtype=torch.float32).reshape(4, 2)
    loader = DataLoader(TensorDataset(features, torch.arange(4)), batch_size=4)

    def replica_fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ctx = sj.get_replica_context()
        return torch.stack([x.sum(), y.sum().float(), ctx.replica_id_in_sync_group.float()])

    (batch,) = list(mirrored.experimental_distribute_dataset(loader))
    result = mirrored.run(replica_fn, args=tuple(batch))
    assert [v.tolist() for v in mirrored.experimental_local_results(result)] == [
        [6.0, 1.0, 0.0],
        [22.0, 5.0, 1.0],
    ]


def test_next_inside_replica_fn_is_refused(mirrored: sj.MirroredStrategy) -> None:
    iterator = iter(mirrored.experimental_distribute_dataset(range_batches(8, 4)))

    def replica_fn() -> None:
        next(iterator)

    with pytest.raises(ValueError) as err:
        mirrored.run(replica_fn)
    assert str(err.value) == (
        "next(iterator) should be called from outside of replica_fn. e.g. "
        "strategy.run(replica_fn, args=(next(iterator),))"
    )
    # Outside replica_fn, and inside scope(), the iterator works.
    with mirrored.scope():
        assert as_lists(next(iterator)) == [[0, 1], [2, 3]]


def test_mirrored_datasets_from_function(mirrored: sj.MirroredStrategy) -> None:
    contexts: list[InputContext] = []

    def dataset_fn(context: InputContext):
        contexts.append(context)
        return range_batches(8, context.get_per_replica_batch_size(4))

    distributed = mirrored.distribute_datasets_from_function(dataset_fn)
    assert [str(c) for c in contexts] == [
        "tf.distribute.InputContext(input pipeline id 0, total: 1)"
    ]
    assert local_steps(mirrored, distributed) == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]


def test_mirrored_per_replica_contexts(mirrored: sj.MirroredStrategy) -> None:
    contexts: list[InputContext] = []

    def dataset_fn(context: InputContext):
        contexts.append(context)
        return [torch.full((1,), context.input_pipeline_id)]

    options = sj.InputOptions(experimental_replication_mode=sj.InputReplicationMode.PER_REPLICA)
    distributed = mirrored.distribute_datasets_from_function(dataset_fn, options)
    triples = [
        (c.num_input_pipelines, c.input_pipeline_id, c.num_replicas_in_sync) for c in contexts
    ]
    assert triples == [(2, 0, 2), (2, 1, 2)]
    assert local_steps(mirrored, distributed) == [[[0], [1]]]


def test_one_device_does_not_rebatch() -> None:
    strategy = sj.OneDeviceStrategy("cpu:0")
    distributed = strategy.experimental_distribute_dataset(range_batches(5, 2))
    assert [as_lists(x) for x in distributed] == [[0, 1], [2, 3], [4]]


def test_central_storage_splits_like_mirrored() -> None:
    strategy = sj.CentralStorageStrategy(["cpu:0", "cpu:1"])
    distributed = strategy.experimental_distribute_dataset(range_batches(5, 2))
    assert local_steps(strategy, distributed) == [[[0], [1]], [[2], [3]], [[4], []]]


def test_default_strategy_returns_the_dataset_itself() -> None:
    dataset = range_batches(4, 2)
    assert sj.get_strategy().experimental_distribute_dataset(dataset) is dataset
