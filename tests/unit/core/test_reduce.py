"""ReduceOp, Strategy.reduce/gather, extended.reduce_to/batch_reduce_to/update/broadcast_to:
semantics doc §2.1-§2.3, §2.5-§2.7."""

from __future__ import annotations

import numpy as np
import pytest
import strategyjob as sj
import torch
from strategyjob import _reduce


@pytest.fixture
def mirrored() -> sj.MirroredStrategy:
    return sj.MirroredStrategy(["cpu:0", "cpu:1"])


def per_replica(*values: list) -> sj.PerReplica:
    return sj.PerReplica([torch.tensor(v) for v in values])


# --- ReduceOp §2.1 ------------------------------------------------------------------------------


def test_reduce_op_enum() -> None:
    assert [op.value for op in sj.ReduceOp] == ["SUM", "MEAN"]
    assert sj.ReduceOp("SUM") is sj.ReduceOp.SUM
    assert str(sj.ReduceOp.SUM) == "ReduceOp.SUM"


@pytest.mark.parametrize(
    ("text", "op"),
    [("sum", "SUM"), ("Sum", "SUM"), ("SUM", "SUM"), ("mean", "MEAN"), ("mEaN", "MEAN")],
)
def test_strings_are_case_insensitive_in_apis(text: str, op: str) -> None:
    assert _reduce.to_reduce_op(text) is sj.ReduceOp[op]


def test_reduce_op_constructor_is_strict() -> None:
    with pytest.raises(ValueError, match=r"^'sum' is not a valid ReduceOp$"):
        sj.ReduceOp("sum")


def test_an_unknown_op_lists_the_valid_ones() -> None:
    """TensorFlow's message, then the ops that exist: ``"AVG"`` is a guess a user makes."""
    valid = (
        "Use one of: tf.distribute.ReduceOp.SUM, tf.distribute.ReduceOp.MEAN, "
        "or the strings 'sum' and 'mean' (in any case)."
    )
    with pytest.raises(ValueError) as raised:
        _reduce.to_reduce_op("max")
    assert str(raised.value) == f"'MAX' is not a valid ReduceOp. {valid}"
    with pytest.raises(ValueError) as raised:
        sj.get_strategy().reduce("max", 1.0, axis=None)
    assert str(raised.value) == f"'MAX' is not a valid ReduceOp. {valid}"
    with pytest.raises(ValueError) as raised:
        sj.MirroredStrategy().reduce("AVG", torch.tensor(1.0), axis=None)
    assert str(raised.value) == f"'AVG' is not a valid ReduceOp. {valid}"
    with pytest.raises(ValueError) as raised:
        sj.get_replica_context().all_reduce(sj.VariableAggregation.SUM, 1.0)
    assert str(raised.value).endswith(f"is not a valid ReduceOp. {valid}")


def test_from_variable_aggregation() -> None:
    agg = sj.VariableAggregation
    assert sj.ReduceOp.from_variable_aggregation(agg.SUM) is sj.ReduceOp.SUM
    assert sj.ReduceOp.from_variable_aggregation(agg.MEAN) is sj.ReduceOp.MEAN
    for bad in (agg.NONE, agg.ONLY_FIRST_REPLICA):
        with pytest.raises(ValueError) as err:
            sj.ReduceOp.from_variable_aggregation(bad)
        assert str(err.value) == (
            f"Could not convert from `tf.VariableAggregation` VariableAggregation.{bad.name} "
            "to`tf.distribute.ReduceOp` type"
        )


# --- Strategy.reduce §2.2 -----------------------------------------------------------------------


def test_reduce_axis_none_is_elementwise(mirrored: sj.MirroredStrategy) -> None:
    value = per_replica([0, 1, 2, 3], [4, 5, 6, 7])
    assert mirrored.reduce(sj.ReduceOp.SUM, value, axis=None).tolist() == [4, 6, 8, 10]
    assert mirrored.reduce("mean", per_replica([0.0, 2.0], [4.0, 6.0]), axis=None).tolist() == [
        2.0,
        4.0,
    ]


