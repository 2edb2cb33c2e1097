"""``strategyjob.nn``: TensorFlow's distribution-aware loss helpers (``tf.nn``), for this SDK.

TensorFlow **sums** gradients across replicas, so its helpers scale each replica's loss down:
``compute_average_loss`` divides by the global batch size, ``scale_regularization_loss`` by the
number of replicas. StrategyJob **averages** gradients across replicas (DDP's convention; see
docs/contributing/architecture.md, "Gradient convention"), so both return TensorFlow's value
multiplied by ``num_replicas_in_sync``. Averaged over the replicas, the gradients then equal the
sums TensorFlow applies, exactly, for partial and empty batches and sample weights too: a
``train_step`` ported line for line updates the model as it does in TensorFlow. Outside a
strategy (one replica) the values are TensorFlow's.
"""

from __future__ import annotations

from typing import Any

import torch

from . import _context, errors
from .strategies import base as _strategies  # noqa: F401  (the contexts' default strategy)

__all__ = ["compute_average_loss", "scale_regularization_loss"]


def _num_replicas_in_sync() -> int:
    """The replica count TF uses: the replica context's, else the strategy in scope's, else 1."""
    replica_context = _context.get_replica_context()
    if replica_context is not None:
        return replica_context.num_replicas_in_sync
    if _context.has_strategy():
        return _context.get_strategy().num_replicas_in_sync
    return 1


def _cross_replica_error(name: str) -> RuntimeError:
    return RuntimeError(
        f"You are calling `{name}` in cross replica context, while it was expected to be called "
        "in replica context."
    )


def _tf_dtype_name(value: Any, tensor: torch.Tensor) -> str:
    """The dtype TF's ``convert_to_tensor`` would give ``value`` (Python ints are int32)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return "int32"
    return str(tensor.dtype).removeprefix("torch.")


def _check_global_batch_size(global_batch_size: Any) -> None:
    """TF's asserts on ``global_batch_size``: a scalar, an integer, non-negative."""
    size = torch.as_tensor(global_batch_size)
    if size.dim() != 0:
        raise ValueError(
            "global_batch_size must be scalar..  Expected scalar shape, saw shape: "
            f"{tuple(size.shape)}."
        )
    if size.is_floating_point() or size.is_complex() or size.dtype == torch.bool:
        raise TypeError(
            'global_batch_size must be an integer..  Expected "x" to be integer type.  Found: '
            f"tensor of dtype <dtype: '{_tf_dtype_name(global_batch_size, size)}'>"
        )
    if int(size) < 0:
        raise errors.InvalidArgumentError(
            "global_batch_size must be non-negative..  \n"
            "Condition x >= 0 did not hold element-wise:\n"
            f"x (shape=() dtype={_tf_dtype_name(global_batch_size, size)}) = \n"
            f"{int(size)}"
        )


def _scale_by_sample_weight(losses: torch.Tensor, sample_weight: Any) -> torch.Tensor:
    """``losses * sample_weight``, the weight's last dim squeezed or added to match, as TF does.

    Computed in the losses' dtype (TF goes through float32, losing float64 precision).
    """
    weight = torch.as_tensor(sample_weight, device=losses.device)
    if losses.is_floating_point() or losses.is_complex():
        weight = weight.to(losses.dtype)
    if weight.dim() != 0:
        if weight.dim() - losses.dim() == 1:
            if weight.shape[-1] != 1:
                raise ValueError(
                    f"Can not squeeze dim[{weight.dim() - 1}], expected a dimension of 1, got "
                    f"{weight.shape[-1]}: sample_weight of shape {tuple(weight.shape)} does not "
                    f"match per_example_loss of shape {tuple(losses.shape)}."
                )
            weight = weight.squeeze(-1)
        elif losses.dim() - weight.dim() == 1:
            weight = weight.unsqueeze(-1)
    return losses * weight


def _div_no_nan(total: torch.Tensor, size: Any) -> torch.Tensor:
    """``total / size``, and 0 (with a zero gradient, not NaN) where ``size`` is 0."""
    if isinstance(size, int):
        return total * 0 if size == 0 else total / size
    denominator = torch.as_tensor(size, device=total.device).to(total.dtype)
    is_zero = denominator == 0
    safe = torch.where(is_zero, torch.ones_like(denominator), denominator)
    return torch.where(is_zero, torch.zeros_like(total), total / safe)


def compute_average_loss(
    per_example_loss: Any,
    sample_weight: Any = None,
    global_batch_size: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Scales per-example losses with ``sample_weight`` and computes their average.

    ``tf.nn.compute_average_loss`` is ``sum(per_example_loss * sample_weight) /
    global_batch_size`` (``global_batch_size`` defaults to this replica's batch size times
    ``num_replicas_in_sync``; a zero size gives 0). This returns that value **times
    num_replicas_in_sync**, because StrategyJob averages gradients over replicas where
    TensorFlow sums them: the update is TensorFlow's. Log it with ``strategy.reduce("MEAN",
    ...)`` to get the figure TensorFlow's ``reduce("SUM", ...)`` prints.

    Use inside ``strategy.run``::

        def compute_loss(labels, predictions, sample_weight=None):
            per_example_loss = F.cross_entropy(predictions, labels, reduction="none")
            return strategyjob.nn.compute_average_loss(
                per_example_loss, sample_weight=sample_weight, global_batch_size=GLOBAL_BATCH
            )
    """
    if isinstance(per_example_loss, torch.Tensor):
        losses = per_example_loss
    else:
        losses = torch.as_tensor(per_example_loss)
    if losses.dim() == 0:
        raise ValueError(
            "Invalid value passed for `per_example_loss`. Expected a tensor with at least rank 1. "
            f"Received per_example_loss={losses!s} with rank 0"
        )
    input_dtype = losses.dtype
    if sample_weight is not None:
        losses = _scale_by_sample_weight(losses, sample_weight).to(input_dtype)
    if global_batch_size is None:
        if _context.has_strategy() and _context.in_cross_replica_context():
            raise _cross_replica_error("compute_average_loss")
        num_replicas = _num_replicas_in_sync()
        global_batch_size = losses.shape[0] * num_replicas
    else:
        _check_global_batch_size(global_batch_size)
        num_replicas = _num_replicas_in_sync()
        if isinstance(global_batch_size, torch.Tensor) and global_batch_size.dim() == 0:
            global_batch_size = global_batch_size.detach()
    average = _div_no_nan(losses.sum(), global_batch_size)
    return average * num_replicas if num_replicas != 1 else average


def scale_regularization_loss(regularization_loss: Any) -> torch.Tensor:
    """Scales the sum of the given regularization losses by number of replicas.

    ``tf.nn.scale_regularization_loss`` divides the sum by ``num_replicas_in_sync`` so that the
    replicas' summed gradients add it once. StrategyJob averages gradients, so the scaled value
    is the plain sum (TensorFlow's value times ``num_replicas_in_sync``): add it to each
    replica's ``compute_average_loss`` and the update is TensorFlow's.
    """
    if _context.has_strategy() and _context.in_cross_replica_context():
        raise _cross_replica_error("scale_regularization_loss")
    if isinstance(regularization_loss, (list, tuple)):
        return torch.stack([torch.as_tensor(loss) for loss in regularization_loss]).sum()
    return torch.as_tensor(regularization_loss).sum()
