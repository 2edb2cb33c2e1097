"""The coordinator's copies of module parameters follow the parameter servers.

Module parameters created in a ``ParameterServerStrategy``'s scope live on the ps; the chief
keeps tensors of the same shapes, which scheduled functions never touch. TensorFlow's
coordinator reads its variables from the ps, so that saving or evaluating the model after
training sees the trained values; here the chief's usual torch calls do the same:

* ``state_dict()`` and a forward pass on the chief first pull the module's parameters from the
  ps, unless nothing was scheduled since the last pull and nothing is still running;
* ``load_state_dict()`` on the chief pushes the loaded values to the ps (restoring a checkpoint
  when a restarted chief rebuilds its model).

The hooks travel with the module to the workers, where they do nothing: only the chief's
modules are registered here.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from strategyjob.ps import _remote

__all__ = ["SyncedExtended", "track"]


class SyncedExtended(Protocol):
    """What the hooks need from the strategy whose scope created the module's parameters
    (``ParameterServerStrategyExtended``; the strategies sit above this layer)."""

    @property
    def ps_epoch(self) -> int:
        """Bumped whenever a scheduled function may have changed the ps values."""
        ...

    def ps_settled(self) -> bool:
        """Nothing scheduled is queued or running: the ps values do not change meanwhile."""
        ...

    def pull_parameters(self, params: list[torch.nn.Parameter]) -> None:
        """Copy the ps values of ``params`` into the chief's tensors."""
        ...

    def push_parameters(self, params: list[torch.nn.Parameter]) -> None:
        """Assign the chief's values of ``params`` to their ps variables."""
        ...


@dataclass
class _Sync:
    extended: weakref.ReferenceType
    epoch: int = -1
    """``extended.ps_epoch`` when the chief's copies were last known equal to the ps."""
    lock: threading.Lock = field(default_factory=threading.Lock)


_tracked: weakref.WeakKeyDictionary[torch.nn.Module, _Sync] = weakref.WeakKeyDictionary()


def track(module: torch.nn.Module, extended: SyncedExtended) -> None:
    """Keep ``module``'s own parameters (created in ``extended``'s scope) in step with the ps."""
    if module in _tracked:
        return
    _tracked[module] = _Sync(weakref.ref(extended))
    module.register_forward_pre_hook(_pull)
    module.register_state_dict_pre_hook(_pull)
    module.register_load_state_dict_post_hook(_push)


def _own_parameters(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters(recurse=False) if _remote.ps_ref(p) is not None]


def _pull(module: torch.nn.Module, *_: Any) -> None:
    sync = _tracked.get(module)
    extended = sync.extended() if sync is not None else None
    if sync is None or extended is None:  # a worker's copy of the module, or no strategy
        return None
    with sync.lock:
        epoch, idle = extended.ps_epoch, extended.ps_settled()
        if sync.epoch == epoch and idle:
            return None
        extended.pull_parameters(_own_parameters(module))
        sync.epoch = epoch if idle else -1
    return None


def _push(module: torch.nn.Module, _incompatible_keys: Any) -> None:
    sync = _tracked.get(module)
    extended = sync.extended() if sync is not None else None
    if sync is None or extended is None:
        return
    with sync.lock:
        extended.push_parameters(_own_parameters(module))
        sync.epoch = extended.ps_epoch if extended.ps_settled() else -1
