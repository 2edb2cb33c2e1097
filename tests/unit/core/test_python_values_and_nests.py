"""Python numbers, numpy values and nests through every reduce / gather / all_reduce path, under
the default, OneDevice, Mirrored and CentralStorage strategies (semantics doc §2.2-§2.6).

TF converts the leaves of ``ReplicaContext.all_reduce``/``all_gather`` to a tensor in each
replica, MEAN is a true division (``truediv``: ints give a float), and nests holding
distributed values reduce and gather leaf by leaf. MultiWorkerMirroredStrategy is covered by
tests/multiprocess/test_python_values_and_losses.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import strategyjob as sj
import torch

NON_DISTRIBUTED_SUM = (
    "A non-DistributedValues value 1.0 cannot be reduced with the given reduce op ReduceOp.SUM."
)


def _strategy(name: str) -> sj.Strategy:
    if name == "default":
        return sj.get_strategy()
    if name == "one_device":
        return sj.OneDeviceStrategy("cpu:0")
    if name == "mirrored":
        return sj.MirroredStrategy(["cpu:0", "cpu:1"])
    return sj.CentralStorageStrategy(["cpu:0", "cpu:1"])


STRATEGIES = ["default", "one_device", "mirrored", "central_storage"]


def _replica_id() -> int:
    return int(sj.get_replica_context().replica_id_in_sync_group)


def _local(strategy: sj.Strategy, value):
    return strategy.experimental_local_results(value)


# --- ReplicaContext.all_reduce / all_gather of Python and numpy values ---------------------------


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize(
    ("value", "dtype", "expected_per_replica"),
    [
        (1.0, torch.float32, 1.0),
        (2, torch.int64, 2),
        (np.float32(1.5), torch.float32, 1.5),
        (np.float64(0.25), torch.float64, 0.25),
        (np.int32(3), torch.int32, 3),
        (np.array([1.0, 2.0]), torch.float64, [1.0, 2.0]),
    ],
)
def test_all_reduce_sum_of_python_and_numpy_values(name, value, dtype, expected_per_replica):
    strategy = _strategy(name)
    replicas = strategy.num_replicas_in_sync
    results = _local(
        strategy, strategy.run(lambda: sj.get_replica_context().all_reduce("SUM", value))
    )
    assert len(results) == replicas
    expected = torch.tensor(expected_per_replica, dtype=dtype) * replicas
    for result in results:
        assert isinstance(result, torch.Tensor)
        assert result.dtype == dtype
        torch.testing.assert_close(result, expected, rtol=0, atol=0)


@pytest.mark.parametrize("name", STRATEGIES)
def test_all_reduce_of_a_nest_of_python_values(name: str) -> None:
    strategy = _strategy(name)
    replicas = strategy.num_replicas_in_sync
    value = {"a": 1.0, "b": [2, np.int64(3)], "c": (np.ones(2, np.float32),)}

    results = _local(
        strategy, strategy.run(lambda: sj.get_replica_context().all_reduce("SUM", value))
    )
    for result in results:
        assert set(result) == {"a", "b", "c"}
        assert isinstance(result["b"], list) and isinstance(result["c"], tuple)
        assert result["a"].item() == replicas
        assert [t.item() for t in result["b"]] == [2 * replicas, 3 * replicas]
        assert result["c"][0].tolist() == [float(replicas)] * 2
    means = _local(
        strategy, strategy.run(lambda: sj.get_replica_context().all_reduce("MEAN", value))
    )
    for result in means:
        assert result["a"].item() == 1.0
        assert [t.item() for t in result["b"]] == [2.0, 3.0]  # MEAN of ints is a float


@pytest.mark.parametrize("name", ["mirrored", "central_storage"])
def test_all_reduce_mean_of_ints_is_true_division(name: str) -> None:
    strategy = _strategy(name)

    def fn():
        ctx = sj.get_replica_context()
        rid = _replica_id()
        return (
            ctx.all_reduce("MEAN", rid + 1),  # 1 and 2
            ctx.all_reduce("MEAN", torch.tensor([rid], dtype=torch.int32)),
            ctx.all_reduce("SUM", rid + 1),
        )

    for mean, mean32, total in _local(strategy, strategy.run(fn)):
        assert mean.dtype == torch.float64 and mean.item() == 1.5  # TF truediv: never floored
        assert mean32.dtype == torch.float64 and mean32.tolist() == [0.5]
        assert total.dtype == torch.int64 and total.item() == 3


@pytest.mark.parametrize("name", ["mirrored", "central_storage"])
def test_all_reduce_of_per_replica_python_values(name: str) -> None:
    strategy = _strategy(name)
    results = strategy.run(lambda: sj.get_replica_context().all_reduce("SUM", _replica_id() + 0.5))
    assert [t.item() for t in _local(strategy, results)] == [2.0, 2.0]


def test_all_reduce_of_mirrored_value_and_variable_reads_each_replica() -> None:
    strategy = _strategy("mirrored")
    mirrored = sj.Mirrored([torch.tensor(3.0), torch.tensor(3.0)])
    with strategy.scope():
        variable = sj.Variable(torch.tensor([1.0, 2.0]))

    def fn():
        ctx = sj.get_replica_context()
        return ctx.all_reduce("SUM", mirrored), ctx.all_reduce("SUM", variable)

    for from_mirrored, from_variable in _local(strategy, strategy.run(fn)):
        assert from_mirrored.item() == 6.0
        assert from_variable.tolist() == [2.0, 4.0]
    assert variable.numpy().tolist() == [1.0, 2.0]  # read, never written


def test_all_reduce_sum_of_one_captured_tensor_is_still_non_distributed() -> None:
    # The very same tensor object on every replica is one value (TF's regroup), which a SUM
    # over several replicas refuses: converting applies to non-tensor leaves only.
    strategy = _strategy("mirrored")
    shared = torch.tensor(1.0)
    with pytest.raises(ValueError) as err:
        strategy.run(lambda: sj.get_replica_context().all_reduce("SUM", shared))
    assert str(err.value) == NON_DISTRIBUTED_SUM


def test_all_reduce_in_default_context_returns_a_tensor() -> None:
    result = sj.get_replica_context().all_reduce("SUM", 1.5)
    assert isinstance(result, torch.Tensor) and result.item() == 1.5


@pytest.mark.parametrize("name", STRATEGIES)
def test_all_gather_of_numpy_values_and_nests(name: str) -> None:
    strategy = _strategy(name)
    replicas = strategy.num_replicas_in_sync
    shared = np.array([1.0, 2.0])  # the same array object on every replica: each converts it

    def fn():
        rid = _replica_id()
        ctx = sj.get_replica_context()
        nest = {"id": np.array([rid]), "x": [np.full((1, 2), rid + 0.5)]}
        return ctx.all_gather(shared, 0), ctx.all_gather(nest, 0)

    for flat, nest in _local(strategy, strategy.run(fn)):
        assert flat.tolist() == [1.0, 2.0] * replicas
        assert nest["id"].tolist() == list(range(replicas))
        assert isinstance(nest["x"], list)
        assert nest["x"][0].tolist() == [[r + 0.5] * 2 for r in range(replicas)]


@pytest.mark.parametrize("name", STRATEGIES)
def test_all_gather_of_a_python_scalar_needs_rank_one(name: str) -> None:
    strategy = _strategy(name)
    if strategy.num_replicas_in_sync == 1:
        result = strategy.run(lambda: sj.get_replica_context().all_gather(1.0, 0))
        assert isinstance(result, torch.Tensor) and result.item() == 1.0  # returned as is
        return
    with pytest.raises(ValueError, match="needs components of rank >= 1"):
        strategy.run(lambda: sj.get_replica_context().all_gather(1.0, 0))


# --- Strategy.gather / reduce / experimental_local_results of nests ------------------------------


def _values_nest(strategy: sj.Strategy):
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: {
            "a": torch.tensor([float(ctx.replica_id_in_sync_group)]),
            "b": [
                torch.full(
                    (ctx.replica_id_in_sync_group + 1, 2), float(ctx.replica_id_in_sync_group)
                )
            ],
        }
    )


@pytest.mark.parametrize("name", ["mirrored", "central_storage"])
def test_gather_of_a_nest_gathers_every_leaf(name: str) -> None:
    strategy = _strategy(name)
    gathered = strategy.gather(_values_nest(strategy), axis=0)
    assert set(gathered) == {"a", "b"} and isinstance(gathered["b"], list)
    assert gathered["a"].tolist() == [0.0, 1.0]  # replica 1's data is not dropped
    assert gathered["b"][0].tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]


@pytest.mark.parametrize("name", ["mirrored", "central_storage"])
def test_gather_of_a_nest_with_a_plain_leaf(name: str) -> None:
    strategy = _strategy(name)
    value = {"per_replica": sj.PerReplica([torch.tensor([1]), torch.tensor([2])]), "plain": 5}
    assert strategy.gather(value, 0)["per_replica"].tolist() == [1, 2]
    assert strategy.gather(value, 0)["plain"] == 5  # non-distributed: unchanged


@pytest.mark.parametrize("name", ["default", "one_device"])
def test_gather_of_a_nest_with_one_replica_is_the_nest(name: str) -> None:
    strategy = _strategy(name)
    value = _values_nest(strategy)
    gathered = strategy.gather(value, 0)
    assert gathered["a"].tolist() == [0.0]
    assert gathered["b"][0].tolist() == [[0.0, 0.0]]


@pytest.mark.parametrize("name", ["mirrored", "central_storage"])
def test_reduce_of_a_nest_reduces_every_leaf(name: str) -> None:
    strategy = _strategy(name)
    value = {
        "loss": sj.PerReplica([torch.tensor(1.0), torch.tensor(3.0)]),
        "count": [sj.PerReplica([torch.tensor(2), torch.tensor(3)])],
    }
    total = strategy.reduce("SUM", value, axis=None)
    assert total["loss"].item() == 4.0 and total["count"][0].item() == 5
    mean = strategy.reduce("MEAN", value, axis=None)
    assert mean["loss"].item() == 2.0
    assert mean["count"][0].dtype == torch.float64 and mean["count"][0].item() == 2.5
    with_axis = strategy.reduce("MEAN", _values_nest(strategy), axis=0)
    assert with_axis["a"].item() == 0.5
    assert with_axis["b"][0].tolist() == pytest.approx([2 / 3, 2 / 3])  # 3 rows in all
    assert strategy.reduce("SUM", _values_nest(strategy), axis=0)["b"][0].tolist() == [2.0, 2.0]


@pytest.mark.parametrize("name", ["mirrored", "central_storage"])
def test_reduce_of_a_nest_with_a_plain_python_leaf(name: str) -> None:
    strategy = _strategy(name)
    value = {"x": sj.PerReplica([torch.tensor(1.0), torch.tensor(2.0)]), "y": 1.0}
    assert strategy.reduce("MEAN", value, axis=None)["y"] == 1.0  # MEAN: unchanged
    with pytest.raises(ValueError) as err:
        strategy.reduce("SUM", value, axis=None)  # TF maps over the nest: the leaf is refused
    assert str(err.value) == NON_DISTRIBUTED_SUM


@pytest.mark.parametrize("name", ["mirrored", "central_storage"])
def test_reduce_to_and_batch_reduce_to_of_nests(name: str) -> None:
    strategy = _strategy(name)
    nest = (sj.PerReplica([torch.tensor(1.0), torch.tensor(2.0)]), {"k": sj.PerReplica([1.0, 2.0])})
    plain = sj.PerReplica([torch.tensor(10.0), torch.tensor(20.0)])
    reduced_nest, reduced_plain = strategy.extended.batch_reduce_to(
        "SUM", [(nest, "cpu:0"), (plain, "cpu:0")]
    )
    assert reduced_nest[0].item() == 3.0 and reduced_nest[1]["k"].item() == 3.0
    assert reduced_plain.item() == 30.0
    assert strategy.extended.reduce_to("MEAN", nest, "cpu:0")[1]["k"].item() == 1.5


@pytest.mark.parametrize("name", ["mirrored", "central_storage"])
def test_local_results_of_a_nest(name: str) -> None:
    strategy = _strategy(name)
    first, second = strategy.experimental_local_results(_values_nest(strategy))
    assert first["a"].tolist() == [0.0] and second["a"].tolist() == [1.0]
    assert second["b"][0].shape == (2, 2)
    # TF 2.21 (checked): a nest with no distributed value gives one copy per local replica
    assert strategy.experimental_local_results({"plain": 1.0}) == ({"plain": 1.0},) * 2


# --- Strategy.reduce of Python values in cross-replica context -----------------------------------


@pytest.mark.parametrize("name", STRATEGIES)
def test_reduce_of_a_python_float(name: str) -> None:
    strategy = _strategy(name)
    replicas = strategy.num_replicas_in_sync
    assert strategy.reduce("MEAN", 1.0, axis=None) == 1.0  # one value for every replica
    if replicas == 1:
        assert strategy.reduce("SUM", 1.0, axis=None) == 1.0
    else:
        with pytest.raises(ValueError) as err:
            strategy.reduce("SUM", 1.0, axis=None)
        assert str(err.value) == NON_DISTRIBUTED_SUM
    # With an axis, every replica reduces the value first (TF runs reduce_sum per replica).
    assert strategy.reduce("SUM", [1.0, 2.0], axis=0).item() == 3.0 * replicas
    assert strategy.reduce("MEAN", [1.0, 2.0], axis=0).item() == 1.5
    assert strategy.reduce("SUM", np.ones((2, 3)), axis=(0, 1)).item() == 6.0 * replicas


@pytest.mark.parametrize("name", STRATEGIES)
def test_reduce_mean_of_ints_with_axis_is_a_float(name: str) -> None:
    strategy = _strategy(name)
    mean = strategy.reduce("MEAN", [1, 2], axis=0)
    assert mean.dtype == torch.float64 and mean.item() == 1.5


@pytest.mark.parametrize("name", ["mirrored", "central_storage"])
def test_reduce_mean_of_per_replica_ints(name: str) -> None:
    strategy = _strategy(name)
    value = sj.PerReplica([torch.tensor([1, 4]), torch.tensor([2, 7])])
    mean = strategy.reduce("MEAN", value, axis=None)
    assert mean.dtype == torch.float64 and mean.tolist() == [1.5, 5.5]
    assert strategy.reduce("SUM", value, axis=None).tolist() == [3, 11]
    small = sj.PerReplica([torch.tensor(1, dtype=torch.int16), torch.tensor(2, dtype=torch.int16)])
    assert strategy.reduce("MEAN", small, axis=None).dtype == torch.float32  # TF: int16 -> f32
    ragged = sj.PerReplica([torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5])])
    assert strategy.reduce("MEAN", ragged, axis=0).item() == 2.5  # 15 / 6 elements
