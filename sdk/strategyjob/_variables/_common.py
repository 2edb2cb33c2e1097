"""Enums, messages and helpers shared by every kind of variable; the tensor-like base."""

from __future__ import annotations

import contextlib
import enum
import operator
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch

from strategyjob import _context, _values


class VariableSynchronization(enum.Enum):
    """When a distributed variable is synchronised (``tf.VariableSynchronization``)."""

    AUTO = 0
    NONE = 1
    ON_WRITE = 2
    ON_READ = 3


class VariableAggregation(enum.Enum):
    """How replica-context updates of a distributed variable combine (tf.VariableAggregation)."""

    NONE = 0
    SUM = 1
    MEAN = 2
    ONLY_FIRST_REPLICA = 3


class IndexedSlices(NamedTuple):
    """A sparse update of rows ``indices`` (dim 0) by ``values``: the argument of ``scatter_*``."""

    values: torch.Tensor
    indices: torch.Tensor


# ---------------------------------------------------------------------------------------------
# error messages (TensorFlow's text, verbatim)

_NONE_SYNC_MSG = (
    "`NONE` variable synchronization mode is not supported with tf.distribute strategy. "
    "Please change the `synchronization` for variable: {name}"
)
_MEAN_NON_FLOAT_MSG = (
    "creating distributed tf.Variable with aggregation=MEAN and a non-floating dtype is not "
    "supported, please use a different aggregation or dtype"
)
_AGGREGATION_ERROR_MSG = (
    "You must specify an aggregation method to update a "
    "{variable_type} in Replica Context. You can do so by passing "
    "an explicit value for argument `aggregation` to tf.Variable(..)."
    "e.g. `tf.Variable(..., aggregation=tf.VariableAggregation.SUM)`"
    "`tf.VariableAggregation` lists the possible aggregation methods."
    "This is required because {variable_type} should always be "
    "kept in sync. When updating them or assigning to them in a "
    "replica context, we automatically try to aggregate the values "
    "before updating the variable. For this aggregation, we need to "
    "know the aggregation method. "
    "Another alternative is to not try to update such "
    "{variable_type} in replica context, but in cross replica "
    "context. You can enter cross replica context by calling "
    "`tf.distribute.get_replica_context().merge_call(merge_fn, ..)`."
    "Inside `merge_fn`, you can then update the {variable_type} "
    "using `tf.distribute.StrategyExtended.update()`."
)
_SCATTER_ERROR_MSG = (
    "{op_name} is only supported for mirrored variable (variable created within certain "
    "`tf.distribute.Strategy` scope) with NONE or `ONLY_FIRST_REPLICA` aggregation, got: "
    "{aggregation}."
)
_DISTRIBUTED_VALUE_IN_REPLICA_MSG = (
    "Cannot use DistributedValues to update variables in replica context."
)
_ON_READ_CROSS_SUM_MSG = (
    "SyncOnReadVariable does not support `{op}` in cross-replica context when aggregation is "
    "set to `tf.VariableAggregation.SUM`."
)


def _validate_enums(
    synchronization: Any, aggregation: Any, trainable: bool | None, name: str
) -> tuple[VariableSynchronization, VariableAggregation, bool]:
    """TF's ``validate_synchronization_aggregation_trainable``: check the enums, default
    ``trainable`` (False for ON_READ, else True)."""
    try:
        aggregation = VariableAggregation(
            aggregation.value if isinstance(aggregation, enum.Enum) else aggregation
        )
    except ValueError:
        raise ValueError(
            f"Invalid variable aggregation mode: {aggregation} for variable: {name}"
        ) from None
    try:
        synchronization = VariableSynchronization(
            synchronization.value if isinstance(synchronization, enum.Enum) else synchronization
        )
    except ValueError:
        raise ValueError(
            f"Invalid variable synchronization mode: {synchronization} for variable: {name}"
        ) from None
    if trainable is None:
        trainable = synchronization != VariableSynchronization.ON_READ
    return synchronization, aggregation, bool(trainable)


# ---------------------------------------------------------------------------------------------
# helpers shared by every variable kind


