"""Keras 3's optimizer update rules as torch optimizers, for the parameter servers to run.

A ps applies a step's gradients with the torch optimizer class its request names
(``ps.server``), one instance per variable; these classes are the torch backend's own update
of ``keras.optimizers.SGD`` / ``Adam`` / ``AdamW`` (Keras 3.10 to 3.15:
``keras/src/backend/torch/optimizers/torch_{sgd,adam}.py`` and the base optimizer's weight
decay), operation for operation and in the same dtypes, so that the ps's weights and slots
are those one process running Keras computes. Torch only, but for a learning-rate
schedule: a ps imports Keras to evaluate one (``keras.optimizers.schedules``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

__all__ = ["KerasAdam", "KerasSGD"]

_Tensors = list[Tensor]


def _with_gradients(group: dict) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    params = [p for p in group["params"] if p.grad is not None]
    return params, [p.grad for p in params]


def _decay(params: list[torch.Tensor], group: dict, lr: torch.Tensor) -> None:
    """Keras's decoupled weight decay, before the update: ``w *= 1 - weight_decay * lr``."""
    decay = group.get("weight_decay")
    if decay:
        torch._foreach_mul_(params, 1 - decay * lr)


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


class _KerasRule(torch.optim.Optimizer):
    """What Keras's optimizers share: the learning rate, a float32 variable or its
    ``LearningRateSchedule`` (``lr_schedule``: Keras's serialized schedule, deserialized here,
    on the ps, once) of ``iterations`` (the updates before this one), and the weight decay
    applied before the update rule (``_update``)."""

    _schedule: tuple[str, Any] | None = None

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        weight_decay: float | None,
        lr_schedule: dict | None,
        **rule: Any,
    ) -> None:
        defaults = dict(lr=lr, weight_decay=weight_decay, lr_schedule=lr_schedule, **rule)
        super().__init__(params, defaults)

    def _rate(self, group: dict, iterations: int) -> torch.Tensor:
        config = group.get("lr_schedule")
        if not config:
            return torch.tensor(group["lr"], dtype=torch.float32)
        text = json.dumps(config, sort_keys=True)
        if self._schedule is None or self._schedule[0] != text:
            import keras  # only a ps that runs a schedule imports Keras

            self._schedule = (text, keras.optimizers.schedules.deserialize(config))
        rate = self._schedule[1](torch.tensor(iterations, dtype=torch.int64))
        return torch.as_tensor(rate, dtype=torch.float32)

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        for group in self.param_groups:
            params, grads = _with_gradients(group)
            if not params:
                continue
            step = _count(self.state[params[0]])
            lr = self._rate(group, step - 1)
            _decay(params, group, lr)
            self._update(group, params, grads, lr, step)
        return None

    def _update(
        self, group: dict, params: _Tensors, grads: _Tensors, lr: Tensor, step: int
    ) -> None:
        raise NotImplementedError


class KerasSGD(_KerasRule):
    """``keras.optimizers.SGD(learning_rate, momentum, nesterov, weight_decay)``'s update."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float | None = None,
        lr_schedule: dict | None = None,
    ) -> None:
        super().__init__(
            params, lr, weight_decay, lr_schedule, momentum=momentum, nesterov=nesterov
        )

    def _update(
        self, group: dict, params: _Tensors, grads: _Tensors, lr: Tensor, step: int
    ) -> None:
        momentum = group["momentum"]
        if not momentum:
            torch._foreach_add_(params, grads, alpha=-lr)
            return
        bufs = [_slot(self.state[p], "momentum", p) for p in params]
        torch._foreach_mul_(bufs, momentum)
        torch._foreach_add_(bufs, grads, alpha=-lr)
        if group["nesterov"]:
            torch._foreach_add_(params, grads, alpha=-lr)
            torch._foreach_add_(params, bufs, alpha=momentum)
        else:
            torch._foreach_add_(params, bufs)


class KerasAdam(_KerasRule):
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
        lr_schedule: dict | None = None,
    ) -> None:
        rule = dict(beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, amsgrad=amsgrad)
        super().__init__(params, lr, weight_decay, lr_schedule, **rule)

    def _update(
        self, group: dict, params: _Tensors, grads: _Tensors, lr: Tensor, step: int
    ) -> None:
        dtype = params[0].dtype
        lr = lr.to(dtype)
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
