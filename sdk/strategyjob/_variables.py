"""``Variable`` and its distributed forms (mirrors ``tf.Variable`` under ``tf.distribute``).

A :class:`Variable` is a named, mutable tensor. Created inside ``strategy.scope()`` it becomes the
strategy's kind of variable (``strategy.extended._create_variable`` decides, through
:func:`create_distributed_variable` or :func:`create_aggregating_variable`):

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
"""

from __future__ import annotations

import contextlib
import enum
import operator
import threading
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import torch

from strategyjob import _context, _devices, _values
from strategyjob._reduce import ReduceOp


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
    return isinstance(value, (Variable, DistributedVariable, AggregatingVariable))


def _unwrap(structure: Any) -> Any:
    """Replace every variable inside ``structure`` by the tensor the current context reads."""
    if _is_variable(structure):
        return structure._value_for_op()
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


def _local_replica_id(ctx: Any, count: int) -> int:
    index = getattr(ctx, "_local_replica_id", None)
    if index is None:
        index = getattr(ctx, "replica_id_in_sync_group", 0)
        index = int(index) if not isinstance(index, int) else index
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


class _TensorLike:
    """Makes a variable usable wherever a tensor is: torch functions, operators, numpy."""

    def _value_for_op(self) -> torch.Tensor:  # pragma: no cover - overridden
        raise NotImplementedError

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


# ---------------------------------------------------------------------------------------------
# the plain variable


