"""SyncOnReadVariable under MirroredStrategy(["cpu:0", "cpu:1"]): semantics doc §3.4."""

from __future__ import annotations

import pytest
import strategyjob
import torch
from strategyjob import _variables
from strategyjob._variables import (
    IndexedSlices,
    SyncOnReadVariable,
    VariableAggregation,
    VariableSynchronization,
)

ON_READ = VariableSynchronization.ON_READ


def replica_id() -> torch.Tensor:
    return strategyjob.get_replica_context().replica_id_in_sync_group


def components(variable) -> list[float]:
    return [float(c.numpy()) for c in variable.values]


def local_floats(strategy, value) -> list[float]:
    return [float(torch.as_tensor(v).detach()) for v in strategy.experimental_local_results(value)]


def make(strategy, aggregation, initial=0.0):
    with strategy.scope():
        return strategyjob.Variable(initial, synchronization=ON_READ, aggregation=aggregation)


def test_on_read_creates_sync_on_read_variable(mirrored):
    v = make(mirrored, VariableAggregation.SUM)
    assert type(v) is SyncOnReadVariable
    assert isinstance(v, strategyjob.Variable)
    assert v.trainable is False
    assert [c.name for c in v.values] == ["Variable:0", "Variable/replica_1:0"]


@pytest.mark.parametrize(
    ("aggregation", "cross_read"),
    [
        (VariableAggregation.SUM, 3.0),
        (VariableAggregation.MEAN, 1.5),
        (VariableAggregation.ONLY_FIRST_REPLICA, 1.0),
    ],
)
def test_replica_updates_are_local_and_cross_reads_aggregate(mirrored, aggregation, cross_read):
    v = make(mirrored, aggregation)
    returned = mirrored.run(lambda: v.assign_add(replica_id() + 1))
    assert local_floats(mirrored, returned) == [1.0, 2.0]
    assert components(v) == [1.0, 2.0]
    assert local_floats(mirrored, mirrored.run(lambda: v.read_value())) == [1.0, 2.0]
    with mirrored.scope():
        assert float(v.read_value()) == cross_read
    assert float(v.read_value()) == cross_read  # top level reads like cross-replica
    assert float(_variables.checkpoint_reader(v)()) == cross_read


def test_cross_replica_read_with_none_aggregation_fails(mirrored):
    v = make(mirrored, VariableAggregation.NONE)
    with pytest.raises(ValueError) as err:
        v.read_value()
    assert str(err.value) == (
        "Could not convert from `tf.VariableAggregation` VariableAggregation.NONE to"
        "`tf.distribute.ReduceOp` type"
    )


@pytest.mark.parametrize(
    ("aggregation", "expected_components", "expected_read"),
    [
        (VariableAggregation.SUM, [2.0, 2.0], 4.0),
        (VariableAggregation.MEAN, [4.0, 4.0], 4.0),
        (VariableAggregation.ONLY_FIRST_REPLICA, [4.0, 4.0], 4.0),
    ],
)
def test_cross_replica_assign(mirrored, aggregation, expected_components, expected_read):
    v = make(mirrored, aggregation)
    with mirrored.scope():
        result = v.assign(4.0)
    assert components(v) == expected_components
    assert float(result) == expected_read
    assert float(v.read_value()) == expected_read


def test_cross_replica_sum_assign_casts_to_dtype(mirrored):
    v = make(mirrored, VariableAggregation.SUM, initial=torch.tensor(0, dtype=torch.int64))
    v.assign(5)
    assert v.values[0].dtype == torch.int64
    assert components(v) == [2.0, 2.0]


@pytest.mark.parametrize("op", ["assign_add", "assign_sub"])
def test_cross_replica_add_sub_with_sum_is_rejected(mirrored, op):
    v = make(mirrored, VariableAggregation.SUM)
    with pytest.raises(ValueError) as err:
        getattr(v, op)(1.0)
    assert str(err.value) == (
        f"SyncOnReadVariable does not support `{op}` in cross-replica context when aggregation "
        "is set to `tf.VariableAggregation.SUM`."
    )


def test_cross_replica_add_with_mean_updates_every_component(mirrored):
    v = make(mirrored, VariableAggregation.MEAN)
    mirrored.run(lambda: v.assign(replica_id() * 2.0))
    v.assign_add(1.0)
    assert components(v) == [1.0, 3.0]
    v.assign_sub(1.0)
    assert components(v) == [0.0, 2.0]


@pytest.mark.parametrize("op", _variables._SCATTER_OPS)
def test_scatter_is_not_supported(mirrored, op):
    v = make(mirrored, VariableAggregation.SUM, initial=[0.0, 0.0])
    with pytest.raises(NotImplementedError) as err:
        getattr(v, op)(IndexedSlices(torch.tensor([1.0]), torch.tensor([0])))
    assert str(err.value) == f"Variables with `synchronization=ON_READ` doesn't support `{op}`"


def test_sync_on_read_context_all_reduces_replica_reads(mirrored):
    v = make(mirrored, VariableAggregation.SUM, initial=1.0)
    assert local_floats(mirrored, mirrored.run(lambda: v + 10)) == [11.0, 11.0]

    def synced():
        with _variables.variable_sync_on_read_context():
            return v + 10

    assert local_floats(mirrored, mirrored.run(synced)) == [12.0, 12.0]


def test_restore_uses_the_cross_replica_assign_rule(mirrored):
    source = make(mirrored, VariableAggregation.SUM)
    mirrored.run(lambda: source.assign_add(replica_id() + 1))
    saved = _variables.checkpoint_reader(source)()
    target = make(mirrored, VariableAggregation.SUM)
    target.assign(saved)
    assert float(target.read_value()) == float(saved) == 3.0