def _is_variable(value: Any) -> bool:
    return isinstance(value, _VariableBase)


def _unwrap(structure: Any) -> Any:
    """Replace every variable inside ``structure`` by the tensor the current context reads."""
    if _is_variable(structure):
        return structure.__tf_tensor__()
    if isinstance(structure, (list, tuple)):
        items = [_unwrap(x) for x in structure]
        if hasattr(type(structure), "_fields"):
            return type(structure)(*items)
        return type(structure)(items)
    if isinstance(structure, dict):
        return {k: _unwrap(v) for k, v in structure.items()}
    return structure


def _initial_tensor(initial_value: Any, dtype: torch.dtype | None) -> torch.Tensor:
    if initial_value is None:
        raise ValueError("The `initial_value` arg (`None`) must be specified.")
    if callable(initial_value) and not _is_variable(initial_value):
        initial_value = initial_value()
    if isinstance(initial_value, _values.DistributedValues):
        raise ValueError(
            "Cannot create a variable from a DistributedValues "
            f"({type(initial_value).__name__}); pass one replica's value, e.g. "
            "`strategy.experimental_local_results(value)[0]`."
        )
    value = _unwrap(initial_value)
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        if dtype is not None:
            tensor = tensor.to(dtype)
        return tensor.clone()
    return torch.as_tensor(value, dtype=dtype)


def _cast_tensor(value: Any, dtype: torch.dtype) -> Any:
    """Tensors are aggregated in the variable's dtype (so MEAN of ints into a float variable is
    not floored); Python numbers stay as they are, since identical objects are not reduced."""
    value = _unwrap(value)
    if isinstance(value, torch.Tensor) and value.dtype != dtype:
        return value.detach().to(dtype)
    return value


def _trainable_requires_grad(tensor: torch.Tensor, trainable: bool) -> bool:
    return trainable and (tensor.is_floating_point() or tensor.is_complex())


def _shape_str(shape: torch.Size) -> str:
    return str(tuple(shape))


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _in_replica_context_of(strategy: Any) -> Any:
    """The replica context whose updates this variable must aggregate, or None for cross-replica.

    Like TF's ``enter_or_assert_strategy``: outside every strategy a distributed variable behaves
    as in its own strategy's cross-replica context; inside a different strategy it is an error.
    """
    if not _context.has_strategy():
        return None
    current = _context.get_strategy()
    if current is not strategy:
        raise RuntimeError(
            f"Mixing different tf.distribute.Strategy objects: {current} is not {strategy}"
        )
    return _context.get_replica_context()


def _local_replica_id(ctx: _context.ReplicaContext, count: int) -> int:
    """The component of ``count`` that replica context ``ctx`` reads and updates: its index
    among this process's replicas, which entering it pushed on the mode stack."""
    mode = _context.current_mode()
    index = mode.local_replica_id if mode.replica_context is ctx else None
    if index is None:
        replica_id = ctx.replica_id_in_sync_group  # one process's replicas: the same index
        index = 0 if replica_id is None else int(replica_id)
    return index if 0 <= index < count else 0


_sync_on_read_state = threading.local()


@contextlib.contextmanager
def variable_sync_on_read_context() -> Iterator[None]:
    """Reads of a :class:`SyncOnReadVariable` in replica context all-reduce (TF's
    ``distribute_utils.variable_sync_on_read_context``), e.g. to read a synced metric."""
    depth = getattr(_sync_on_read_state, "depth", 0)
    _sync_on_read_state.depth = depth + 1
    try:
        yield
    finally:
        _sync_on_read_state.depth = depth


def _in_sync_on_read_context() -> bool:
    return getattr(_sync_on_read_state, "depth", 0) > 0


# ---------------------------------------------------------------------------------------------
# operator plumbing: every variable kind reads a tensor via ``_value_for_op`` and delegates


@runtime_checkable
class TensorProtocol(Protocol):
    """What every kind of variable answers (TensorFlow's ``tf.types.experimental.TensorProtocol``):
    the tensor that torch operations read for it in the current context. It is the variable's
    live tensor, not a copy, so that autograd reaches the variable."""

    def __tf_tensor__(
        self, dtype: torch.dtype | None = None, name: str | None = None
    ) -> torch.Tensor: ...