class _VariableMeta(type):
    """``Variable(...)`` inside a strategy's scope returns that strategy's kind of variable."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        _context.check_variable_creation_scope()
        if cls is Variable and _context.has_strategy():
            return _create_in_scope(_context.get_strategy(), *args, **kwargs)
        return super().__call__(*args, **kwargs)

    def __instancecheck__(cls, instance: Any) -> bool:
        if cls is Variable and isinstance(instance, (DistributedVariable, AggregatingVariable)):
            return True
        return super().__instancecheck__(instance)


def _create_in_scope(
    strategy: Any,
    initial_value: Any = None,
    trainable: bool | None = None,
    name: str | None = None,
    synchronization: Any = VariableSynchronization.AUTO,
    aggregation: Any = VariableAggregation.NONE,
    *,
    dtype: torch.dtype | None = None,
    device: Any = None,
) -> Any:
    # ``device`` is ignored in a strategy's scope: the strategy places every variable.
    if dtype is not None:
        initial_value = _initial_tensor(initial_value, dtype)
    return strategy.extended._create_variable(
        initial_value,
        trainable=trainable,
        name=name,
        synchronization=synchronization,
        aggregation=aggregation,
    )


class Variable(_TensorLike, metaclass=_VariableMeta):
    """A named, mutable tensor: the ``tf.Variable`` analogue.

    ``assign``/``assign_add``/``assign_sub`` update it in place and return the updated value;
    ``read_value()`` returns a snapshot. A trainable floating-point variable requires grad, so a
    loss computed from it can be differentiated (TF's GradientTape watches trainable variables).
    """

    def __init__(
        self,
        initial_value: Any = None,
        trainable: bool | None = None,
        name: str | None = None,
        synchronization: VariableSynchronization = VariableSynchronization.AUTO,
        aggregation: VariableAggregation = VariableAggregation.NONE,
        *,
        dtype: torch.dtype | None = None,
        device: Any = None,
    ) -> None:
        base = name or "Variable"
        synchronization, aggregation, trainable = _validate_enums(
            synchronization, aggregation, trainable, base
        )
        self._setup(
            _initial_tensor(initial_value, dtype),
            name=f"{base}:0",
            trainable=trainable,
            synchronization=synchronization,
            aggregation=aggregation,
            device=_devices.canonicalize(device) if device is not None else None,
            strategy=None,
        )

    @classmethod
    def _plain(
        cls,
        tensor: torch.Tensor,
        *,
        name: str,
        trainable: bool,
        synchronization: VariableSynchronization,
        aggregation: VariableAggregation,
        device: _devices.LogicalDevice | None,
        strategy: Any,
    ) -> Variable:
        """Build a plain variable without the scope interception (used by the strategies)."""
        variable = object.__new__(cls)
        variable._setup(
            tensor,
            name=name,
            trainable=trainable,
            synchronization=synchronization,
            aggregation=aggregation,
            device=device,
            strategy=strategy,
        )
        return variable

    def _setup(
        self,
        tensor: torch.Tensor,
        *,
        name: str,
        trainable: bool,
        synchronization: VariableSynchronization,
        aggregation: VariableAggregation,
        device: _devices.LogicalDevice | None,
        strategy: Any,
    ) -> None:
        if device is None:
            device = _devices.canonicalize(tensor.device)
        tensor = tensor.detach().to(device.torch_device).clone()
        tensor.requires_grad_(_trainable_requires_grad(tensor, trainable))
        self._tensor = tensor
        self._name = name
        self._trainable = trainable
        self._synchronization = synchronization
        self._aggregation = aggregation
        self._logical_device = device
        self._distribute_strategy = strategy
        self._container: Any = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """Picklable and deep-copyable (``copy.deepcopy(model)``, ``torch.save``): the value,
        name and enums travel; the lock and the owning strategy do not."""
        state = dict(self.__dict__)
        state.pop("_lock")
        state["_distribute_strategy"] = None
        state["_container"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- properties ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def dtype(self) -> torch.dtype:
        return self._tensor.dtype

    @property
    def shape(self) -> torch.Size:
        return self._tensor.shape

    @property
    def device(self) -> str:
        """TF's fully qualified device name: ``/job:localhost/replica:0/task:0/device:CPU:0``."""
        return self._logical_device.name

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

    @property
    def grad(self) -> torch.Tensor | None:
        return self._tensor.grad

    def get_shape(self) -> torch.Size:
        return self.shape

    def _distributed_container(self) -> Any:
        """The distributed variable this is a component of (``regroup`` returns it), or None."""
        return self._container

    # -- reads --------------------------------------------------------------------------------
    def _value_for_op(self) -> torch.Tensor:
        return self._tensor

    def read_value(self) -> torch.Tensor:
        """A snapshot of the current value (later updates do not change it)."""
        return self._tensor.clone()

    def value(self) -> torch.Tensor:
        return self.read_value()

    # -- updates ------------------------------------------------------------------------------
    def _convert(self, value: Any, op_name: str) -> torch.Tensor:
        if isinstance(value, _values.DistributedValues):
            raise ValueError(
                f"Cannot {op_name} a {type(value).__name__} to the variable '{self._name}' "
                "outside of a replica context; run the update inside `strategy.run`, or pass "
                "one replica's value (`strategy.experimental_local_results(value)[0]`)."
            )
        value = _unwrap(value)
        if isinstance(value, torch.Tensor):
            tensor = value.detach().to(device=self._tensor.device, dtype=self._tensor.dtype)
        else:
            tensor = torch.as_tensor(value, dtype=self._tensor.dtype, device=self._tensor.device)
        if tensor.shape != self._tensor.shape:
            if op_name == "assign":
                raise ValueError(
                    f"Cannot assign value to variable ' {self._name}': Shape mismatch."
                    f"The variable shape {_shape_str(self.shape)}, and the assigned value shape "
                    f"{_shape_str(tensor.shape)} are incompatible."
                )
            raise ValueError(
                f"Cannot update variable with shape {list(self.shape)} using a Tensor with "
                f"shape {list(tensor.shape)}, shapes must be equal."
            )
        return tensor

    def _apply(self, op_name: str, value: Any, read_value: bool) -> torch.Tensor | None:
        tensor = self._convert(value, op_name)
        with self._lock, torch.no_grad():
            if op_name == "assign":
                self._tensor.copy_(tensor)
            elif op_name == "assign_add":
                self._tensor.add_(tensor)
            else:
                self._tensor.sub_(tensor)
        return self._snapshot() if read_value else None

    def _snapshot(self) -> torch.Tensor:
        """The value after an update: detached, since an assignment is not differentiable."""
        return self._tensor.detach().clone()

    def assign(
        self,
        value: Any,
        use_locking: bool | None = None,
        name: str | None = None,
        read_value: bool = True,
    ) -> torch.Tensor | None:
        """Set the value; returns the new value (None with ``read_value=False``)."""
        return self._apply("assign", value, read_value)

    def assign_add(
        self,
        delta: Any,
        use_locking: bool | None = None,
        name: str | None = None,
        read_value: bool = True,
    ) -> torch.Tensor | None:
        return self._apply("assign_add", delta, read_value)

    def assign_sub(
        self,
        delta: Any,
        use_locking: bool | None = None,
        name: str | None = None,
        read_value: bool = True,
    ) -> torch.Tensor | None:
        return self._apply("assign_sub", delta, read_value)

    def _scatter(self, op_name: str, sparse_delta: Any) -> torch.Tensor:
        indices, updates = _sparse_parts(sparse_delta)
        indices = indices.to(device=self._tensor.device, dtype=torch.long)
        updates = updates.detach().to(device=self._tensor.device, dtype=self._tensor.dtype)
        with self._lock, torch.no_grad():
            data = self._tensor
            if op_name == "scatter_update":
                data.index_copy_(0, indices, updates)
            elif op_name == "scatter_add":
                data.index_add_(0, indices, updates)
            elif op_name == "scatter_sub":
                data.index_add_(0, indices, -updates)
            else:
                reduce = {
                    "scatter_mul": "prod",
                    "scatter_div": "prod",
                    "scatter_min": "amin",
                    "scatter_max": "amax",
                }[op_name]
                if op_name == "scatter_div":
                    updates = 1 / updates
                rows = indices.view(-1, *([1] * (updates.dim() - 1))).expand_as(updates)
                data.scatter_reduce_(0, rows, updates, reduce, include_self=True)
        return self._snapshot()

    def scatter_update(self, sparse_delta: Any, use_locking: bool = False, name: Any = None):
        """Set rows ``sparse_delta.indices`` to ``sparse_delta.values``."""
        return self._scatter("scatter_update", sparse_delta)

    def scatter_add(self, sparse_delta: Any, use_locking: bool = False, name: Any = None):
        return self._scatter("scatter_add", sparse_delta)

    def scatter_sub(self, sparse_delta: Any, use_locking: bool = False, name: Any = None):
        return self._scatter("scatter_sub", sparse_delta)

    def scatter_mul(self, sparse_delta: Any, use_locking: bool = False, name: Any = None):
        return self._scatter("scatter_mul", sparse_delta)

    def scatter_div(self, sparse_delta: Any, use_locking: bool = False, name: Any = None):
        return self._scatter("scatter_div", sparse_delta)

    def scatter_min(self, sparse_delta: Any, use_locking: bool = False, name: Any = None):
        return self._scatter("scatter_min", sparse_delta)

    def scatter_max(self, sparse_delta: Any, use_locking: bool = False, name: Any = None):
        return self._scatter("scatter_max", sparse_delta)

    def __repr__(self) -> str:
        array = self._tensor.detach().cpu().numpy()
        shown = repr(array.item()) if array.ndim == 0 else "\n" + repr(array)
        return (
            f"<strategyjob.Variable '{self._name}' shape={_shape_str(self.shape)} "
            f"dtype={_dtype_name(self.dtype)}, numpy={shown}>"
        )

    __str__ = __repr__


def _sparse_parts(sparse_delta: Any) -> tuple[torch.Tensor, torch.Tensor]:
    indices = getattr(sparse_delta, "indices", None)
    values = getattr(sparse_delta, "values", None)
    if isinstance(sparse_delta, torch.Tensor) or indices is None or values is None:
        raise TypeError(
            f"sparse_delta is not IndexedSlices: {sparse_delta!r}. Pass "
            "`strategyjob._variables.IndexedSlices(values, indices)` (rows of dim 0)."
        )
    return torch.as_tensor(_unwrap(indices)), torch.as_tensor(_unwrap(values))


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


def _component_update(op_name: str) -> Callable[..., Any]:
    def update(component: Variable, value: Any, **kwargs: Any) -> Any:
        return getattr(component, op_name)(value, **kwargs)

    update.__name__ = op_name
    return update


class DistributedVariable(_TensorLike, _values.DistributedValues):
    """Base of the variables holding one component per local replica device."""

    _is_distributed_variable = True  # how ``_values.regroup``/``select_replica`` know it

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
            component._container = self

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
    def _devices(self) -> tuple[_devices.LogicalDevice, ...]:
        return tuple(c._logical_device for c in self.values)

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

    @contextlib.contextmanager
    def _strategy_scope_if_needed(self) -> Iterator[None]:
        """Outside every strategy, updates run in this variable's strategy's scope (TF does so)."""
        if _context.has_strategy():
            yield
        else:
            with self._distribute_strategy.scope():
                yield

    # -- reads --------------------------------------------------------------------------------
    def _value_for_op(self) -> torch.Tensor:
        return self._component_for_context()._value_for_op()

    def _get(self) -> torch.Tensor:  # what ``DistributedValues`` unwrapping reads
        return self._value_for_op()

    def read_value(self) -> torch.Tensor:
        return self._component_for_context().read_value()

    def value(self) -> torch.Tensor:
        return self.read_value()

    def numpy(self) -> np.ndarray:
        return self.read_value().detach().cpu().numpy()

    def _checkpoint_value(self) -> torch.Tensor:
        """The value to save: the cross-replica read (aggregated for sync-on-read)."""
        with self._strategy_scope_if_needed():
            return self._cross_replica_read()

    def _cross_replica_read(self) -> torch.Tensor:
        return self._primary.read_value()

    # -- updates ------------------------------------------------------------------------------
    def _update(self, op_name: str, value: Any, read_value: bool) -> torch.Tensor | None:
        update_id = _context.get_update_replica_id()
        if update_id is not None and update_id < len(self.values):
            # inside ``extended.update``: this call is the update of one component
            return getattr(self.values[update_id], op_name)(value, read_value=read_value)
        ctx = self._replica_ctx()
        if ctx is None:
            with self._strategy_scope_if_needed():
                self._update_cross_replica(op_name, value)
                return self._cross_replica_read().detach() if read_value else None
        if isinstance(value, _values.DistributedValues):
            raise TypeError(_DISTRIBUTED_VALUE_IN_REPLICA_MSG)
        local = self.values[_local_replica_id(ctx, len(self.values))]
        self._update_replica(ctx, local, op_name, _cast_tensor(value, self.dtype))
        return local._snapshot() if read_value else None

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
            with self._strategy_scope_if_needed():
                self._distribute_strategy.extended.update(
                    self, _component_update(op_name), args=(sparse_delta,), group=True
                )
                return self._cross_replica_read()
        local = self.values[_local_replica_id(ctx, len(self.values))]
        if self._aggregation == VariableAggregation.NONE:
            return getattr(local, op_name)(sparse_delta)
        if self._aggregation == VariableAggregation.ONLY_FIRST_REPLICA:

            def first_fn(strategy: Any, merged: Any) -> None:
                first = strategy.experimental_local_results(merged)[0]
                strategy.extended.update(self, _component_update(op_name), args=(first,))

            ctx.merge_call(first_fn, args=(sparse_delta,))
            return local._snapshot()
        if op_name not in ("scatter_add", "scatter_sub"):
            raise NotImplementedError(
                f"{op_name} in replica context with {self._aggregation} aggregation is not "
                "supported; update the variable in cross-replica context instead."
            )
        # SUM/MEAN of sparse additions == the aggregated dense delta.
        indices, updates = _sparse_parts(sparse_delta)
        dense = torch.zeros_like(local._tensor).detach()
        dense.index_add_(0, indices.to(dense.device, torch.long), updates.to(dense.dtype))
        self._update_replica(
            ctx, local, "assign_add" if op_name == "scatter_add" else "assign_sub", dense
        )
        return local._snapshot()


class SyncOnReadVariable(DistributedVariable):
    """``ON_READ`` variable: replicas update their own component; cross-replica reads aggregate."""

    def _reduce_op(self) -> ReduceOp:
        return ReduceOp.from_variable_aggregation(self._aggregation)

    def _cross_replica_read(self) -> torch.Tensor:
        if self._aggregation == VariableAggregation.ONLY_FIRST_REPLICA:
            return self._primary.read_value()
        reduce_op = self._reduce_op()
        components = _values.PerReplica(tuple(c.read_value().detach() for c in self.values))
        return self._distribute_strategy.reduce(reduce_op, components, axis=None)

    def _value_for_op(self) -> torch.Tensor:
        update_id = _context.get_update_replica_id()
        if update_id is not None and update_id < len(self.values):
            return self.values[update_id]._value_for_op()
        ctx = self._replica_ctx()
        if ctx is None:
            with self._strategy_scope_if_needed():
                return self._cross_replica_read()
        local = self.values[_local_replica_id(ctx, len(self.values))]
        if _in_sync_on_read_context():
            if self._aggregation == VariableAggregation.ONLY_FIRST_REPLICA:
                return self._primary._value_for_op()
            return ctx.all_reduce(self._reduce_op(), local.read_value().detach())
        return local._value_for_op()

    def read_value(self) -> torch.Tensor:
        """Replica context: a copy of the local component; cross-replica: the aggregate."""
        value = self._value_for_op()
        return value.clone() if value is self._local_tensor_or_none() else value

    def _local_tensor_or_none(self) -> torch.Tensor | None:
        ctx = self._replica_ctx()
        if ctx is None:
            return None
        return self.values[_local_replica_id(ctx, len(self.values))]._tensor

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


# ---------------------------------------------------------------------------------------------
# AggregatingVariable: one central variable (CentralStorageStrategy)


class AggregatingVariable(_TensorLike):
    """One central variable whose replica-context updates are aggregated into one update.

    Not a ``DistributedValues``: ``strategy.experimental_local_results(v) == (v,)`` and
    ``strategy.run`` passes it to every replica unchanged. Reads in a replica copy the central
    value to that replica's compute device.
    """

    def __init__(self, strategy: Any, variable: Variable, aggregation: VariableAggregation):
        self._distribute_strategy = strategy
        self._v = variable
        self._aggregation = aggregation
        variable._container = self

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
    def _devices(self) -> tuple[_devices.LogicalDevice, ...]:
        return (self._v._logical_device,)

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
        devices = getattr(self._distribute_strategy.extended, "_local_devices", ())
        if not devices:
            return None
        return _devices.canonicalize(devices[_local_replica_id(ctx, len(devices))]).torch_device

    def _value_for_op(self) -> torch.Tensor:
        value = self._v._value_for_op()
        device = self._replica_device()
        return value if device is None else value.to(device)

    def read_value(self) -> torch.Tensor:
        value = self._v.read_value()
        device = self._replica_device()
        return value if device is None else value.to(device)

    def value(self) -> torch.Tensor:
        return self.read_value()

    def _checkpoint_value(self) -> torch.Tensor:
        return self._v.read_value()

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
            return self._v._snapshot() if read_value else None
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
            return self._v._snapshot()
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
        return self._v._snapshot()

    def __repr__(self) -> str:
        return repr(self._v)

    __str__ = __repr__


# ---------------------------------------------------------------------------------------------
# creation, called by the strategies' ``extended._create_variable``


def _base_name(name: str | None) -> str:
    base = name or "Variable"
    return base[:-2] if base.endswith(":0") else base


def create_plain_variable(
    strategy: Any,
    initial_value: Any,
    *,
    device: Any,
    trainable: bool | None = None,
    name: str | None = None,
    synchronization: Any = VariableSynchronization.AUTO,
    aggregation: Any = VariableAggregation.NONE,
) -> Variable:
    """A single-copy variable on ``device`` owned by ``strategy`` (OneDevice, one-device CSS)."""
    base = _base_name(name)
    synchronization, aggregation, trainable = _validate_enums(
        synchronization, aggregation, trainable, base
    )
    return Variable._plain(
        _initial_tensor(initial_value, None),
        name=f"{base}:0",
        trainable=trainable,
        synchronization=synchronization,
        aggregation=aggregation,
        device=_devices.canonicalize(device) if device is not None else None,
        strategy=strategy,
    )


def _in_replica_fn(strategy: Any) -> Any:
    """The replica context when variable creation happens inside ``strategy.run``."""
    ctx = _context.get_replica_context()
    if ctx is not None and getattr(ctx, "strategy", None) is strategy:
        return ctx
    return None


def create_distributed_variable(
    strategy: Any,
    initial_value: Any,
    *,
    trainable: bool | None = None,
    name: str | None = None,
    synchronization: Any = VariableSynchronization.AUTO,
    aggregation: Any = VariableAggregation.NONE,
) -> DistributedVariable:
    """A MirroredVariable (ON_WRITE/AUTO) or SyncOnReadVariable (ON_READ) over the local devices.

    The initial value is broadcast from the chief (``extended._broadcast_from_chief``) and every
    component starts as a copy of component 0. Called inside ``strategy.run``, the variable is
    created once (in a ``merge_call``) and shared by all replicas.
    """
    ctx = _in_replica_fn(strategy)
    if ctx is not None:
        return ctx.merge_call(
            lambda s: create_distributed_variable(
                s,
                initial_value,
                trainable=trainable,
                name=name,
                synchronization=synchronization,
                aggregation=aggregation,
            )
        )
    base = _base_name(name)
    synchronization, aggregation, trainable = _validate_enums(
        synchronization, aggregation, trainable, base
    )
    if synchronization == VariableSynchronization.NONE:
        raise ValueError(_NONE_SYNC_MSG.format(name=base))
    extended = strategy.extended
    tensor = _initial_tensor(initial_value, None)
    if aggregation == VariableAggregation.MEAN and not (
        tensor.is_floating_point() or tensor.is_complex()
    ):
        raise ValueError(_MEAN_NON_FLOAT_MSG)
    broadcast = getattr(extended, "_broadcast_from_chief", None)
    if broadcast is not None:
        tensor = broadcast(tensor)
    devices = [_devices.canonicalize(d) for d in extended._local_devices]
    components = []
    for i, device in enumerate(devices):
        source = tensor if i == 0 else components[0].read_value()
        components.append(
            Variable._plain(
                source,
                name=f"{base}:0" if i == 0 else f"{base}/replica_{i}:0",
                trainable=trainable,
                synchronization=synchronization,
                aggregation=aggregation,
                device=device,
                strategy=strategy,
            )
        )
    kind = (
        SyncOnReadVariable
        if synchronization == VariableSynchronization.ON_READ
        else MirroredVariable
    )
    return kind(
        strategy,
        components,
        aggregation=aggregation,
        synchronization=synchronization,
        trainable=trainable,
    )


def create_aggregating_variable(
    strategy: Any,
    initial_value: Any,
    *,
    device: Any,
    trainable: bool | None = None,
    name: str | None = None,
    synchronization: Any = VariableSynchronization.AUTO,
    aggregation: Any = VariableAggregation.NONE,
) -> AggregatingVariable:
    """One variable on ``device`` wrapped so that replica updates aggregate (CentralStorage)."""
    ctx = _in_replica_fn(strategy)
    if ctx is not None:
        return ctx.merge_call(
            lambda s: create_aggregating_variable(
                s,
                initial_value,
                device=device,
                trainable=trainable,
                name=name,
                synchronization=synchronization,
                aggregation=aggregation,
            )
        )
    variable = create_plain_variable(
        strategy,
        initial_value,
        device=device,
        trainable=trainable,
        name=name,
        synchronization=synchronization,
        aggregation=aggregation,
    )
    return AggregatingVariable(strategy, variable, variable.aggregation)


def update_components(var: Any, fn: Callable[..., Any], args: tuple, kwargs: dict) -> list[Any]:
    """Run ``fn(component_i, *select_replica(i, args))`` on every component of ``var``.

    What ``StrategyExtended.update`` does for a distributed variable in cross-replica context;
    a plain or aggregating variable has the single component itself (its wrapped variable).
    """
    if isinstance(var, DistributedVariable):
        return [
            fn(c, *_values.select_replica(i, args), **_values.select_replica(i, kwargs))
            for i, c in enumerate(var.values)
        ]
    target = var.get() if isinstance(var, AggregatingVariable) else var
    return [fn(target, *args, **kwargs)]


for _name in _SCATTER_OPS:
    setattr(SyncOnReadVariable, _name, _on_read_scatter(_name))
    setattr(MirroredVariable, _name, _mirrored_scatter(_name))
    setattr(AggregatingVariable, _name, _mirrored_scatter(_name))
