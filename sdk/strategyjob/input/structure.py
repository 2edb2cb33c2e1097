"""Tensor operations on one input element: a tensor or a nested tuple/list/dict of tensors.

Every tensor of an element shares dim 0, the batch dimension, which the splitting slices.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .. import _nest

__all__ = [
    "batch_size_of",
    "concat",
    "empty_like",
    "slice_batch",
    "tensors_of",
    "to_device",
    "unbatched_error",
]


def unbatched_error(num_replicas: int, detail: str) -> ValueError:
    """TF's error for input that has no batch dimension to split (input_lib.py)."""
    return ValueError(
        "Call the `batch` method on the input Dataset in order to be able to split your input "
        f"across {num_replicas} replicas.\n Please see the tf.distribute.Strategy guide. {detail}"
    )


def _as_tensor(leaf: Any, num_replicas: int) -> torch.Tensor:
    if isinstance(leaf, torch.Tensor):
        return leaf
    if isinstance(leaf, np.ndarray):
        return torch.as_tensor(leaf)
    if isinstance(leaf, numbers.Number):
        raise unbatched_error(
            num_replicas,
            f"Found the Python number {leaf!r} where a batch was expected: every element must "
            "be a tensor, or a nested tuple/list/dict of tensors, batched on dim 0 with the "
            "global batch size.",
        )
    raise TypeError(
        f"Cannot split an input element holding a {type(leaf).__name__}: elements must be "
        "torch tensors (or numpy arrays), or nested tuples/lists/dicts of them, batched on dim 0."
    )


def tensors_of(element: Any, num_replicas: int) -> Any:
    """``element`` with numpy leaves converted to tensors; rejects leaves that cannot be split."""
    return _nest.map_structure(lambda leaf: _as_tensor(leaf, num_replicas), element)


def batch_size_of(element: Any, num_replicas: int) -> int:
    """The shared dim-0 size of every tensor in ``element`` (which must be all tensors)."""
    sizes = set()
    for leaf in _nest.flatten(element):
        if leaf.dim() == 0:
            raise unbatched_error(
                num_replicas,
                "Found a 0-d tensor where a batch was expected: every element must be a tensor, "
                "or a nested tuple/list/dict of tensors, batched on dim 0 with the global batch "
                "size.",
            )
        sizes.add(leaf.shape[0])
    if not sizes:
        raise ValueError(
            "Cannot split an input element that holds no tensors: elements must be a tensor, or "
            "a nested tuple/list/dict of tensors, batched on dim 0."
        )
    if len(sizes) > 1:
        raise ValueError(
            f"The tensors of one input element have different batch sizes {sorted(sizes)} in "
            "dim 0; every tensor of an element must hold the same number of examples."
        )
    return sizes.pop()


def slice_batch(element: Any, start: int, stop: int) -> Any:
    """Rows ``[start, stop)`` of every tensor (views, no copy)."""
    return _nest.map_structure(lambda t: t[start:stop], element)


def concat(parts: Sequence[Any]) -> Any:
    """Join elements of the same structure along dim 0."""
    if len(parts) == 1:
        return parts[0]
    return _nest.map_structure(lambda *ts: torch.cat(ts), *parts)


def empty_like(element: Any) -> Any:
    """A batch of 0 rows with ``element``'s structure, dtypes and trailing dims.

    Cloned so that it does not keep the storage of ``element`` alive.
    """
    return _nest.map_structure(lambda t: t[:0].clone(), element)


def to_device(element: Any, device: torch.device) -> Any:
    """``element`` with every tensor moved to ``device`` (a no-op for tensors already there)."""

    if device.type == "cpu":
        if isinstance(element, (tuple, list)) and all(
            type(leaf) is torch.Tensor and leaf.device.type == "cpu" for leaf in element
        ):
            return element  # the common (inputs, labels) batch: nothing to move, no walk
        device = torch.device("cpu")  # logical CPUs "cpu:1"… all compute on torch's one CPU

    def move(leaf: Any) -> Any:
        if not isinstance(leaf, torch.Tensor) or _same_device(leaf.device, device):
            return leaf
        return leaf.to(device, non_blocking=leaf.is_pinned())

    return _nest.map_structure(move, element)


def _same_device(have: torch.device, want: torch.device) -> bool:
    if have.type != want.type:
        return False
    return have.type == "cpu" or want.index is None or have.index == want.index
