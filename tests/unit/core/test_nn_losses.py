"""``strategyjob.nn.compute_average_loss`` / ``scale_regularization_loss``.

Outside a strategy they are TensorFlow's functions (checks and messages included). Under a
strategy they return TF's value times ``num_replicas_in_sync``, so that the SDK's averaged
gradients equal TF's summed ones: a 2-replica MirroredStrategy trained with a ported TF loss
ends with the parameters of one process doing TF's math on the global batch, partial, uneven
and empty replica batches and sample weights included.
"""

from __future__ import annotations

import numpy as np
import pytest
import strategyjob as sj
import torch
import torch.nn.functional as F
from strategyjob import errors
from strategyjob.nn import compute_average_loss, scale_regularization_loss

CROSS_REPLICA = (
    "You are calling `{}` in cross replica context, while it was expected to be called in "
    "replica context."
)


def test_exported_lazily_from_the_package() -> None:
    assert sj.nn.compute_average_loss is compute_average_loss
    assert "nn" in sj.__all__


# --- one replica: TensorFlow's values ------------------------------------------------------------


def test_compute_average_loss_outside_a_strategy_is_tf() -> None:
    losses = torch.tensor([1.0, 2.0, 3.0, 6.0])
    assert compute_average_loss(losses).item() == 3.0  # sum / per-replica batch
    assert compute_average_loss(losses, global_batch_size=8).item() == 1.5
    assert compute_average_loss([1.0, 3.0]).item() == 2.0  # converted like convert_to_tensor
    weighted = compute_average_loss(losses, sample_weight=[1.0, 0.0, 2.0, 0.5], global_batch_size=4)
    assert weighted.item() == pytest.approx((1 + 0 + 6 + 3) / 4)
    assert compute_average_loss(losses, sample_weight=2.0).item() == 6.0  # scalar weight
    # per-example losses of rank 2 (e.g. per timestep): every element summed, dim 0 the batch
    grid = torch.ones(2, 3)
    assert compute_average_loss(grid).item() == 3.0
    assert compute_average_loss(grid, sample_weight=torch.tensor([1.0, 3.0])).item() == 6.0


def test_sample_weight_rank_is_matched_as_tf_does() -> None:
    losses = torch.tensor([1.0, 2.0])
    # a trailing dimension of 1 is squeezed, a missing one added
    assert compute_average_loss(losses, sample_weight=[[2.0], [1.0]]).item() == 2.0
    per_step = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    assert compute_average_loss(per_step, sample_weight=[1.0, 0.0]).item() == 1.0
    with pytest.raises(ValueError, match=r"^Can not squeeze dim\[1\], expected a dimension of 1"):
        compute_average_loss(losses, sample_weight=torch.ones(2, 3))


def test_weighted_loss_keeps_the_loss_dtype() -> None:
    losses = torch.tensor([1.0, 2.0], dtype=torch.float64)
    result = compute_average_loss(losses, sample_weight=np.array([0.1, 0.2], np.float32))
    assert result.dtype == torch.float64
    assert result.item() == pytest.approx(0.25, abs=1e-7)  # float32 weights, float64 sum


def test_zero_global_batch_size_gives_zero_and_zero_gradients() -> None:
    weight = torch.tensor(2.0, requires_grad=True)
    empty = weight * torch.zeros(0)
    result = compute_average_loss(empty)  # an empty replica batch: size 0 * replicas
    assert result.item() == 0.0
    result.backward()
    assert weight.grad.item() == 0.0
    w2 = torch.tensor(2.0, requires_grad=True)
    tensor_size = compute_average_loss(w2 * torch.ones(3), global_batch_size=torch.tensor(0))
    tensor_size.backward()
    assert tensor_size.item() == 0.0 and w2.grad.item() == 0.0  # not NaN
    assert compute_average_loss(torch.ones(2), global_batch_size=torch.tensor(4)).item() == 0.5


