"""MirroredVariable under MirroredStrategy(["cpu:0", "cpu:1"]): semantics doc §3.2, §3.3, §1.6."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import strategyjob
import torch
from strategyjob import _values, _variables
from strategyjob._variables import (
    IndexedSlices,
    MirroredVariable,
    VariableAggregation,
    VariableSynchronization,
)

NON_DISTRIBUTED_SUM = (
    "A non-DistributedValues value 1.0 cannot be reduced with the given reduce op ReduceOp.SUM."
)


def replica_id() -> torch.Tensor:
    return strategyjob.get_replica_context().replica_id_in_sync_group


def components(variable) -> list[float]:
    return [float(c.numpy()) for c in variable.values]


def local_floats(strategy, value) -> list[float]:
    return [float(torch.as_tensor(v).detach()) for v in strategy.experimental_local_results(value)]


def make(strategy, initial=1.0, **kwargs):
    with strategy.scope():
        return strategyjob.Variable(initial, **kwargs)


def test_created_in_scope_is_mirrored_with_tf_names(mirrored):
    v = make(mirrored)
    assert type(v) is MirroredVariable
    assert isinstance(v, strategyjob.Variable)
    assert isinstance(v, strategyjob.DistributedValues)
    assert [c.name for c in v.values] == ["Variable:0", "Variable/replica_1:0"]
    assert v.name == "Variable:0"
    assert [c.device for c in v.values] == [
        "/job:localhost/replica:0/task:0/device:CPU:0",
        "/job:localhost/replica:0/task:0/device:CPU:1",
    ]
    assert components(v) == [1.0, 1.0]
    assert v.distribute_strategy is mirrored
    assert repr(v) == (
        "MirroredVariable:{\n"
        "  0: <strategyjob.Variable 'Variable:0' shape=() dtype=float32, numpy=1.0>,\n"
        "  1: <strategyjob.Variable 'Variable/replica_1:0' shape=() dtype=float32, numpy=1.0>\n"
        "}"
    )


def test_auto_and_on_write_both_mirror(mirrored):
    for sync in (VariableSynchronization.AUTO, VariableSynchronization.ON_WRITE):
        assert type(make(mirrored, synchronization=sync)) is MirroredVariable


def test_components_are_initialised_from_component_zero(mirrored):
    calls = []

    def initial():
        calls.append(1)
        return torch.randn(3)

    v = make(mirrored, initial)
    assert calls == [1]
    assert torch.equal(v.values[0].read_value(), v.values[1].read_value())


def test_variable_created_in_scope(mirrored):
    v = make(mirrored)
    other = strategyjob.MirroredStrategy(["cpu:0", "cpu:1"])
    assert mirrored.extended.variable_created_in_scope(v)
    assert not other.extended.variable_created_in_scope(v)
    assert not mirrored.extended.variable_created_in_scope(strategyjob.Variable(1.0))


def test_none_synchronization_is_rejected(mirrored):
    with pytest.raises(ValueError) as err:
        make(mirrored, name="v", synchronization=VariableSynchronization.NONE)
    assert str(err.value) == (
        "`NONE` variable synchronization mode is not supported with tf.distribute strategy. "
        "Please change the `synchronization` for variable: v"
    )


def test_mean_with_non_float_dtype_is_rejected(mirrored):
    with pytest.raises(ValueError) as err:
        make(mirrored, 1, aggregation=VariableAggregation.MEAN)
    assert str(err.value) == (
        "creating distributed tf.Variable with aggregation=MEAN and a non-floating dtype is not "
        "supported, please use a different aggregation or dtype"
    )


def test_reads_in_replica_and_cross_replica_context(mirrored):
    v = make(mirrored, aggregation=VariableAggregation.NONE)
    mirrored.run(lambda: v.assign(replica_id() + 10))
    assert local_floats(mirrored, mirrored.run(lambda: v.read_value())) == [10.0, 11.0]
    assert local_floats(mirrored, mirrored.run(lambda: v + 1)) == [11.0, 12.0]
    # cross-replica (and top level) read the primary component, as a copy
    snapshot = v.read_value()
    assert float(snapshot.detach()) == 10.0
    with mirrored.scope():
        assert float(v.read_value().detach()) == 10.0
    assert mirrored.experimental_local_results(v) == v.values


# §3.3 table: replica ctx assign(id+10), then replica ctx assign_add(python 1.0); initial 1.0
@pytest.mark.parametrize(
    ("aggregation", "after_assign", "after_add"),
    [
        (VariableAggregation.NONE, [10.0, 11.0], [11.0, 12.0]),
        (VariableAggregation.SUM, [21.0, 21.0], None),
        (VariableAggregation.MEAN, [10.5, 10.5], [11.5, 11.5]),
        (VariableAggregation.ONLY_FIRST_REPLICA, [10.0, 10.0], [11.0, 11.0]),
    ],
)
def test_replica_context_update_table(mirrored, aggregation, after_assign, after_add):
    v = make(mirrored, aggregation=aggregation)
    returned = mirrored.run(lambda: v.assign(replica_id() + 10))
    assert components(v) == after_assign
    assert local_floats(mirrored, returned) == after_assign
    if after_add is None:
        with pytest.raises(ValueError) as err:
            mirrored.run(lambda: v.assign_add(1.0))
        assert str(err.value) == NON_DISTRIBUTED_SUM
        assert components(v) == after_assign
    else:
        mirrored.run(lambda: v.assign_add(1.0))
        assert components(v) == after_add


def test_sum_tensor_assign_add_adds_each_replicas_tensor(mirrored):
    v = make(mirrored, aggregation=VariableAggregation.SUM)
    mirrored.run(lambda: v.assign_add(torch.tensor(1.0)))
    assert components(v) == [3.0, 3.0]
    mirrored.run(lambda: v.assign_sub(torch.tensor(0.5)))
    assert components(v) == [2.0, 2.0]


def test_distributed_values_in_replica_context_is_a_type_error(mirrored):
    v = make(mirrored, aggregation=VariableAggregation.SUM)
    per_replica = mirrored.experimental_distribute_values_from_function(
        lambda ctx: torch.tensor(float(ctx.replica_id_in_sync_group))
    )
    with pytest.raises(TypeError) as err:
        mirrored.run(lambda: v.assign(per_replica))
    assert str(err.value) == "Cannot use DistributedValues to update variables in replica context."


def test_cross_replica_updates(mirrored):
    v = make(mirrored, aggregation=VariableAggregation.SUM)
    with mirrored.scope():
        assert float(v.assign(6.0)) == 6.0
        assert components(v) == [6.0, 6.0]
        v.assign(1.0)
        assert float(v.assign_add(6.0, read_value=True)) == 7.0
        assert v.assign_sub(2.0, read_value=False) is None
    assert components(v) == [5.0, 5.0]
    # at top level a distributed variable behaves as in its strategy's cross-replica context
    v.assign(3.0)
    assert components(v) == [3.0, 3.0]


def test_cross_replica_assign_of_per_replica_diverges(mirrored):
    v = make(mirrored)
    per_replica = strategyjob.PerReplica((torch.tensor(5.0), torch.tensor(6.0)))
    with mirrored.scope():
        v.assign(per_replica)
    assert components(v) == [5.0, 6.0]


@pytest.mark.parametrize("op", ["scatter_min", "scatter_max", "scatter_update"])
@pytest.mark.parametrize("aggregation", [VariableAggregation.SUM, VariableAggregation.MEAN])
def test_scatter_restricted_to_none_or_first_replica(mirrored, op, aggregation):
    v = make(mirrored, [1.0, 2.0], aggregation=aggregation)
    delta = IndexedSlices(torch.tensor([5.0]), torch.tensor([0]))
    with pytest.raises(NotImplementedError) as err:
        getattr(v, op)(delta)
    assert str(err.value) == (
        f"{op} is only supported for mirrored variable (variable created within certain "
        "`tf.distribute.Strategy` scope) with NONE or `ONLY_FIRST_REPLICA` aggregation, got: "
        f"{aggregation}."
    )
    assert "VariableAggregation." in str(err.value)


def test_scatter_in_cross_and_replica_context(mirrored):
    v = make(mirrored, [1.0, 2.0], aggregation=VariableAggregation.ONLY_FIRST_REPLICA)
    delta = IndexedSlices(torch.tensor([5.0]), torch.tensor([1]))
    v.scatter_update(delta)
    assert [c.numpy().tolist() for c in v.values] == [[1.0, 5.0], [1.0, 5.0]]
    summed = make(mirrored, [0.0, 0.0], aggregation=VariableAggregation.SUM)
    mirrored.run(
        lambda: summed.scatter_add(
            IndexedSlices(torch.tensor([1.0]) + replica_id(), torch.tensor([0]))
        )
    )
    assert [c.numpy().tolist() for c in summed.values] == [[3.0, 0.0], [3.0, 0.0]]


def test_extended_update_returns_per_component_results(mirrored):
    v = make(mirrored)
    with mirrored.scope():
        result = mirrored.extended.update(v, lambda c, x: c.assign(x), args=(4.0,))
    assert components(v) == [4.0, 4.0]
    assert [float(r) for r in mirrored.experimental_local_results(result)] == [4.0, 4.0]


def test_reduce_to_and_update_doc_example(mirrored):
    v = make(mirrored, 0.0)

    def merge_fn(strategy, value, var):
        reduced = strategy.extended.reduce_to(strategyjob.ReduceOp.SUM, value, destinations=var)
        strategy.extended.update(var, lambda var, value: var.assign(value), args=(reduced,))

    def replica_fn():
        strategyjob.get_replica_context().merge_call(merge_fn, args=(torch.tensor(1.0), v))

    mirrored.run(replica_fn)
    assert components(v) == [2.0, 2.0]


def test_creating_a_variable_inside_run_gives_one_shared_variable(mirrored):
    result = mirrored.run(lambda: strategyjob.Variable(3.0))
    assert type(result) is MirroredVariable
    assert components(result) == [3.0, 3.0]


def test_torch_ops_in_replica_use_the_local_component(mirrored):
    w = make(mirrored, [[1.0], [2.0]], aggregation=VariableAggregation.NONE)
    mirrored.run(lambda: w.assign_add(torch.ones(2, 1) * replica_id()))
    x = torch.tensor([[1.0, 1.0]])
    out = mirrored.run(lambda: torch.matmul(x, w))
    assert local_floats(mirrored, out) == [3.0, 5.0]


def test_gradients_flow_to_the_local_component(mirrored):
    w = make(mirrored, [1.0, 2.0])

    def step():
        (w * w).sum().backward()

    mirrored.run(step)
    assert [c.grad.tolist() for c in w.values] == [[2.0, 4.0], [2.0, 4.0]]


def test_checkpoint_value_is_the_cross_replica_value(mirrored):
    v = make(mirrored, 2.0)
    assert float(_variables.checkpoint_reader(v)().detach()) == 2.0
    assert _values.is_distributed_variable(v)


def test_one_device_strategy_gives_a_plain_variable_on_its_device():
    strategy = strategyjob.OneDeviceStrategy("cpu:1")
    v = make(strategy)
    assert type(v) is strategyjob.Variable
    assert v.device == "/job:localhost/replica:0/task:0/device:CPU:1"
    assert v.distribute_strategy is strategy
    assert strategy.extended.variable_created_in_scope(v)
    strategy.run(lambda: v.assign_add(1.0))
    assert float(v) == 2.0


def test_default_scope_around_a_real_scope_refuses_variables(mirrored):
    default = strategyjob.get_strategy()
    with default.scope(), mirrored.scope(), pytest.raises(RuntimeError) as err:
        strategyjob.Variable(1.0)
    assert str(err.value) == (
        f"Mixing different tf.distribute.Strategy objects: {mirrored} is not {default}"
    )


def test_reads_inside_extended_update_see_the_updated_component(mirrored):
    v = make(mirrored, aggregation=VariableAggregation.NONE)
    mirrored.run(lambda: v.assign(replica_id() * 1.0))
    seen = []
    with mirrored.scope():
        mirrored.extended.update(v, lambda component: seen.append(float(v)))
    assert seen == [0.0, 1.0]


def test_other_strategy_scope_is_a_mixing_error(mirrored):
    v = make(mirrored)
    other = strategyjob.MirroredStrategy(["cpu:0", "cpu:1"])
    with other.scope(), pytest.raises(RuntimeError, match="Mixing different"):
        v.assign(2.0)


def test_updating_the_distributed_variable_inside_extended_update(mirrored):
    v = make(mirrored, 0.0)
    with mirrored.scope():
        mirrored.extended.update(v, lambda component, x: v.assign_add(x), args=(2.0,))
    assert components(v) == [2.0, 2.0]


def test_components_belong_to_their_container(mirrored):
    """``distributed_container`` (what regroup and ``extended.value_container`` ask): a component
    gives its distributed variable, and keeps it alive as any reference does; a copy of a
    component, or any other value, belongs to none."""
    with mirrored.scope():
        v = strategyjob.Variable(torch.ones(2))
    c0, c1 = v.values
    assert c0.distribute_strategy is mirrored and c1.distribute_strategy is mirrored
    assert _variables.distributed_container(c0) is v
    assert _values.regroup((c0, c1)) is v
    assert mirrored.extended.value_container(c1) is v
    assert _variables.distributed_container(copy.deepcopy(c0)) is None
    assert _variables.distributed_container(torch.ones(2)) is None
    alive = weakref.ref(v)
    del v
    gc.collect()
    assert alive() is not None and _variables.distributed_container(c0) is alive()
    del c0, c1
    gc.collect()
    assert alive() is None
