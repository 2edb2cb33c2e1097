"""``OneDeviceStrategy``: one replica on one device (``tf.distribute.OneDeviceStrategy``).

Variables are plain variables on the device, ``run`` returns plain values, reductions return
their input, and datasets are not rebatched — a strategy to test code paths with no distribution.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from strategyjob._devices import LogicalDevice, canonicalize, require_local
from strategyjob._values import select_replica
from strategyjob.strategies.base import (
    Strategy,
    StrategyExtended,
    _SingleReplicaExtendedMixin,
)

__all__ = ["OneDeviceStrategy"]


class OneDeviceExtended(_SingleReplicaExtendedMixin, StrategyExtended):
    _rebatch = False

    def __init__(self, container_strategy: Strategy, device: str | torch.device) -> None:
        super().__init__(container_strategy)
        self._device: LogicalDevice = require_local(canonicalize(device))
        self._logical_devices = (self._device,)

    def _call_for_each_replica(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        context = self._make_replica_context(0)
        args, kwargs = select_replica(0, args), select_replica(0, kwargs)
        with context:
            if self._device.device_type == "cuda":
                with torch.cuda.device(self._device.torch_device):
                    return fn(*args, **kwargs)
            return fn(*args, **kwargs)

    def create_variable(self, initial_value: Any, **kwargs: Any) -> Any:
        from strategyjob import _variables

        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        return _variables.create_plain_variable(
            self.container_strategy(), initial_value, device=self._device, **kwargs
        )

    def default_reduce_destination(self) -> torch.device:
        return self._device.torch_device


class OneDeviceStrategy(Strategy):
    """A distribution strategy for running on a single device.

    ``OneDeviceStrategy("cpu:0")``, ``OneDeviceStrategy("/gpu:0")`` or a ``torch.device``.
    """

    def __init__(self, device: str | torch.device) -> None:
        super().__init__(OneDeviceExtended(self, device))
