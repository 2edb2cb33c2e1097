"""The private torch APIs gradient synchronisation needs, each in one place.

Every name here has no public equivalent in torch 2.x; DistributedDataParallel's own Python
uses the same ones. ``tests/unit/core/test_torch_internals.py`` exercises each, so a torch
release that renames or changes one fails there, with this module named, rather than deep in
a training step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "CAN_COUNT_STORAGE_USES",
    "current_backward_pass",
    "process_groups",
    "run_when_backward_ends",
    "storage_uses",
]

#: Whether :func:`storage_uses` works in this torch build.
CAN_COUNT_STORAGE_USES = hasattr(torch._C, "_storage_Use_Count")


def storage_uses(tensor: torch.Tensor) -> int:
    """How many tensors (views included) share ``tensor``'s memory.

    Why private: torch exposes no reference count of a storage. A gradient bucket hands its
    averages back as views of its buffer and reuses the buffer only once no ``.grad`` still
    views it; without the count it would have to copy every gradient out, every step.
    """
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


def current_backward_pass() -> int:
    """An id of the autograd pass running on this thread (-1 outside backward).

    Why private: a gradient hook is told which parameter is ready, not which ``backward()``
    call it belongs to; the id lets the synchronizer queue one end-of-backward callback per
    pass (DDP asks the engine the same thing in C++)."""
    return torch._C._current_graph_task_id()


def run_when_backward_ends(callback: Callable[[], None]) -> None:
    """Call ``callback`` once the current ``backward()`` has produced every gradient.

    Why private: autograd's final callbacks are reachable only through the engine object
    (the public hooks fire per tensor, before the pass ends). Must be called from inside a
    backward pass (a gradient hook)."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def process_groups() -> list[Any]:
    """Every ``torch.distributed`` process group of this process: the default one and those
    created since (sub-groups, a DeviceMesh's); none before ``init_process_group``.

    Why private: torch lists its groups only in ``distributed_c10d``'s module state. A process
    ending after a failed collective must keep them all from being destroyed (their
    destructors join backend threads still blocked on the lost peer)."""
    return list(dist.distributed_c10d._world.pg_map) if dist.is_initialized() else []
