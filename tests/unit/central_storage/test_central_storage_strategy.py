"""CentralStorageStrategy(["cpu:0", "cpu:1"]): semantics doc §8, §3.5, §2.3."""

from __future__ import annotations

import pytest
import strategyjob
import torch
from strategyjob import InputOptions, InputReplicationMode
from strategyjob._variables import AggregatingVariable, VariableAggregation, VariableSynchronization
from strategyjob.strategies.central_storage import CentralStorageStrategy

NON_DISTRIBUTED_SUM = (
    "A non-DistributedValues value 1.0 cannot be reduced with the given reduce op ReduceOp.SUM."
)
CPU = "/job:localhost/replica:0/task:0/device:CPU:{}"


def replica_id() -> torch.Tensor:
    return strategyjob.get_replica_context().replica_id_in_sync_group


def local_lists(strategy, value) -> list[list]:
    return [torch.as_tensor(v).tolist() for v in strategy.experimental_local_results(value)]


def make(strategy, initial=1.0, **kwargs):
    with strategy.scope():
        return strategyjob.Variable(initial, **kwargs)


def test_public_names():
    assert strategyjob.CentralStorageStrategy is CentralStorageStrategy
    assert strategyjob.experimental.CentralStorageStrategy is CentralStorageStrategy


def test_devices_and_properties(css):
    assert css.num_replicas_in_sync == 2
    assert css.extended.worker_devices == (CPU.format(0), CPU.format(1))
    assert css.extended.parameter_devices == (CPU.format(0),)
    assert css.extended.experimental_between_graph is True
    assert css.extended.should_checkpoint is True
    assert css.extended.should_init is True
    assert css.cluster_resolver is None


def test_default_parameter_device():
    one = CentralStorageStrategy(["cpu:1"])
    assert one.num_replicas_in_sync == 1
    assert one.extended.parameter_devices == (CPU.format(1),)
    explicit = CentralStorageStrategy(["cpu:0", "cpu:1"], "cpu:1")
    assert explicit.extended.parameter_devices == (CPU.format(1),)
    default = CentralStorageStrategy()
    expected = "GPU" if torch.cuda.is_available() else "CPU"
    assert default.extended.worker_devices[0].endswith(f"device:{expected}:0")


def test_variables_are_created_once_on_the_parameter_device(css):
    v = make(css)
    assert type(v) is AggregatingVariable
    assert isinstance(v, strategyjob.Variable)
    assert not isinstance(v, strategyjob.DistributedValues)
    assert v.device == CPU.format(0)
    assert v.name == "Variable:0"
    assert css.experimental_local_results(v) == (v,)
    assert css.extended.variable_created_in_scope(v)
    # ON_READ is aggregated like ON_WRITE, not special-cased
    on_read = make(
        css,
        synchronization=VariableSynchronization.ON_READ,
        aggregation=VariableAggregation.SUM,
    )
    assert type(on_read) is AggregatingVariable


def test_one_compute_device_gives_a_plain_variable():
    one = CentralStorageStrategy(["cpu:0"])
    v = make(one)
    assert type(v) is strategyjob.Variable
    assert v.distribute_strategy is one
    assert one.extended.variable_created_in_scope(v)


def test_replicas_read_the_central_variable(css):
    v = make(css, 3.0)
    assert local_lists(css, css.run(lambda: v + replica_id())) == [3.0, 4.0]
    assert local_lists(css, css.run(lambda: v.read_value())) == [3.0, 3.0]


def test_replica_update_with_none_aggregation_fails(css):
    v = make(css)
    with pytest.raises(ValueError) as err:
        css.run(lambda: v.assign(2.0))
    assert str(err.value).startswith(
        "You must specify an aggregation method to update a AggregatingVariable in Replica "
        "Context. You can do so by passing an explicit value for argument `aggregation` to "
        "tf.Variable(..)."
    )
    assert float(v) == 1.0


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [
        (VariableAggregation.SUM, 21.0),
        (VariableAggregation.MEAN, 10.5),
        (VariableAggregation.ONLY_FIRST_REPLICA, 10.0),
    ],
)
def test_replica_assign_is_aggregated_into_one_update(css, aggregation, expected):
    v = make(css, aggregation=aggregation)
    updates = []
    original = css.extended.update

    def counting_update(var, fn, args=(), kwargs=None, group=True):
        updates.append(var)
        return original(var, fn, args, kwargs, group)

    css.extended.update = counting_update
    returned = css.run(lambda: v.assign(replica_id() + 10))
    assert float(v) == expected
    assert len(updates) == 1
    assert local_lists(css, returned) == [expected, expected]


def test_sum_assign_add_python_float_fails_and_tensor_adds_twice(css):
    v = make(css, aggregation=VariableAggregation.SUM)
    with pytest.raises(ValueError) as err:
        css.run(lambda: v.assign_add(1.0))
    assert str(err.value) == NON_DISTRIBUTED_SUM
    css.run(lambda: v.assign_add(torch.tensor(1.0)))
    assert float(v) == 3.0