def test_reduce_mean_uses_global_element_count(mirrored: sj.MirroredStrategy) -> None:
    value = per_replica([0.0, 1.0, 2.0, 3.0], [4.0, 5.0])
    assert float(mirrored.reduce("MEAN", value, axis=0)) == 2.5  # 15 / 6
    assert float(mirrored.reduce("SUM", value, axis=0)) == 15.0


@pytest.mark.parametrize(
    ("components", "total", "mean"),
    [
        (([0.0, 1.0], [2.0, 3.0]), 6.0, 1.5),
        (([4.0], [5.0]), 9.0, 4.5),
        (([4.0], []), 4.0, 4.0),  # an empty replica adds 0 to numerator and denominator
    ],
)
def test_reduce_observed_numbers(
    mirrored: sj.MirroredStrategy, components: tuple, total: float, mean: float
) -> None:
    value = per_replica(*components)
    assert float(mirrored.reduce("SUM", value, axis=0)) == total
    assert float(mirrored.reduce("MEAN", value, axis=0)) == mean


def test_reduce_with_tuple_and_negative_axes(mirrored: sj.MirroredStrategy) -> None:
    value = per_replica([[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0]])
    assert float(mirrored.reduce("SUM", value, axis=(0, 1))) == 21.0
    assert float(mirrored.reduce("MEAN", value, axis=[0, -1])) == 3.5
    assert mirrored.reduce("SUM", value, axis=-2).tolist() == [9.0, 12.0]
    assert mirrored.reduce("MEAN", value, axis=0).tolist() == [3.0, 4.0]


def test_reduce_axis_errors(mirrored: sj.MirroredStrategy) -> None:
    value = per_replica([1.0, 2.0], [3.0])
    with pytest.raises(ValueError, match=r"^`axis` = 1 out of range for `value` with rank 1$"):
        mirrored.reduce("SUM", value, axis=1)
    with pytest.raises(ValueError, match=r"^`axis` = -2 out of range for `value` with rank 1$"):
        mirrored.reduce("MEAN", value, axis=-2)
    with pytest.raises(TypeError, match=r"^Expected `axis` to be an integer, tuple or list not: "):
        mirrored.reduce("SUM", value, axis="0")


def test_reduce_non_distributed_value(mirrored: sj.MirroredStrategy) -> None:
    tensor = torch.tensor([1.0, 2.0])
    assert mirrored.reduce("MEAN", tensor, axis=None) is tensor
    with pytest.raises(ValueError) as err:
        mirrored.reduce("SUM", 1.0, axis=None)
    assert str(err.value) == (
        "A non-DistributedValues value 1.0 cannot be reduced with the given reduce op ReduceOp.SUM."
    )
    zeros = mirrored.reduce("SUM", [0, 0], axis=None)  # all-zero Python values: zeros back
    assert isinstance(zeros, np.ndarray) and zeros.tolist() == [0, 0]


def test_reduce_mirrored(mirrored: sj.MirroredStrategy) -> None:
    value = sj.Mirrored([torch.tensor(3.0), torch.tensor(3.0)])
    assert mirrored.reduce("MEAN", value, axis=None) is value.values[0]
    with pytest.raises(ValueError, match="Cannot reduce a Mirrored value"):
        mirrored.reduce("SUM", value, axis=None)


def test_reduce_run_results(mirrored: sj.MirroredStrategy) -> None:
    result = mirrored.run(
        lambda: torch.arange(2.0) + 2 * int(sj.get_replica_context().replica_id_in_sync_group)
    )  # [0, 1] and [2, 3]
    assert float(mirrored.reduce("SUM", result, axis=0)) == 6.0
    assert float(mirrored.reduce("MEAN", result, axis=0)) == 1.5


