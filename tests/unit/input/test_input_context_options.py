"""InputContext, InputOptions, the enums, and distribute_datasets_from_function (§4.4, §4.5)."""

from __future__ import annotations

import pytest
import torch
from input_fakes import FakeExtended, range_batches, steps_of
from strategyjob.input import (
    AutoShardPolicy,
    InputContext,
    InputOptions,
    InputReplicationMode,
    distribute_datasets_from_function,
)


def test_input_context_defaults_and_properties() -> None:
    context = InputContext()
    assert (context.num_input_pipelines, context.input_pipeline_id) == (1, 0)
    assert context.num_replicas_in_sync == 1
    context = InputContext(3, 1, 6)
    assert (context.num_input_pipelines, context.input_pipeline_id) == (3, 1)
    assert context.num_replicas_in_sync == 6
    with pytest.raises(AttributeError):
        context.num_replicas_in_sync = 2  # type: ignore[misc]


def test_input_context_per_replica_batch_size() -> None:
    assert InputContext(num_replicas_in_sync=4).get_per_replica_batch_size(64) == 16
    with pytest.raises(ValueError) as err:
        InputContext(num_replicas_in_sync=3).get_per_replica_batch_size(64)
    assert str(err.value) == (
        "The `global_batch_size` 64 is not divisible by `num_replicas_in_sync` 3 "
    )


def test_input_context_str() -> None:
    assert str(InputContext(2, 1, 4)) == "tf.distribute.InputContext(input pipeline id 1, total: 2)"


def test_input_options_defaults() -> None:
    options = InputOptions()
    assert options.experimental_fetch_to_device is True
    assert options.experimental_replication_mode == InputReplicationMode.PER_WORKER
    assert options.experimental_place_dataset_on_device is False
    assert options.experimental_per_replica_buffer_size == 1
    assert InputOptions(experimental_fetch_to_device=False).experimental_fetch_to_device is False
    assert isinstance(options, tuple) and options._fields[0] == "experimental_fetch_to_device"


def test_input_options_replication_mode_is_checked() -> None:
    by_name = InputOptions(experimental_replication_mode="PER_REPLICA")
    assert by_name.experimental_replication_mode is InputReplicationMode.PER_REPLICA
    with pytest.raises(ValueError, match=r"must be InputReplicationMode\.PER_WORKER or"):
        InputOptions(experimental_replication_mode="PER_HOST")


def test_enums_have_tensorflow_values() -> None:
    assert {p.name: p.value for p in AutoShardPolicy} == {
        "OFF": -1,
        "AUTO": 0,
        "FILE": 1,
        "DATA": 2,
        "HINT": 3,
    }
    assert InputReplicationMode.PER_WORKER.value == "PER_WORKER"
    assert InputReplicationMode.PER_REPLICA.value == "PER_REPLICA"


def dataset_fn_recording(contexts: list[InputContext], n: int = 8, b: int = 2):
    def dataset_fn(context: InputContext):
        contexts.append(context)
        return range_batches(n, b)

    return dataset_fn


def test_place_on_device_needs_per_replica() -> None:
    options = InputOptions(experimental_place_dataset_on_device=True)
    with pytest.raises(ValueError) as err:
        distribute_datasets_from_function(lambda c: [], extended=FakeExtended(2), options=options)
    assert str(err.value) == (
        "When `experimental_place_dataset_on_device` is set for dataset placement, you must "
        "also specify `PER_REPLICA` for the replication mode"
    )


def test_place_on_device_conflicts_with_fetch_to_device() -> None:
    options = InputOptions(
        experimental_replication_mode=InputReplicationMode.PER_REPLICA,
        experimental_place_dataset_on_device=True,
    )
    with pytest.raises(ValueError) as err:
        distribute_datasets_from_function(lambda c: [], extended=FakeExtended(2), options=options)
    assert str(err.value) == (
        "`experimental_place_dataset_on_device` can not be set to True when "
        "experimental_fetch_to_device is True and replication mode is set to `PER_REPLICA`"
    )