def _snapshot(variable: TensorProtocol) -> torch.Tensor:
    """The value after an update: detached, since an assignment is not differentiable."""
    return variable.__tf_tensor__().detach().clone()


class _TensorLike:
    """Makes a variable usable wherever a tensor is: torch functions, operators, numpy."""

    def _value_for_op(self) -> torch.Tensor:  # pragma: no cover - overridden
        """What :meth:`__tf_tensor__` reads: each kind of variable says how."""
        raise NotImplementedError

    def __tf_tensor__(
        self, dtype: torch.dtype | None = None, name: str | None = None
    ) -> torch.Tensor:
        """:class:`TensorProtocol`: the tensor torch operations read (``name``: torch names no
        operations)."""
        tensor = self._value_for_op()
        return tensor if dtype is None else tensor.to(dtype)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return func(*_unwrap(tuple(args)), **_unwrap(dict(kwargs or {})))

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        array = self._value_for_op().detach().cpu().numpy()
        return array.astype(dtype) if dtype is not None else array

    def numpy(self) -> np.ndarray:
        """A copy of the value as a numpy array (``tf.Variable.numpy``)."""
        return self._value_for_op().detach().cpu().numpy().copy()

    def __float__(self) -> float:
        return float(self._value_for_op().detach())

    def __int__(self) -> int:
        return int(self._value_for_op().detach())

    def __index__(self) -> int:
        return operator.index(self._value_for_op().detach())

    def __bool__(self) -> bool:
        return bool(self._value_for_op().detach())

    def __len__(self) -> int:
        return len(self._value_for_op())

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self._value_for_op())

    def __format__(self, spec: str) -> str:
        return format(self._value_for_op().detach().cpu().numpy(), spec)

    __hash__ = object.__hash__


def _delegate(name: str) -> Callable[..., Any]:
    def method(self: _TensorLike, *args: Any) -> Any:
        return getattr(self._value_for_op(), name)(*_unwrap(args))

    method.__name__ = name
    return method


for _op in "add sub mul matmul truediv floordiv mod pow and or xor lshift rshift".split():
    for _form in (f"__{_op}__", f"__r{_op}__"):
        setattr(_TensorLike, _form, _delegate(_form))
for _form in (
    "__neg__ __pos__ __abs__ __invert__ __lt__ __le__ __gt__ __ge__ __eq__ __ne__ __getitem__"
).split():
    setattr(_TensorLike, _form, _delegate(_form))


def _sparse_parts(sparse_delta: Any) -> tuple[torch.Tensor, torch.Tensor]:
    indices = getattr(sparse_delta, "indices", None)
    values = getattr(sparse_delta, "values", None)
    if isinstance(sparse_delta, torch.Tensor) or indices is None or values is None:
        raise TypeError(
            f"sparse_delta is not IndexedSlices: {sparse_delta!r}. Pass "
            "`strategyjob._variables.IndexedSlices(values, indices)` (rows of dim 0)."
        )
    return torch.as_tensor(_unwrap(indices)), torch.as_tensor(_unwrap(values))


# id(component) -> the distributed or aggregating variable holding it. An entry lives as long as
# that container, which holds its components (so their ids are not reused meanwhile); each
# component holds its container in turn (``_container``), as a Python reference keeps it alive.
_containers: weakref.WeakValueDictionary[int, _VariableBase] = weakref.WeakValueDictionary()


def distributed_container(value: Any) -> Any:
    """The distributed (or aggregating) variable that ``value`` is a component of, else None:
    what ``regroup`` gives back for the components, ``extended.value_container`` for a value."""
    return _containers.get(id(value))


class _VariableBase(_TensorLike):
    """Base of every kind of ``Variable``: ``isinstance(v, strategyjob.Variable)`` holds for all."""

    _container: Any = None  # the container holding this component, set by its ``_contain``

    def _contain(self, component: _VariableBase) -> None:
        """Make this variable the container of ``component`` (see :func:`distributed_container`)."""
        component._container = self
        _containers[id(component)] = self
