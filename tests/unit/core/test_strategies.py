"""Default strategy, OneDeviceStrategy, MirroredStrategy facts: semantics doc §1.5, §1.6."""

from __future__ import annotations

import pytest
import strategyjob as sj
import torch
from strategyjob import _variables


def _batches(n: int, size: int) -> list[torch.Tensor]:
    data = torch.arange(n)
    return [data[i : i + size] for i in range(0, n, size)]


# --- default strategy ---------------------------------------------------------------------------


def test_default_strategy_facts() -> None:
    default = sj.get_strategy()
    assert default is sj.get_strategy()  # a singleton
    assert default.num_replicas_in_sync == 1
    assert default.cluster_resolver is None
    assert default.extended.should_checkpoint and default.extended.should_save_summary
    assert default.run(lambda x: x + 1, args=(1,)) == 2
    value = torch.tensor([1.0])
    assert default.extended.reduce_to("SUM", value, "cpu:0") is value
    with pytest.raises(RuntimeError) as err:
        default.extended.worker_devices  # noqa: B018
    assert (
        str(err.value) == "worker_devices() method unsupported by default tf.distribute.Strategy."
    )
    with pytest.raises(RuntimeError, match=r"^parameter_devices\(\) method unsupported"):
        default.extended.parameter_devices  # noqa: B018


def test_default_run_has_a_tensor_replica_id() -> None:
    default = sj.get_strategy()

    def fn() -> tuple:
        ctx = sj.get_replica_context()
        return ctx.replica_id_in_sync_group, sj.has_strategy(), sj.in_cross_replica_context()

    replica_id, has, cross = default.run(fn)
    assert isinstance(replica_id, torch.Tensor) and int(replica_id) == 0
    assert (has, cross) == (False, False)


def test_default_variable_created_in_scope() -> None:
    default = sj.get_strategy()
    assert default.extended.variable_created_in_scope(sj.Variable(1.0))
    one = sj.OneDeviceStrategy("cpu:0")
    with one.scope():
        owned = sj.Variable(1.0)
    assert not default.extended.variable_created_in_scope(owned)
    assert one.extended.variable_created_in_scope(owned)


def test_extended_create_variable_is_what_variable_in_scope_makes() -> None:
    mirrored = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    with mirrored.scope():
        in_scope = sj.Variable(1.0, name="a")
    made = mirrored.extended.create_variable(torch.tensor(2.0), name="b")
    assert type(made) is type(in_scope) is _variables.MirroredVariable
    assert [float(c.numpy()) for c in made.values] == [2.0, 2.0]
    assert made.name == "b:0" and mirrored.extended.variable_created_in_scope(made)
    on_read = mirrored.extended.create_variable(
        0.0,
        synchronization=sj.VariableSynchronization.ON_READ,
        aggregation=sj.VariableAggregation.SUM,
    )
    assert isinstance(on_read, _variables.SyncOnReadVariable)
    plain = sj.get_strategy().extended.create_variable(3.0)
    assert type(plain) is sj.Variable and plain.distribute_strategy is None


def test_default_datasets() -> None:
    default = sj.get_strategy()
    dataset = _batches(5, 2)
    assert default.experimental_distribute_dataset(dataset) is dataset
    contexts = []
    result = default.distribute_datasets_from_function(lambda ctx: contexts.append(ctx) or "ds")
    assert result == "ds"
    ctx = contexts[0]
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (1, 0, 1)


# --- OneDeviceStrategy --------------------------------------------------------------------------


def test_one_device_facts() -> None:
    one = sj.OneDeviceStrategy("cpu:0")
    assert one.num_replicas_in_sync == 1
    assert one.extended.worker_devices == ("/job:localhost/replica:0/task:0/device:CPU:0",)
    assert one.extended.parameter_devices == one.extended.worker_devices
    assert one.cluster_resolver is None
    result = one.run(lambda: torch.ones(2) * 3)
    assert isinstance(result, torch.Tensor) and result.tolist() == [3.0, 3.0]
    assert one.experimental_local_results(result) == (result,)
    with one.scope():
        var = sj.Variable(2.0)
    assert type(var) is sj.Variable  # a plain variable on the device
    assert var.device == "/job:localhost/replica:0/task:0/device:CPU:0"