def test_reduce_in_default_and_one_device() -> None:
    default = sj.get_strategy()
    tensor = torch.tensor([1.0, 2.0])
    assert default.reduce("SUM", tensor, axis=None) is tensor
    one = sj.OneDeviceStrategy("cpu:0")
    assert one.reduce("SUM", tensor, axis=None) is tensor
    assert float(one.reduce("MEAN", [1.0, 2.0], axis=0)) == 1.5
    assert float(default.reduce("SUM", tensor, axis=0)) == 3.0


def test_reduce_integer_mean_divides(mirrored: sj.MirroredStrategy) -> None:
    value = per_replica([1, 2], [3])
    assert float(mirrored.reduce("MEAN", value, axis=0)) == 2.0


# --- reduce_to / batch_reduce_to / update / broadcast_to §2.3 -----------------------------------


def test_reduce_to_device_gives_a_tensor(mirrored: sj.MirroredStrategy) -> None:
    value = per_replica(1.0, 2.0)
    result = mirrored.extended.reduce_to("sum", value, "cpu:0")
    assert isinstance(result, torch.Tensor) and float(result) == 3.0
    result = mirrored.extended.reduce_to(sj.ReduceOp.MEAN, value, torch.tensor(0.0))
    assert float(result) == 1.5


def test_reduce_to_distributed_destination_gives_mirrored(mirrored: sj.MirroredStrategy) -> None:
    value = per_replica(1.0, 2.0)
    result = mirrored.extended.reduce_to("SUM", value, value)
    assert isinstance(result, sj.Mirrored)
    assert [float(v) for v in result.values] == [3.0, 3.0]
    assert result.values[0] is not result.values[1]


def test_reduce_to_rejects_lists_and_aggregations(mirrored: sj.MirroredStrategy) -> None:
    with pytest.raises(ValueError, match="not a list"):
        mirrored.extended.reduce_to("SUM", per_replica(1.0, 2.0), ["cpu:0", "cpu:1"])
    with pytest.raises(ValueError, match="from_variable_aggregation"):
        mirrored.extended.reduce_to(sj.VariableAggregation.SUM, per_replica(1.0, 2.0), "cpu:0")


def test_batch_reduce_to_keeps_order(mirrored: sj.MirroredStrategy) -> None:
    pairs = [(per_replica(1.0, 2.0), "cpu:0"), (5.0, "cpu:0"), (per_replica(10.0, 30.0), "cpu:1")]
    results = mirrored.extended.batch_reduce_to("MEAN", pairs)
    assert [float(r) for r in results] == [1.5, 5.0, 20.0]


def test_reduce_to_and_update_doc_example(mirrored: sj.MirroredStrategy) -> None:
    with mirrored.scope():
        var = sj.Variable(0.0)

    def merge_fn(strategy: sj.Strategy, value: sj.PerReplica) -> None:
        reduced = strategy.extended.reduce_to(sj.ReduceOp.SUM, value, var)
        strategy.extended.update(var, lambda v, t: v.assign(t), args=(reduced,))

    mirrored.run(lambda: sj.get_replica_context().merge_call(merge_fn, args=(torch.tensor(1.0),)))
    assert [float(c.numpy()) for c in var.values] == [2.0, 2.0]


def test_one_device_reduce_to_and_update() -> None:
    one = sj.OneDeviceStrategy("cpu:0")
    with one.scope():
        var = sj.Variable(0.0)

    def merge_fn(strategy: sj.Strategy, value: torch.Tensor) -> None:
        reduced = strategy.extended.reduce_to(sj.ReduceOp.SUM, value, var)
        strategy.extended.update(var, lambda v, t: v.assign(t), args=(reduced,))

    one.run(lambda: sj.get_replica_context().merge_call(merge_fn, args=(torch.tensor(1.0),)))
    assert float(var.numpy()) == 1.0


