"""``AggregatingVariable``: one central variable (CentralStorageStrategy)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from strategyjob import _context, _devices, _values
from strategyjob._variables._common import (
    _AGGREGATION_ERROR_MSG,
    _DISTRIBUTED_VALUE_IN_REPLICA_MSG,
    VariableAggregation,
    VariableSynchronization,
    _cast_tensor,
    _in_replica_context_of,
    _local_replica_id,
    _snapshot,
    _VariableBase,
)
from strategyjob._variables._distributed import _apply_aggregation, _component_update
from strategyjob._variables._plain import Variable

# ---------------------------------------------------------------------------------------------
# AggregatingVariable: one central variable (CentralStorageStrategy)


class AggregatingVariable(_VariableBase):
    """One central variable whose replica-context updates are aggregated into one update.

    Not a ``DistributedValues``: ``strategy.experimental_local_results(v) == (v,)`` and
    ``strategy.run`` passes it to every replica unchanged. Reads in a replica copy the central
    value to that replica's compute device.
    """

    def __init__(self, strategy: Any, variable: Variable, aggregation: VariableAggregation):
        self._distribute_strategy = strategy
        self._v = variable
        self._aggregation = aggregation
        self._contain(variable)

    def get(self) -> Variable:
        """The wrapped central variable."""
        return self._v

    @property
    def name(self) -> str:
        return self._v.name

    @property
    def dtype(self) -> torch.dtype:
        return self._v.dtype

    @property
    def shape(self) -> torch.Size:
        return self._v.shape

    @property
    def device(self) -> str:
        return self._v.device

    @property
    def trainable(self) -> bool:
        return self._v.trainable

    @property
    def synchronization(self) -> VariableSynchronization:
        return self._v.synchronization

    @property
    def aggregation(self) -> VariableAggregation:
        return self._aggregation

    @property
    def distribute_strategy(self) -> Any:
        return self._distribute_strategy

    @property
    def grad(self) -> torch.Tensor | None:
        return self._v.grad

    def get_shape(self) -> torch.Size:
        return self.shape

    def _replica_device(self) -> torch.device | None:
        ctx = _in_replica_context_of(self._distribute_strategy)
        if ctx is None:
            return None
        devices = self._distribute_strategy.extended.topology.local_devices
        if not devices:
            return None
        return _devices.canonicalize(devices[_local_replica_id(ctx, len(devices))]).torch_device

    def _value_for_op(self) -> torch.Tensor:
        value = self._v.__tf_tensor__()
        device = self._replica_device()
        return value if device is None else value.to(device)

    def read_value(self) -> torch.Tensor:
        value = self._v.read_value()
        device = self._replica_device()
        return value if device is None else value.to(device)

    def value(self) -> torch.Tensor:
        return self.read_value()

    def _update(self, op_name: str, value: Any, read_value: bool) -> torch.Tensor | None:
        if _context.get_update_replica_id() is not None:  # inside ``extended.update``
            return getattr(self._v, op_name)(value, read_value=read_value)
        strategy = self._distribute_strategy
        update = _component_update(op_name)
        ctx = _in_replica_context_of(strategy)
        if ctx is None:
            if _context.has_strategy():
                strategy.extended.update(self, update, args=(value,))
            else:
                with strategy.scope():
                    strategy.extended.update(self, update, args=(value,))
            return _snapshot(self._v) if read_value else None
        if self._aggregation == VariableAggregation.NONE:
            raise ValueError(_AGGREGATION_ERROR_MSG.format(variable_type="AggregatingVariable"))
        if isinstance(value, _values.DistributedValues):
            raise TypeError(_DISTRIBUTED_VALUE_IN_REPLICA_MSG)

        def merge_fn(strategy: Any, merged: Any) -> None:
            aggregated = _apply_aggregation(strategy, merged, self._aggregation, self)
            strategy.extended.update(self, update, args=(aggregated,))

        ctx.merge_call(merge_fn, args=(_cast_tensor(value, self.dtype),))
        return self.read_value().detach() if read_value else None

    def assign(
        self, value: Any, use_locking: Any = None, name: Any = None, read_value: bool = True
    ):
        """Replica context: aggregate over replicas, then one update of the central variable."""
        return self._update("assign", value, read_value)

    def assign_add(
        self, delta: Any, use_locking: Any = None, name: Any = None, read_value: bool = True
    ):
        return self._update("assign_add", delta, read_value)

    def assign_sub(
        self, delta: Any, use_locking: Any = None, name: Any = None, read_value: bool = True
    ):
        return self._update("assign_sub", delta, read_value)

    def _scatter(self, op_name: str, sparse_delta: Any) -> torch.Tensor:
        strategy = self._distribute_strategy
        update = _component_update(op_name)
        ctx = _in_replica_context_of(strategy)
        if ctx is None:
            with contextlib.ExitStack() as stack:
                if not _context.has_strategy():
                    stack.enter_context(strategy.scope())
                strategy.extended.update(self, update, args=(sparse_delta,))
            return _snapshot(self._v)
        if self._aggregation != VariableAggregation.ONLY_FIRST_REPLICA:
            raise NotImplementedError(
                f"{op_name} of an AggregatingVariable in replica context is only supported "
                f"with ONLY_FIRST_REPLICA aggregation, got: {self._aggregation}. Update it in "
                "cross-replica context (in a merge_call) instead."
            )

        def first_fn(strategy: Any, merged: Any) -> None:
            first = strategy.experimental_local_results(merged)[0]
            strategy.extended.update(self, update, args=(first,))

        ctx.merge_call(first_fn, args=(sparse_delta,))
        return _snapshot(self._v)

    def __repr__(self) -> str:
        return repr(self._v)

    __str__ = __repr__