def test_one_device_does_not_rebatch() -> None:
    one = sj.OneDeviceStrategy("cpu:0")
    batches = [b.tolist() for b in one.experimental_distribute_dataset(_batches(5, 2))]
    assert batches == [[0, 1], [2, 3], [4]]
    contexts = []

    def dataset_fn(ctx: sj.InputContext) -> list:
        contexts.append(ctx)
        return _batches(4, 2)

    batches = [b.tolist() for b in one.distribute_datasets_from_function(dataset_fn)]
    assert batches == [[0, 1], [2, 3]]
    ctx = contexts[0]
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (1, 0, 1)


# --- MirroredStrategy ---------------------------------------------------------------------------


def test_mirrored_facts() -> None:
    strategy = sj.MirroredStrategy(["cpu:0", "/device:CPU:1"])
    assert strategy.num_replicas_in_sync == 2
    names = (
        "/job:localhost/replica:0/task:0/device:CPU:0",
        "/job:localhost/replica:0/task:0/device:CPU:1",
    )
    assert strategy.extended.worker_devices == names
    assert strategy.extended.parameter_devices == names
    assert strategy.extended.topology.local_devices == (
        torch.device("cpu", 0),
        torch.device("cpu", 1),
    )
    assert strategy.cluster_resolver is None
    assert (
        strategy.extended.topology.num_workers == 1 and strategy.extended.topology.worker_index == 0
    )
    assert [strategy.extended.topology.global_replica_id(i) for i in range(2)] == [0, 1]
    worker = strategy.extended._input_workers()
    assert len(worker) == 1 and worker[0].device == torch.device("cpu", 0)


def test_mirrored_default_devices() -> None:
    strategy = sj.MirroredStrategy()
    expected = torch.cuda.device_count() if torch.cuda.is_available() else 1
    assert strategy.num_replicas_in_sync == expected


def test_mirrored_device_errors() -> None:
    with pytest.raises(ValueError, match="No duplicates allowed in `devices` argument"):
        sj.MirroredStrategy(["cpu:0", "/cpu:0"])
    with pytest.raises(ValueError, match="at least one device"):
        sj.MirroredStrategy([])
    with pytest.raises(RuntimeError) as err:
        sj.MirroredStrategy(["/job:worker/task:0/device:CPU:0", "/job:worker/task:1/device:CPU:0"])
    assert str(err.value) == (
        "In-graph multi-worker training with `MirroredStrategy` is not supported in eager mode."
    )


def test_mirrored_variables_have_one_component_per_device() -> None:
    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        var = sj.Variable(1.0)
    assert [c.name for c in var.values] == ["Variable:0", "Variable/replica_1:0"]
    assert strategy.extended.variable_created_in_scope(var)
    assert strategy.experimental_local_results(var) == var.values
    assert strategy.extended.value_container(var.values[1]) is var


def test_mirrored_rebatches_datasets() -> None:
    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    steps = [
        [t.tolist() for t in strategy.experimental_local_results(step)]
        for step in strategy.experimental_distribute_dataset(_batches(10, 4))
    ]
    assert steps == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8], [9]]]


def test_next_inside_replica_fn_is_refused() -> None:
    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    iterator = iter(strategy.experimental_distribute_dataset(_batches(8, 4)))
    with pytest.raises(ValueError, match=r"next\(iterator\) should be called from outside"):
        strategy.run(lambda: next(iterator))


def test_custom_training_step_end_to_end() -> None:
    """Variables, run, all_reduce-based update and reduce in one small loop."""
    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        weight = sj.Variable(0.0, aggregation=sj.VariableAggregation.MEAN)

    def step(x: torch.Tensor) -> torch.Tensor:
        # gradient of mean((w - x)^2) w.r.t. w on this replica's batch, applied with MEAN
        grad = 2 * (weight.read_value().detach() - x.float()).mean()
        weight.assign_sub(0.25 * grad)
        return x.float().sum()

    totals = []
    for batch in strategy.experimental_distribute_dataset([torch.tensor([1, 3, 5, 7])] * 3):
        totals.append(float(strategy.reduce("SUM", strategy.run(step, args=(batch,)), axis=None)))
    assert totals == [16.0] * 3
    # w <- w - 0.25 * 2 * (w - 4) each step: 2, 3, 3.5 (same on both components)
    assert [float(c.numpy()) for c in weight.values] == [3.5, 3.5]