def test_update_group_and_replica_context(mirrored: sj.MirroredStrategy) -> None:
    with mirrored.scope():
        var = sj.Variable(1.0)
    grouped = mirrored.extended.update(var, lambda v, x: v.assign_add(x), args=(6.0,))
    assert isinstance(grouped, sj.Mirrored)
    assert [float(x) for x in grouped.values] == [7.0, 7.0]
    ungrouped = mirrored.extended.update(var, lambda v: v.read_value().detach() * 2, group=False)
    assert isinstance(ungrouped, tuple) and [float(x) for x in ungrouped] == [14.0, 14.0]

    def fn() -> None:  # in replica context, update goes through merge_call (args merged)
        delta = torch.tensor(float(sj.get_replica_context().replica_id_in_sync_group))
        mirrored.extended.update(var, lambda v, d: v.assign_add(d), args=(delta,))

    mirrored.run(fn)
    assert [float(c.numpy()) for c in var.values] == [7.0, 8.0]


def test_broadcast_to(mirrored: sj.MirroredStrategy) -> None:
    with mirrored.scope():
        var = sj.Variable(0.0)
    result = mirrored.extended.broadcast_to(torch.tensor(4.0), var)
    assert isinstance(result, sj.Mirrored) and [float(v) for v in result.values] == [4.0, 4.0]
    assert float(mirrored.extended.broadcast_to(torch.tensor(4.0), "cpu:1")) == 4.0


# --- gather §2.5 --------------------------------------------------------------------------------


def test_gather(mirrored: sj.MirroredStrategy) -> None:
    assert mirrored.gather(per_replica([1, 2], [2, 4]), axis=0).tolist() == [1, 2, 2, 4]
    value = per_replica([[1], [2]], [[3]])
    assert mirrored.gather(value, 0).tolist() == [[1], [2], [3]]
    assert mirrored.gather(per_replica([[1, 2]], [[3]]), axis=1).tolist() == [[1, 2, 3]]
    plain = torch.tensor([1, 2])
    assert mirrored.gather(plain, 0) is plain
    assert sj.get_strategy().gather(plain, 0) is plain
    with pytest.raises(NotImplementedError, match=r"^gather does not support IndexedSlices$"):
        mirrored.gather(torch.tensor([[1.0]]).to_sparse(), 0)
    with pytest.raises(ValueError, match="rank >= 1"):
        mirrored.gather(per_replica(1, 2), 0)


# --- local results and values from function §2.6, §2.7 ------------------------------------------


def test_experimental_local_results(mirrored: sj.MirroredStrategy) -> None:
    value = per_replica(1.0, 2.0)
    assert mirrored.experimental_local_results(value) == value.values
    assert mirrored.experimental_local_results(5) == (5,)
    nested = mirrored.experimental_local_results({"a": value, "b": 3})
    assert [float(n["a"]) for n in nested] == [1.0, 2.0] and [n["b"] for n in nested] == [3, 3]
    assert sj.get_strategy().experimental_local_results(value) == (value,)


def test_distribute_values_from_function(mirrored: sj.MirroredStrategy) -> None:
    values = mirrored.experimental_distribute_values_from_function(
        lambda ctx: ctx.replica_id_in_sync_group * 10 + ctx.num_replicas_in_sync
    )
    assert isinstance(values, sj.PerReplica) and values.values == (2, 12)
    assert str(values) == "PerReplica:{\n  0: 2,\n  1: 12\n}"
    same = mirrored.experimental_distribute_values_from_function(lambda ctx: "x")
    assert isinstance(same, sj.PerReplica) and same.values == ("x", "x")  # always wrapped
    array = np.array([3.0, 2.0, 1.0])
    one = sj.OneDeviceStrategy("cpu:0")
    assert (
        one.experimental_distribute_values_from_function(
            lambda ctx: array[ctx.replica_id_in_sync_group]
        )
        == 3.0
    )
    contexts = []
    sj.get_strategy().experimental_distribute_values_from_function(contexts.append)
    assert (
        str(contexts[0]) == "tf.distribute.ValueContext(replica id 0,  total replicas in sync: 1)"
    )
