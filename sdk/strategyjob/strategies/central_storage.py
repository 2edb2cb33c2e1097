"""``CentralStorageStrategy``: variables stored once, compute replicated on local devices.

Mirrors ``tf.distribute.experimental.CentralStorageStrategy`` (and, in ``compat.v1``, its TF1
twin). Variables live on one parameter device; each compute device runs a replica of ``fn`` in
its own thread, exactly like ``MirroredStrategy``. With several compute devices a variable is an
``AggregatingVariable``: replica-context updates are aggregated (``reduce_to`` on the parameter
device) into a single update of the central copy, and replicas read that copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from strategyjob import _variables
from strategyjob._devices import LogicalDevice, canonicalize, require_local
from strategyjob.input.options import InputReplicationMode
from strategyjob.strategies.base import Strategy
from strategyjob.strategies.compat_methods import CompatV1StrategyMethods
from strategyjob.strategies.mirrored import MirroredExtended

__all__ = ["CentralStorageExtended", "CentralStorageStrategy", "CentralStorageStrategyV1"]

PER_REPLICA_NOT_SUPPORTED = (
    "InputReplicationMode.PER_REPLICA is only supported in "
    "`experimental_distribute_datasets_from_function` of tf.distribute.MirroredStrategy"
)


def _default_parameter_device(compute: tuple[LogicalDevice, ...]) -> LogicalDevice:
    """The only compute device if there is one, else the host CPU (TF's rule)."""
    if len(compute) == 1:
        return compute[0]
    return compute[0].host_cpu


class CentralStorageExtended(MirroredExtended):
    """Replica threads of ``MirroredExtended``; variables on the parameter device only."""

    def __init__(
        self,
        container_strategy: Strategy,
        compute_devices: Sequence[Any] | None = None,
        parameter_device: Any = None,
    ) -> None:
        super().__init__(container_strategy, compute_devices)
        self._parameter_device: LogicalDevice = (
            require_local(canonicalize(parameter_device))
            if parameter_device is not None
            else _default_parameter_device(self._logical_devices)
        )

    # --- variables --------------------------------------------------------------------------
    def create_variable(self, initial_value: Any, **kwargs: Any) -> Any:
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        strategy = self.container_strategy()
        if len(self._logical_devices) > 1:
            # Every synchronization (ON_READ included) is aggregated, as in TensorFlow.
            return _variables.create_aggregating_variable(
                strategy, initial_value, device=self._parameter_device, **kwargs
            )
        return _variables.create_plain_variable(
            strategy, initial_value, device=self._parameter_device, **kwargs
        )

    def register_parameter(
        self, param: torch.nn.Parameter, module: torch.nn.Module | None = None
    ) -> torch.nn.Parameter | None:
        """Module parameters created in scope live on the parameter device, like variables
        (parameters adopted from outside the scope are moved there in place).

        Replicas share the one module, so its parameters are read by every replica thread and
        their gradients accumulate there (gradient averaging: ``collective/grad_sync.py``).
        """
        target = self._parameter_device.torch_device
        if param.device.type == target.type and (
            target.type == "cpu" or param.device.index == target.index
        ):
            return None
        return torch.nn.Parameter(param.detach().to(target), requires_grad=param.requires_grad)

    # --- devices and roles ------------------------------------------------------------------
    @property
    def parameter_devices(self) -> tuple[str, ...]:
        """The one device holding the variables."""
        return (self._parameter_device.name,)

    @property
    def experimental_between_graph(self) -> bool:
        return True

    @property
    def should_checkpoint(self) -> bool:
        """Whether this worker saves checkpoints: the chief does (always, in one process)."""
        return True

    @property
    def should_init(self) -> bool:
        return True

    # --- input ------------------------------------------------------------------------------
    # experimental_distribute_dataset is Mirrored's: PER_REPLICA is refused, any other options
    # work (TF 2.21 raises AttributeError for every options object there, a typo in its code).

    def distribute_datasets_from_function(self, dataset_fn: Callable, options: Any) -> Any:
        mode = getattr(options, "experimental_replication_mode", None)
        if mode == InputReplicationMode.PER_REPLICA:
            raise NotImplementedError(PER_REPLICA_NOT_SUPPORTED)
        return super().distribute_datasets_from_function(dataset_fn, options)


class CentralStorageStrategy(CompatV1StrategyMethods, Strategy):
    """A one-machine strategy that puts all variables on a single device.

    Variables go to ``parameter_device`` (default: the only compute device, else the CPU);
    computation is replicated across ``compute_devices`` (default: every local GPU, else the
    CPU). ``CentralStorageStrategy(["cpu:0", "cpu:1"])`` gives two replicas on a CPU machine.
    """

    def __init__(
        self,
        compute_devices: Sequence[str | torch.device] | None = None,
        parameter_device: str | torch.device | None = None,
    ) -> None:
        super().__init__(CentralStorageExtended(self, compute_devices, parameter_device))


class CentralStorageStrategyV1(CentralStorageStrategy):
    """``tf.compat.v1.distribute.experimental.CentralStorageStrategy``: the same strategy, for
    code that uses the TF1 methods (``experimental_run``, ``make_input_fn_iterator``, …)."""