def test_per_worker_calls_dataset_fn_once_and_replicas_take_turns() -> None:
    contexts: list[InputContext] = []
    distributed = distribute_datasets_from_function(
        dataset_fn_recording(contexts), extended=FakeExtended(2)
    )
    assert [str(c) for c in contexts] == [
        "tf.distribute.InputContext(input pipeline id 0, total: 1)"
    ]
    assert contexts[0].num_replicas_in_sync == 2
    assert steps_of(distributed, 2) == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]


def test_per_worker_partial_last_step() -> None:
    distributed = distribute_datasets_from_function(
        lambda c: range_batches(5, 2), extended=FakeExtended(2)
    )
    assert steps_of(distributed, 2) == [[[0, 1], [2, 3]], [[4], []]]


def test_multi_worker_context_is_workers_id_replicas() -> None:
    contexts: list[InputContext] = []
    extended = FakeExtended(num_local=2, num_workers=3, worker_index=2)
    distribute_datasets_from_function(dataset_fn_recording(contexts), extended=extended)
    (context,) = contexts
    assert (context.num_input_pipelines, context.input_pipeline_id) == (3, 2)
    assert context.num_replicas_in_sync == 6


def test_per_replica_builds_one_dataset_per_replica() -> None:
    contexts: list[InputContext] = []

    def dataset_fn(context: InputContext):
        contexts.append(context)
        start = 100 * context.input_pipeline_id
        return [torch.arange(start, start + 2), torch.arange(start + 2, start + 3)]

    options = InputOptions(experimental_replication_mode=InputReplicationMode.PER_REPLICA)
    distributed = distribute_datasets_from_function(
        dataset_fn, extended=FakeExtended(2), options=options
    )
    assert [
        (c.num_input_pipelines, c.input_pipeline_id, c.num_replicas_in_sync) for c in contexts
    ] == [(2, 0, 2), (2, 1, 2)]
    assert steps_of(distributed, 2) == [[[0, 1], [100, 101]], [[2], [102]]]


def test_per_replica_streams_of_different_lengths() -> None:
    def dataset_fn(context: InputContext):
        return range_batches(2 + 2 * context.input_pipeline_id, 2)

    options = InputOptions(experimental_replication_mode=InputReplicationMode.PER_REPLICA)
    distributed = distribute_datasets_from_function(
        dataset_fn, extended=FakeExtended(2), options=options
    )
    assert steps_of(distributed, 2) == [[[0, 1], [0, 1]], [[], [2, 3]]]


def test_per_replica_is_refused_in_multi_worker_strategies() -> None:
    options = InputOptions(experimental_replication_mode=InputReplicationMode.PER_REPLICA)
    extended = FakeExtended(num_local=1, num_workers=2)
    with pytest.raises(NotImplementedError) as err:
        distribute_datasets_from_function(lambda c: [], extended=extended, options=options)
    assert str(err.value) == (
        "InputReplicationMode.PER_REPLICA is only supported in "
        "`experimental_distribute_datasets_from_function` of tf.distribute.MirroredStrategy"
    )
    with pytest.raises(NotImplementedError):
        distribute_datasets_from_function(
            lambda c: [], extended=FakeExtended(2), options=options, allow_per_replica=False
        )


def test_dataset_fn_must_return_an_iterable() -> None:
    with pytest.raises(TypeError, match="returned by `dataset_fn` must be an iterable"):
        distribute_datasets_from_function(lambda c: None, extended=FakeExtended(2))


def test_dataset_fn_batches_are_not_split() -> None:
    # Per-replica batches of 3 stay whole, no rebatch or auto-shard.
    distributed = distribute_datasets_from_function(
        lambda c: range_batches(6, 3), extended=FakeExtended(2)
    )
    assert steps_of(distributed, 2) == [[[0, 1, 2], [3, 4, 5]]]