def test_gradient_flows_to_the_per_example_loss() -> None:
    param = torch.tensor([1.0, 2.0], requires_grad=True)
    compute_average_loss(param * 3.0, global_batch_size=4).backward()
    assert param.grad.tolist() == [0.75, 0.75]


def test_tf_checks_and_messages() -> None:
    with pytest.raises(ValueError) as err:
        compute_average_loss(torch.tensor(1.0))
    assert str(err.value) == (
        "Invalid value passed for `per_example_loss`. Expected a tensor with at least rank 1. "
        "Received per_example_loss=tensor(1.) with rank 0"
    )
    with pytest.raises(ValueError) as err:
        compute_average_loss(torch.ones(2), global_batch_size=[2, 2])
    assert str(err.value) == (
        "global_batch_size must be scalar..  Expected scalar shape, saw shape: (2,)."
    )
    with pytest.raises(TypeError) as err:
        compute_average_loss(torch.ones(2), global_batch_size=4.0)
    assert str(err.value) == (
        'global_batch_size must be an integer..  Expected "x" to be integer type.  Found: '
        "tensor of dtype <dtype: 'float32'>"
    )
    with pytest.raises(errors.InvalidArgumentError) as err:
        compute_average_loss(torch.ones(2), global_batch_size=-1)
    assert str(err.value) == (
        "global_batch_size must be non-negative..  \n"
        "Condition x >= 0 did not hold element-wise:\n"
        "x (shape=() dtype=int32) = \n"
        "-1"
    )


def test_scale_regularization_loss_outside_a_strategy_is_tf() -> None:
    assert scale_regularization_loss(torch.tensor(0.5)).item() == 0.5
    assert scale_regularization_loss(torch.tensor([0.5, 0.25])).item() == 0.75  # reduce_sum
    parts = [torch.tensor(1.0, requires_grad=True), torch.tensor(2.0)]
    total = scale_regularization_loss(parts)
    total.backward()
    assert total.item() == 3.0 and parts[0].grad.item() == 1.0


def test_cross_replica_context_is_refused() -> None:
    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        with pytest.raises(RuntimeError) as err:
            compute_average_loss(torch.ones(2))
        assert str(err.value) == CROSS_REPLICA.format("compute_average_loss")
        with pytest.raises(RuntimeError) as err:
            scale_regularization_loss(torch.tensor(1.0))
        assert str(err.value) == CROSS_REPLICA.format("scale_regularization_loss")
        # with the global batch size given, cross-replica context is fine (TF too)
        assert compute_average_loss(torch.ones(2), global_batch_size=4).item() == 0.5 * 2


# --- several replicas: TF's value times num_replicas_in_sync -------------------------------------


@pytest.mark.parametrize("make", [lambda: sj.OneDeviceStrategy("cpu:0"), sj.get_strategy])
def test_one_replica_strategies_give_tf_values(make) -> None:
    strategy = make()
    result = strategy.run(
        lambda: (
            compute_average_loss(torch.tensor([1.0, 3.0])),
            compute_average_loss(torch.tensor([1.0, 3.0]), global_batch_size=8),
            scale_regularization_loss(torch.tensor(4.0)),
        )
    )
    assert [t.item() for t in result] == [2.0, 0.5, 4.0]


@pytest.mark.parametrize("name", ["mirrored", "central_storage"])
def test_values_inside_a_two_replica_run(name: str) -> None:
    devices = ["cpu:0", "cpu:1"]
    strategy = (
        sj.MirroredStrategy(devices) if name == "mirrored" else sj.CentralStorageStrategy(devices)
    )

    def fn():
        rid = int(sj.get_replica_context().replica_id_in_sync_group)
        losses = torch.tensor([1.0, 3.0, 5.0][: 3 - rid])  # 3 examples, then 2
        return (
            compute_average_loss(losses),  # TF: sum / (b * 2)
            compute_average_loss(losses, global_batch_size=5),  # TF: sum / 5
            scale_regularization_loss(torch.tensor(4.0)),  # TF: 4 / 2
        )

    results = strategy.experimental_local_results(strategy.run(fn))
    values = [[t.item() for t in r] for r in results]
    assert values[0] == pytest.approx([9 / 6 * 2, 9 / 5 * 2, 4.0])
    assert values[1] == pytest.approx([4 / 4 * 2, 4 / 5 * 2, 4.0])
    # what TF's reduce("SUM", ...) of its losses shows is the SDK's reduce("MEAN", ...)
    per_replica = strategy.run(lambda: compute_average_loss(torch.ones(2), global_batch_size=4))
    assert strategy.reduce("MEAN", per_replica, axis=None).item() == 1.0


