"""strategyjob.compat.v1.CentralStorageStrategy and the compat.v1 methods (semantics doc §8)."""

from __future__ import annotations

import numpy as np
import pytest
import strategyjob
import torch
from strategyjob import InputReplicationMode, errors
from strategyjob.compat import v1
from strategyjob.strategies.central_storage import CentralStorageStrategy


def local_lists(strategy, value) -> list[list]:
    return [torch.as_tensor(v).tolist() for v in strategy.experimental_local_results(value)]


def range_batches(n: int, batch: int) -> list[torch.Tensor]:
    return [torch.arange(n)[i : i + batch] for i in range(0, n, batch)]


@pytest.fixture
def css_v1():
    return v1.CentralStorageStrategy(["cpu:0", "cpu:1"], "cpu:0")


def test_constructor_by_position_and_keyword():
    by_position = v1.CentralStorageStrategy(["cpu:0", "cpu:1"], "cpu:1")
    assert by_position.num_replicas_in_sync == 2
    assert by_position.extended.parameter_devices == (
        "/job:localhost/replica:0/task:0/device:CPU:1",
    )
    by_keyword = v1.CentralStorageStrategy(compute_devices=["cpu:0"], parameter_device="cpu:0")
    assert by_keyword.num_replicas_in_sync == 1
    assert isinstance(by_position, CentralStorageStrategy)
    assert isinstance(by_position, strategyjob.Strategy)
    assert strategyjob.compat.v1.CentralStorageStrategy is v1.CentralStorageStrategy


def test_experimental_run_with_dataset_iterator(css_v1):
    iterator = css_v1.make_dataset_iterator(range_batches(8, 4))
    assert iterator.initialize() == []
    assert iterator.initializer == []
    results = [
        local_lists(css_v1, css_v1.experimental_run(lambda x: x * 2, iterator)) for _ in range(2)
    ]
    assert results == [[[0, 2], [4, 6]], [[8, 10], [12, 14]]]
    with pytest.raises(errors.OutOfRangeError):
        iterator.get_next()
    iterator.initialize()  # starts over
    assert local_lists(css_v1, iterator.get_next()) == [[0, 1], [2, 3]]


def test_experimental_run_with_input_fn_iterator(css_v1):
    contexts = []

    def input_fn(ctx):
        contexts.append(ctx)
        batch = ctx.get_per_replica_batch_size(4)
        return range_batches(8, batch)

    iterator = css_v1.make_input_fn_iterator(input_fn)
    iterator.initialize()
    result = css_v1.experimental_run(lambda x: x * 2, iterator)
    assert local_lists(css_v1, result) == [[0, 2], [4, 6]]
    assert [
        (c.num_input_pipelines, c.input_pipeline_id, c.num_replicas_in_sync) for c in contexts
    ] == [(1, 0, 2)]


def test_input_fn_iterator_rejects_per_replica(css_v1):
    with pytest.raises(ValueError) as err:
        css_v1.make_input_fn_iterator(lambda ctx: [], InputReplicationMode.PER_REPLICA)
    assert str(err.value) == (
        "Input replication mode not supported: <InputReplicationMode.PER_REPLICA: 'PER_REPLICA'>"
    )


def test_experimental_run_without_iterator(css_v1):
    result = css_v1.experimental_run(
        lambda: strategyjob.get_replica_context().replica_id_in_sync_group + 1
    )
    assert local_lists(css_v1, result) == [1, 2]


def test_update_config_proto_returns_a_modified_copy(css_v1):
    config = {"allow_soft_placement": True, "isolate_session_state": False}
    updated = css_v1.update_config_proto(config)
    assert updated == {"allow_soft_placement": True, "isolate_session_state": True}
    assert config == {"allow_soft_placement": True, "isolate_session_state": False}
    assert css_v1.update_config_proto({}) == {"isolate_session_state": True}
    with pytest.raises(TypeError, match="plain dict"):
        css_v1.update_config_proto("isolate_session_state: true")


def test_v2_class_has_the_compat_methods():
    css = strategyjob.CentralStorageStrategy(["cpu:0", "cpu:1"])
    iterator = css.make_dataset_iterator(range_batches(4, 4))
    assert local_lists(css, css.experimental_run(lambda x: x + 1, iterator)) == [[1, 2], [3, 4]]
    assert css.update_config_proto({}) == {"isolate_session_state": True}


def test_experimental_make_numpy_dataset(css_v1):
    dataset = css_v1.experimental_make_numpy_dataset(np.ones([10], dtype=np.float32))
    assert len(dataset) == 10
    loader = torch.utils.data.DataLoader(dataset, batch_size=4)
    steps = [local_lists(css_v1, x) for x in css_v1.experimental_distribute_dataset(loader)]
    assert steps[0] == [[1.0, 1.0], [1.0, 1.0]]
    assert len(steps) == 3
    pairs = css_v1.experimental_make_numpy_dataset((np.arange(3), np.arange(3) * 10))
    assert [t.item() for t in pairs[2]] == [2, 20]
    with pytest.raises(ValueError, match="same length"):
        css_v1.experimental_make_numpy_dataset((np.arange(3), np.arange(4)))
