"""Keras 3's optimizer update rules as torch optimizers, for the parameter servers to run.

A ps applies a step's gradients with the torch optimizer class its request names
(``ps._server``), one instance per variable; these classes are the torch backend's own update
of ``keras.optimizers.SGD`` / ``Adam`` / ``AdamW`` (Keras 3.10 to 3.15:
``keras/src/backend/torch/optimizers/torch_{sgd,adam}.py`` and the base optimizer's weight
decay), operation for operation and in the same dtypes, so that the ps's weights and slots
are those one process running Keras computes. Torch only: the ps import no Keras.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["KerasAdam", "KerasSGD"]


def _with_gradients(group: dict) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    params = [p for p in group["params"] if p.grad is not None]
    return params, [p.grad for p in params]


def _decay(params: list[torch.Tensor], group: dict) -> None:
    """Keras's decoupled weight decay, before the update: ``w *= 1 - weight_decay * lr``
    (the learning rate a float32 variable in Keras)."""
    decay = group.get("weight_decay")
    if decay:
        torch._foreach_mul_(params, 1 - decay * torch.tensor(group["lr"], dtype=torch.float32))


def _count(state: dict) -> int:
    """One more update: Keras's ``iterations``, kept with the group's first parameter (a ps
    has one per optimizer), which ``PSBinding`` gives back to the chief's Keras optimizer."""
    state["step"] = int(state.get("step", 0)) + 1
    return int(state["step"])


def _slot(state: dict, name: str, param: torch.Tensor) -> torch.Tensor:
    if name not in state:
        state[name] = torch.zeros_like(param)
    slot: torch.Tensor = state[name]
    return slot


class KerasSGD(torch.optim.Optimizer):
    """``keras.optimizers.SGD(learning_rate, momentum, nesterov, weight_decay)``'s update."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float | None = None,
    ) -> None:
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        for group in self.param_groups:
            params, grads = _with_gradients(group)
            if not params:
                continue
            _decay(params, group)
            _count(self.state[params[0]])
            lr, momentum = group["lr"], group["momentum"]
            if not momentum:
                torch._foreach_add_(params, grads, alpha=-lr)
                continue
            bufs = [_slot(self.state[p], "momentum", p) for p in params]
            torch._foreach_mul_(bufs, momentum)
            torch._foreach_add_(bufs, grads, alpha=-lr)
            if group["nesterov"]:
                torch._foreach_add_(params, grads, alpha=-lr)
                torch._foreach_add_(params, bufs, alpha=momentum)
            else:
                torch._foreach_add_(params, bufs)
        return None


class KerasAdam(torch.optim.Optimizer):
    """``keras.optimizers.Adam`` / ``AdamW``'s update (AdamW: Adam with ``weight_decay``);
    ``step`` counts this optimizer's updates, as Keras's ``iterations`` counts its applies."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
        amsgrad: bool = False,
        weight_decay: float | None = None,
    ) -> None:
        defaults = dict(
            lr=lr,
            beta_1=beta_1,
            beta_2=beta_2,
            epsilon=epsilon,
            amsgrad=amsgrad,
            weight_decay=weight_decay,
        )
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        for group in self.param_groups:
            params, grads = _with_gradients(group)
            if params:
                self._update(group, params, grads)
        return None

    def _update(self, group: dict, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        _decay(params, group)
        step = _count(self.state[params[0]])
        dtype = params[0].dtype
        lr = torch.tensor(group["lr"], dtype=torch.float32).to(dtype)
        local_step = torch.tensor(step, dtype=torch.int64).to(dtype)
        beta_1, beta_2 = group["beta_1"], group["beta_2"]
        beta_1_power = torch.pow(torch.tensor(beta_1, dtype=dtype), local_step)
        beta_2_power = torch.pow(torch.tensor(beta_2, dtype=dtype), local_step)
        alpha = lr * torch.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        m = [_slot(self.state[p], "momentum", p) for p in params]
        v = [_slot(self.state[p], "velocity", p) for p in params]
        torch._foreach_mul_(m, beta_1)
        torch._foreach_add_(m, grads, alpha=1 - beta_1)
        torch._foreach_mul_(v, beta_2)
        torch._foreach_add_(v, torch._foreach_mul(grads, grads), alpha=1 - beta_2)
        if group["amsgrad"]:
            v_hat = [_slot(self.state[p], "velocity_hat", p) for p in params]
            torch._foreach_maximum_(v_hat, v)
            v = v_hat
        torch._foreach_add_(
            params,
            torch._foreach_div(
                torch._foreach_mul(m, alpha),
                torch._foreach_add(torch._foreach_sqrt(v), group["epsilon"]),
            ),
            alpha=-1,
        )
