"""``MirroredStrategy``: synchronous training on several devices of one machine.

One replica per device; ``run`` executes ``fn`` for each replica in its own thread so that
``merge_call``, ``all_reduce`` and ``all_gather`` inside ``fn`` rendezvous (see
``collective/local.py``). As in TensorFlow, the replicas take turns in replica order between
merge calls, so their side effects and random draws are deterministic. Logical CPU devices
(``MirroredStrategy(["cpu:0", "cpu:1"])``) give several replicas on a CPU-only machine.
Variables are mirrored: one component per device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from strategyjob._devices import LogicalDevice, all_local_devices, canonicalize, require_local
from strategyjob._values import regroup, select_replica
from strategyjob.collective import local
from strategyjob.strategies.base import Strategy, StrategyExtended

__all__ = ["MirroredExtended", "MirroredStrategy"]

REMOTE_DEVICES_IN_EAGER = (
    "In-graph multi-worker training with `MirroredStrategy` is not supported in eager mode."
)


def _validate_devices(devices: Sequence[Any] | None) -> tuple[LogicalDevice, ...]:
    if devices is None:
        return all_local_devices()
    if isinstance(devices, (str, torch.device)):
        devices = [devices]
    logical = tuple(require_local(canonicalize(d)) for d in devices)
    if not logical:
        raise ValueError(
            "`devices` must name at least one device, e.g. MirroredStrategy(['cpu:0', 'cpu:1']); "
            "pass None to use every local GPU (or the CPU)."
        )
    if len(set(logical)) != len(logical):
        raise ValueError(f"No duplicates allowed in `devices` argument: {list(devices)}")
    if len({d.host for d in logical}) > 1:
        raise RuntimeError(REMOTE_DEVICES_IN_EAGER)
    return logical


class MirroredExtended(StrategyExtended):
    """Implementation of MirroredStrategy; MultiWorkerMirroredStrategy builds on it."""

    #: Replicas take turns (TF's order); False lets their threads run concurrently.
    _sequential_replicas = True
    #: Module parameters that reach the scope however they were made are mirrored, as TF's
    #: variables are (a deep copy, ``torch.load``, an optimizer created in scope over them).
    adopts_parameters = True

    def __init__(
        self,
        container_strategy: Strategy,
        devices: Sequence[Any] | None = None,
        cross_device_ops: Any = None,
    ) -> None:
        super().__init__(container_strategy)
        self._logical_devices = _validate_devices(devices)
        self._cross_device_ops = cross_device_ops

    def _call_for_each_replica(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        count = len(self._logical_devices)
        contexts = [self._make_replica_context(i) for i in range(count)]
        if count == 1:
            context = contexts[0]
            with context:
                if self._logical_devices[0].device_type == "cuda":
                    with torch.cuda.device(self._logical_devices[0].torch_device):
                        result = fn(*select_replica(0, args), **select_replica(0, kwargs))
                else:
                    result = fn(*select_replica(0, args), **select_replica(0, kwargs))
            return regroup([result])
        results = local.run_replicas(
            self.container_strategy(),
            fn,
            contexts,
            [select_replica(i, args) for i in range(count)],
            [select_replica(i, kwargs) for i in range(count)],
            devices=self._local_devices,
            timeout=self.collectives.timeout_seconds,
            sequential=self._sequential_replicas,
        )
        return regroup(results)


class MirroredStrategy(Strategy):
    """Synchronous training across multiple replicas on one machine.

    ``devices``: device names or ``torch.device``s, one replica each (default: every local GPU,
    else the CPU). ``cross_device_ops`` is accepted for compatibility; reductions between local
    replicas are done in-process on the first replica's device.
    """

    def __init__(
        self, devices: Sequence[str | torch.device] | None = None, cross_device_ops: Any = None
    ) -> None:
        super().__init__(MirroredExtended(self, devices, cross_device_ops))
