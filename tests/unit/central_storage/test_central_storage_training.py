"""A torch.nn model trained with CentralStorageStrategy(["cpu:0", "cpu:1"]) in a custom loop
updates exactly like the same model trained on the whole global batch in one process."""

from __future__ import annotations

import pytest
import strategyjob
import torch
from strategyjob.strategies.central_storage import CentralStorageStrategy
from torch import nn

pytestmark = pytest.mark.timeout(120)

GLOBAL_BATCH = 8


def build_model() -> nn.Module:
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))


def make_optimizer(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def global_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4 * GLOBAL_BATCH, 4, generator=generator)
    y = torch.randn(4 * GLOBAL_BATCH, 1, generator=generator)
    return [
        (x[i : i + GLOBAL_BATCH], y[i : i + GLOBAL_BATCH]) for i in range(0, len(x), GLOBAL_BATCH)
    ]


def train_in_one_process(epochs: int) -> tuple[nn.Module, list[float]]:
    model = build_model()
    opt = make_optimizer(model.parameters())
    losses = []
    for _ in range(epochs):
        for x, y in global_batches():
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return model, losses


def test_custom_loop_matches_single_process_training():
    strategy = CentralStorageStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = build_model()
        opt = make_optimizer(model.parameters())
    dataset = strategy.experimental_distribute_dataset(global_batches())

    def step_fn(x, y):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)  # mean over this replica's own batch
        loss.backward()
        opt.step()
        return loss

    losses = []
    for _ in range(2):
        for x, y in dataset:
            per_replica = strategy.run(step_fn, args=(x, y))
            assert [t.shape[0] for t in strategy.experimental_local_results(x)] == [4, 4]
            losses.append(strategy.reduce("MEAN", per_replica, axis=None).item())

    reference, reference_losses = train_in_one_process(epochs=2)
    assert losses == pytest.approx(reference_losses, rel=1e-5, abs=1e-6)
    for trained, expected in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(trained.detach(), expected.detach(), rtol=1e-5, atol=1e-6)


def test_module_parameters_live_once_on_the_parameter_device():
    strategy = CentralStorageStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = build_model()
    # One copy of each parameter: both replicas compute with the very same tensors.
    seen = strategy.run(lambda: [id(p) for p in model.parameters()])
    expected = [id(p) for p in model.parameters()]
    assert [strategy.experimental_local_results(s) for s in seen] == [(i, i) for i in expected]
    assert all(p.device == torch.device("cpu") for p in model.parameters())


def test_variable_updates_in_the_training_step():
    """A step counter as an ONLY_FIRST_REPLICA variable advances once per step."""
    strategy = CentralStorageStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        steps = strategyjob.Variable(
            0, trainable=False, aggregation=strategyjob.VariableAggregation.ONLY_FIRST_REPLICA
        )
    for _ in range(3):
        strategy.run(lambda: steps.assign_add(1))
    assert int(steps) == 3
