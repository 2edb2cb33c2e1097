"""A frozen parameter built in TPUStrategy's scope (one local device, no cluster)."""

from __future__ import annotations

import strategyjob as sj
import torch


def test_frozen_parameter_in_scope_is_accepted_and_stays_frozen() -> None:
    strategy = sj.TPUStrategy()
    with strategy.scope():
        model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
        model[0].weight.requires_grad_(False)
        model.register_parameter("scale", torch.nn.Parameter(torch.ones(1), requires_grad=False))
        opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    frozen = model[0].weight.detach().clone()
    trained = model[1].weight.detach().clone()

    def step(x: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = (model(x) * model.scale).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    strategy.run(step, args=(torch.randn(4, 3),))
    assert torch.equal(model[0].weight, frozen)
    assert model[0].weight.grad is None
    assert not torch.equal(model[1].weight, trained)
