"""Variables with one component per local replica: mirrored (``ON_WRITE``) and
sync-on-read (``ON_READ``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from strategyjob import _context, _values
from strategyjob._reduce import ReduceOp
from strategyjob._variables._common import (
    _DISTRIBUTED_VALUE_IN_REPLICA_MSG,
    _ON_READ_CROSS_SUM_MSG,
    _SCATTER_ERROR_MSG,
    VariableAggregation,
    VariableSynchronization,
    _cast_tensor,
    _in_replica_context_of,
    _in_sync_on_read_context,
    _local_replica_id,
    _snapshot,
    _sparse_parts,
    _unwrap,
    _VariableBase,
)
from strategyjob._variables._plain import Variable

_SCATTER_OPS = (
    "scatter_update",
    "scatter_add",
    "scatter_sub",
    "scatter_mul",
    "scatter_div",
    "scatter_min",
    "scatter_max",
)


# ---------------------------------------------------------------------------------------------
# distributed variables: one component per local replica


def _apply_aggregation(strategy: Any, value: Any, aggregation: VariableAggregation, dest: Any):
    """TF's ``values_util.apply_aggregation``: the value every replica's update will use."""
    if aggregation == VariableAggregation.ONLY_FIRST_REPLICA:
        first = strategy.experimental_local_results(value)[0]
        return strategy.extended.broadcast_to(first, destinations=dest)
    reduce_op = ReduceOp.from_variable_aggregation(aggregation)
    return strategy.extended.reduce_to(reduce_op, value, dest)


@contextlib.contextmanager
def _strategy_scope_if_needed(strategy: Any) -> Iterator[None]:
    """Outside every strategy, a variable's updates and cross-replica reads run in its strategy's
    scope (TF does so)."""
    if _context.has_strategy():
        yield
    else:
        with strategy.scope():
            yield


def cross_replica_value(variable: DistributedVariable) -> torch.Tensor:
    """A cross-replica read of ``variable``: its primary component's value, or for a sync-on-read
    variable (unless ``ONLY_FIRST_REPLICA``) its components aggregated."""
    if (
        variable.synchronization != VariableSynchronization.ON_READ
        or variable.aggregation == VariableAggregation.ONLY_FIRST_REPLICA
    ):
        return variable.values[0].read_value()
    reduce_op = ReduceOp.from_variable_aggregation(variable.aggregation)
    components = _values.PerReplica(tuple(c.read_value().detach() for c in variable.values))
    return variable.distribute_strategy.reduce(reduce_op, components, axis=None)


def checkpoint_value(variable: DistributedVariable) -> torch.Tensor:
    """The value a checkpoint saves: the cross-replica read, in ``variable``'s strategy's scope
    when no strategy is in scope."""
    with _strategy_scope_if_needed(variable.distribute_strategy):
        return cross_replica_value(variable)


def _component_update(op_name: str) -> Callable[..., Any]:
    def update(component: Variable, value: Any, **kwargs: Any) -> Any:
        return getattr(component, op_name)(value, **kwargs)

    update.__name__ = op_name
    return update


class DistributedVariable(_VariableBase, _values.DistributedValues):
    """Base of the variables holding one component per local replica device (declared to
    ``_values`` by the package, so ``regroup``/``select_replica`` keep it whole)."""

    def __init__(
        self,
        strategy: Any,
        components: list[Variable],
        *,
        aggregation: VariableAggregation,
        synchronization: VariableSynchronization,
        trainable: bool,
    ) -> None:
        super().__init__(components)
        self._distribute_strategy = strategy
        self._aggregation = aggregation
        self._synchronization = synchronization
        self._trainable = trainable
        for component in components:
            self._contain(component)

    # -- properties ---------------------------------------------------------------------------
    @property
    def _primary(self) -> Variable:
        return self.values[0]

    @property
    def name(self) -> str:
        return self._primary.name

    @property
    def dtype(self) -> torch.dtype:
        return self._primary.dtype

    @property
    def shape(self) -> torch.Size:
        return self._primary.shape

    @property
    def device(self) -> str:
        return self._component_for_context().device

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(c.device for c in self.values)

    @property
    def trainable(self) -> bool:
        return self._trainable

    @property
    def synchronization(self) -> VariableSynchronization:
        return self._synchronization

    @property
    def aggregation(self) -> VariableAggregation:
        return self._aggregation

    @property
    def distribute_strategy(self) -> Any:
        return self._distribute_strategy

    def get_shape(self) -> torch.Size:
        return self.shape

    # -- context ------------------------------------------------------------------------------
    def _replica_ctx(self) -> Any:
        return _in_replica_context_of(self._distribute_strategy)

    def _component_for_context(self) -> Variable:
        update_id = _context.get_update_replica_id()
        if update_id is not None and update_id < len(self.values):
            return self.values[update_id]
        ctx = self._replica_ctx()
        if ctx is None:
            return self._primary
        return self.values[_local_replica_id(ctx, len(self.values))]

    # -- reads --------------------------------------------------------------------------------
    def _value_for_op(self) -> torch.Tensor:
        return self._component_for_context().__tf_tensor__()

    def _get(self) -> torch.Tensor:  # what ``DistributedValues`` unwrapping reads
        return self._value_for_op()

    def read_value(self) -> torch.Tensor:
        return self._component_for_context().read_value()

    def value(self) -> torch.Tensor:
        return self.read_value()

    def numpy(self) -> np.ndarray:
        return self.read_value().detach().cpu().numpy()

    # -- updates ------------------------------------------------------------------------------
    def _update(self, op_name: str, value: Any, read_value: bool) -> torch.Tensor | None:
        update_id = _context.get_update_replica_id()
        if update_id is not None and update_id < len(self.values):
            # inside ``extended.update``: this call is the update of one component
            return getattr(self.values[update_id], op_name)(value, read_value=read_value)
        ctx = self._replica_ctx()
        if ctx is None:
            with _strategy_scope_if_needed(self._distribute_strategy):
                self._update_cross_replica(op_name, value)
                return cross_replica_value(self).detach() if read_value else None
        if isinstance(value, _values.DistributedValues):
            raise TypeError(_DISTRIBUTED_VALUE_IN_REPLICA_MSG)
        local = self.values[_local_replica_id(ctx, len(self.values))]
        self._update_replica(ctx, local, op_name, _cast_tensor(value, self.dtype))
        return _snapshot(local) if read_value else None

    def _update_cross_replica(self, op_name: str, value: Any) -> None:
        raise NotImplementedError

    def _update_replica(self, ctx: Any, local: Variable, op_name: str, value: Any) -> None:
        raise NotImplementedError

    def assign(
        self, value: Any, use_locking: Any = None, name: Any = None, read_value: bool = True
    ):
        """Update as the synchronization and aggregation say; returns the value now visible."""
        return self._update("assign", value, read_value)

    def assign_add(
        self, delta: Any, use_locking: Any = None, name: Any = None, read_value: bool = True
    ):
        return self._update("assign_add", delta, read_value)

    def assign_sub(
        self, delta: Any, use_locking: Any = None, name: Any = None, read_value: bool = True
    ):
        return self._update("assign_sub", delta, read_value)

    def __repr__(self) -> str:
        parts = ",\n".join(f"  {i}: {c!r}" for i, c in enumerate(self.values))
        return f"{type(self).__name__}:{{\n{parts}\n}}"

    __str__ = __repr__
    __hash__ = object.__hash__


class MirroredVariable(DistributedVariable):
    """``ON_WRITE`` variable: every replica-context update is aggregated, so components stay equal.

    With ``aggregation=NONE`` each replica writes its own component (they may diverge, as in
    current TensorFlow).
    """

    def _update_cross_replica(self, op_name: str, value: Any) -> None:
        self._distribute_strategy.extended.update(
            self, _component_update(op_name), args=(value,), group=True
        )

    def _update_replica(self, ctx: Any, local: Variable, op_name: str, value: Any) -> None:
        if self._aggregation == VariableAggregation.NONE:
            getattr(local, op_name)(value)
            return

        def merge_fn(strategy: Any, merged: Any) -> None:
            aggregated = _apply_aggregation(strategy, merged, self._aggregation, self)
            self._update_cross_replica(op_name, aggregated)

        ctx.merge_call(merge_fn, args=(value,))

    def _scatter(self, op_name: str, sparse_delta: Any) -> torch.Tensor:
        if op_name in (
            "scatter_min",
            "scatter_max",
            "scatter_update",
        ) and self._aggregation not in (
            VariableAggregation.NONE,
            VariableAggregation.ONLY_FIRST_REPLICA,
        ):
            raise NotImplementedError(
                _SCATTER_ERROR_MSG.format(op_name=op_name, aggregation=self._aggregation)
            )
        ctx = self._replica_ctx()
        if ctx is None:
            with _strategy_scope_if_needed(self._distribute_strategy):
                self._distribute_strategy.extended.update(
                    self, _component_update(op_name), args=(sparse_delta,), group=True
                )
                return cross_replica_value(self)
        local = self.values[_local_replica_id(ctx, len(self.values))]
        if self._aggregation == VariableAggregation.NONE:
            return getattr(local, op_name)(sparse_delta)
        if self._aggregation == VariableAggregation.ONLY_FIRST_REPLICA:

            def first_fn(strategy: Any, merged: Any) -> None:
                first = strategy.experimental_local_results(merged)[0]
                strategy.extended.update(self, _component_update(op_name), args=(first,))

            ctx.merge_call(first_fn, args=(sparse_delta,))
            return _snapshot(local)
        if op_name not in ("scatter_add", "scatter_sub"):
            raise NotImplementedError(
                f"{op_name} in replica context with {self._aggregation} aggregation is not "
                "supported; update the variable in cross-replica context instead."
            )
        # SUM/MEAN of sparse additions == the aggregated dense delta.
        indices, updates = _sparse_parts(sparse_delta)
        dense = torch.zeros_like(local.__tf_tensor__()).detach()
        dense.index_add_(0, indices.to(dense.device, torch.long), updates.to(dense.dtype))
        self._update_replica(
            ctx, local, "assign_add" if op_name == "scatter_add" else "assign_sub", dense
        )
        return _snapshot(local)


class SyncOnReadVariable(DistributedVariable):
    """``ON_READ`` variable: replicas update their own component; cross-replica reads aggregate."""

    def _reduce_op(self) -> ReduceOp:
        return ReduceOp.from_variable_aggregation(self._aggregation)

    def _value_for_op(self) -> torch.Tensor:
        update_id = _context.get_update_replica_id()
        if update_id is not None and update_id < len(self.values):
            return self.values[update_id].__tf_tensor__()
        ctx = self._replica_ctx()
        if ctx is None:
            with _strategy_scope_if_needed(self._distribute_strategy):
                return cross_replica_value(self)
        local = self.values[_local_replica_id(ctx, len(self.values))]
        if _in_sync_on_read_context():
            if self._aggregation == VariableAggregation.ONLY_FIRST_REPLICA:
                return self._primary.__tf_tensor__()
            return ctx.all_reduce(self._reduce_op(), local.read_value().detach())
        return local.__tf_tensor__()

    def read_value(self) -> torch.Tensor:
        """Replica context: a copy of the local component; cross-replica: the aggregate."""
        value = self._value_for_op()
        return value.clone() if value is self._local_tensor_or_none() else value

    def _local_tensor_or_none(self) -> torch.Tensor | None:
        ctx = self._replica_ctx()
        if ctx is None:
            return None
        return self.values[_local_replica_id(ctx, len(self.values))].__tf_tensor__()

    def _update_cross_replica(self, op_name: str, value: Any) -> None:
        if isinstance(value, _values.DistributedValues):
            raise ValueError(
                f"Cannot {op_name} a {type(value).__name__} to a SyncOnReadVariable in "
                "cross-replica context; pass a single value."
            )
        if self._aggregation == VariableAggregation.SUM:
            if op_name != "assign":
                raise ValueError(_ON_READ_CROSS_SUM_MSG.format(op=op_name))
            value = torch.as_tensor(_unwrap(value)) / self._distribute_strategy.num_replicas_in_sync
            value = value.to(self.dtype)
        for component in self.values:
            getattr(component, op_name)(value)

    def _update_replica(self, ctx: Any, local: Variable, op_name: str, value: Any) -> None:
        getattr(local, op_name)(value)


def _on_read_scatter(op_name: str) -> Callable[..., Any]:
    def method(self: SyncOnReadVariable, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"Variables with `synchronization=ON_READ` doesn't support `{op_name}`"
        )

    method.__name__ = op_name
    return method


def _mirrored_scatter(op_name: str) -> Callable[..., Any]:
    def method(self: Any, sparse_delta: Any, use_locking: bool = False, name=None):
        return self._scatter(op_name, sparse_delta)

    method.__name__ = op_name
    return method