# --- training: equal to one process doing TF's math on the global batch --------------------------

GB = 4
L2 = 0.05
LR = 0.5


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(3, 5, dtype=torch.float64),
        torch.nn.Tanh(),
        torch.nn.Linear(5, 2, dtype=torch.float64),
    )


def _per_example(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y, reduction="none")


def _l2(model: torch.nn.Module) -> torch.Tensor:
    return L2 * sum((p**2).sum() for p in model.parameters())


def _data(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(n)
    return rng.normal(size=(n, 3)), rng.integers(0, 2, size=n), rng.uniform(0.5, 2.0, size=n)


def _tf_reference(shards: list[list[tuple]], explicit_gb: bool) -> list[torch.Tensor]:
    """TF's math in one process: each step's loss is the sum over replicas of TF's per-replica
    loss (div_no_nan(sum of weighted losses, GB or b_r * R) + l2 / R), as its gradients sum."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in shards:
        opt.zero_grad()
        replicas = len(step)
        loss = 0.0
        for x, y, w in step:
            weighted = (_per_example(model, x, y) * w).sum()
            size = GB if explicit_gb else len(x) * replicas
            loss = loss + (weighted / size if size else weighted * 0) + _l2(model) / replicas
        loss.backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("explicit_gb", [True, False], ids=["global_batch_size", "default"])
@pytest.mark.parametrize("n", [11, 9], ids=["partial_3_of_4", "partial_1_of_4"])
def test_mirrored_training_matches_tf_math(n: int, explicit_gb: bool) -> None:
    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step(x, y, w):
        opt.zero_grad()
        per_example = _per_example(model, x, y)
        loss = compute_average_loss(
            per_example, sample_weight=w, global_batch_size=GB if explicit_gb else None
        )
        loss = loss + scale_regularization_loss(_l2(model))
        loss.backward()
        opt.step()
        return loss

    dataset = strategy.experimental_make_numpy_dataset(_data(n)).batch(GB)
    shards = []
    for batch in strategy.experimental_distribute_dataset(dataset):
        shards.append(list(zip(*(strategy.experimental_local_results(t) for t in batch))))
        strategy.run(step, args=batch)
    # the last global batch is partial: 3 examples split 2 + 1, or 1 split 1 + 0 (empty)
    assert [len(x) for x, _, _ in shards[-1]] == ([2, 1] if n == 11 else [1, 0])
    for trained, expected in zip(model.parameters(), _tf_reference(shards, explicit_gb)):
        torch.testing.assert_close(trained.detach(), expected, rtol=1e-12, atol=1e-12)


def test_default_strategy_training_matches_tf_math() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y, w = (torch.from_numpy(a) for a in _data(7))
    steps = []
    for start in range(0, 7, GB):
        batch = (x[start : start + GB], y[start : start + GB], w[start : start + GB])
        steps.append([batch])
        opt.zero_grad()
        loss = compute_average_loss(_per_example(model, *batch[:2]), batch[2], GB)
        (loss + scale_regularization_loss(_l2(model))).backward()
        opt.step()
    for trained, expected in zip(model.parameters(), _tf_reference(steps, True)):
        torch.testing.assert_close(trained.detach(), expected, rtol=1e-12, atol=1e-12)
