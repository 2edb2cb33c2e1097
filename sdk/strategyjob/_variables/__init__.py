"""``Variable`` and its distributed forms (mirrors ``tf.Variable`` under ``tf.distribute``).

A :class:`Variable` is a named, mutable tensor. Created inside ``strategy.scope()`` it becomes the
strategy's kind of variable (``strategy.extended.create_variable``, a :class:`VariableCreator`,
decides, through :func:`create_distributed_variable` or :func:`create_aggregating_variable`):

* :class:`MirroredVariable` (``ON_WRITE``/``AUTO``): one component per local replica device,
  kept equal by aggregating every replica-context update (``merge_call`` →
  ``reduce_to``/``broadcast_to`` → ``extended.update``);
* :class:`SyncOnReadVariable` (``ON_READ``): replicas update their own component freely; reading in
  cross-replica context aggregates;
* :class:`AggregatingVariable` (CentralStorageStrategy with several compute devices): one central
  variable, replica-context updates aggregated into exactly one update;
* a plain :class:`Variable` (default strategy, OneDeviceStrategy, one-device CentralStorage).

All of them take part in torch operations (``v + 1``, ``torch.matmul(x, v)``) through
``__torch_function__``, reading the value that the current context sees.

The package splits by kind: ``_common`` (enums, messages, the tensor-like base), ``_plain``
(``Variable``), ``_distributed`` (mirrored and sync-on-read), ``_aggregating`` (central
storage) and ``_factories`` (what the strategies call).
"""

import functools
from collections.abc import Callable
from typing import Any

import torch

from strategyjob import _values
from strategyjob._variables._aggregating import AggregatingVariable
from strategyjob._variables._common import (
    IndexedSlices,
    TensorProtocol,
    VariableAggregation,
    VariableSynchronization,
    _dtype_name,
    _in_sync_on_read_context,
    _initial_tensor,
    _shape_str,
    _sparse_parts,
    _TensorLike,
    _unwrap,
    _validate_enums,
    distributed_container,
    variable_sync_on_read_context,
)
from strategyjob._variables._distributed import (
    _SCATTER_OPS,
    DistributedVariable,
    MirroredVariable,
    SyncOnReadVariable,
    checkpoint_value,
)
from strategyjob._variables._factories import (
    _base_name,
    create_aggregating_variable,
    create_distributed_variable,
    create_plain_variable,
    update_components,
)
from strategyjob._variables._plain import Variable, VariableCreator
from strategyjob._variables._scatter import scatter_

__all__ = [
    "AggregatingVariable",
    "DistributedVariable",
    "IndexedSlices",
    "MirroredVariable",
    "SyncOnReadVariable",
    "TensorProtocol",
    "Variable",
    "VariableAggregation",
    "VariableCreator",
    "VariableSynchronization",
    "checkpoint_reader",
    "create_aggregating_variable",
    "create_distributed_variable",
    "create_plain_variable",
    "distributed_container",
    "scatter_",
    "update_components",
    "variable_sync_on_read_context",
]

# Shared with the strategies and the parameter-server package (imported from here, so the
# split of this package stays its own business):
_INTERNAL = (
    _SCATTER_OPS,
    _TensorLike,
    _base_name,
    _dtype_name,
    _in_sync_on_read_context,
    _initial_tensor,
    _shape_str,
    _sparse_parts,
    _unwrap,
    _validate_enums,
)

# ``_values`` (below) learns which of its values are variables: kept whole by regroup and
# select_replica, a component regrouped into its container.
_values.register_variable_types(DistributedVariable, Variable, distributed_container)


def checkpoint_reader(value: Any) -> Callable[[], torch.Tensor] | None:
    """What ``strategyjob.train.Checkpoint`` reads to save ``value`` when it is a distributed or
    aggregating variable (the cross-replica read, aggregated for sync-on-read; the central
    value); None for anything else, which a checkpoint reads as it reads itself."""
    if isinstance(value, DistributedVariable):
        return functools.partial(checkpoint_value, value)
    if isinstance(value, AggregatingVariable):
        return value.get().read_value
    return None