def test_cross_replica_assign_of_per_replica_uses_replica_zero(css):
    v = make(css, 0.0)
    with css.scope():
        v.assign(strategyjob.PerReplica((torch.tensor(5.0), torch.tensor(6.0))))
    assert float(v) == 5.0
    v.assign(7.0)  # top level: cross-replica semantics
    assert float(v) == 7.0
    assert float(v.assign_add(1.0)) == 8.0


def test_reduce(css):
    per_replica = strategyjob.PerReplica((torch.tensor(5.0), torch.tensor(6.0)))
    assert float(css.reduce("SUM", per_replica, axis=None)) == 11.0
    assert float(css.reduce(strategyjob.ReduceOp.MEAN, per_replica, axis=None)) == 5.5


@pytest.mark.parametrize(
    ("make_strategy", "expected"),
    [
        (lambda: strategyjob.MirroredStrategy(["cpu:0", "cpu:1"]), 2.0),
        (lambda: CentralStorageStrategy(["cpu:0", "cpu:1"]), 2.0),
        (lambda: strategyjob.OneDeviceStrategy("cpu:0"), 1.0),
    ],
    ids=["mirrored", "central_storage", "one_device"],
)
def test_reduce_to_and_update_doc_example(make_strategy, expected):
    strategy = make_strategy()
    v = make(strategy, 0.0)

    def merge_fn(strategy, value, var):
        reduced = strategy.extended.reduce_to(strategyjob.ReduceOp.SUM, value, destinations=var)
        strategy.extended.update(var, lambda var, value: var.assign(value), args=(reduced,))

    def replica_fn():
        strategyjob.get_replica_context().merge_call(merge_fn, args=(torch.tensor(1.0), v))

    strategy.run(replica_fn)
    for component in strategy.experimental_local_results(v):
        assert float(component) == expected


def test_merge_call_doc_example(css):
    def fn(three):
        value = three + replica_id()
        total = strategyjob.get_replica_context().merge_call(
            lambda strategy, x: sum(strategy.experimental_local_results(x)), args=(value,)
        )
        return total + value

    assert local_lists(css, css.run(fn, args=(torch.tensor(3),))) == [10, 11]


def test_input_is_rebatched_like_mirrored(css):
    batches = [torch.arange(5)[i : i + 2] for i in range(0, 5, 2)]
    steps = [local_lists(css, x) for x in css.experimental_distribute_dataset(batches)]
    assert steps == [[[0], [1]], [[2], [3]], [[4], []]]


def test_distribute_datasets_from_function_input_context(css):
    seen = []

    def dataset_fn(ctx):
        seen.append((ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync))
        return [torch.arange(8)[i : i + 2] for i in range(0, 8, 2)]

    steps = [local_lists(css, x) for x in css.distribute_datasets_from_function(dataset_fn)]
    assert seen == [(1, 0, 2)]
    assert steps == [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]


def test_per_replica_input_mode_is_not_implemented(css):
    options = InputOptions(experimental_replication_mode=InputReplicationMode.PER_REPLICA)
    with pytest.raises(NotImplementedError, match="PER_REPLICA"):
        css.experimental_distribute_dataset([torch.arange(4)], options)
    with pytest.raises(NotImplementedError) as err:
        css.distribute_datasets_from_function(lambda ctx: [torch.arange(2)], options)
    assert str(err.value) == (
        "InputReplicationMode.PER_REPLICA is only supported in "
        "`experimental_distribute_datasets_from_function` of tf.distribute.MirroredStrategy"
    )
    # any other options work (TF raises an AttributeError here: a typo, not reproduced)
    dist = css.experimental_distribute_dataset(
        [torch.arange(4)], InputOptions(experimental_fetch_to_device=False)
    )
    assert [local_lists(css, x) for x in dist] == [[[0, 1], [2, 3]]]


def test_torch_ops_in_replicas(css):
    w = make(css, [[1.0], [2.0]])
    x = strategyjob.PerReplica((torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])))
    out = css.run(lambda x: torch.matmul(x, w), args=(x,))
    assert local_lists(css, out) == [[[1.0]], [[2.0]]]


def test_scatter_on_the_central_variable(css):
    from strategyjob._variables import IndexedSlices

    v = make(css, [0.0, 0.0], aggregation=VariableAggregation.ONLY_FIRST_REPLICA)
    v.scatter_add(IndexedSlices(torch.tensor([2.0]), torch.tensor([1])))
    assert v.numpy().tolist() == [0.0, 2.0]
    css.run(
        lambda: v.scatter_update(
            IndexedSlices(torch.tensor([5.0]) + replica_id(), torch.tensor([0]))
        )
    )
    assert v.numpy().tolist() == [5.0, 2.0]
    summed = make(css, [0.0], aggregation=VariableAggregation.SUM)
    with pytest.raises(NotImplementedError, match="ONLY_FIRST_REPLICA"):
        css.run(lambda: summed.scatter_add(IndexedSlices(torch.tensor([1.0]), torch.tensor([0]))))


def test_device_argument_is_ignored_in_scope(css):
    with css.scope():
        v = strategyjob.Variable(1.0, device="cpu:1")
    assert v.device == CPU.format(0)


def test_updating_the_aggregating_variable_inside_extended_update(css):
    v = make(css, 0.0)
    with css.scope():
        css.extended.update(v, lambda central, x: v.assign_add(x), args=(2.0,))
    assert float(v) == 2.0
