"""``Variable``: a named, mutable tensor (the ``tf.Variable`` analogue)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from strategyjob import _context, _devices, _values
from strategyjob._variables._common import (
    VariableAggregation,
    VariableSynchronization,
    _dtype_name,
    _initial_tensor,
    _shape_str,
    _snapshot,
    _sparse_parts,
    _trainable_requires_grad,
    _unwrap,
    _validate_enums,
    _VariableBase,
    distributed_container,
)
from strategyjob._variables._scatter import scatter_


class _Building(threading.local):
    strategy: Any = None  # whose factories are building variables on this thread, else None


_building = _Building()


@contextlib.contextmanager
def building_for(strategy: Any) -> Iterator[None]:
    """``Variable(...)`` inside builds a plain variable that ``strategy`` owns, not the strategy's
    kind of variable: how its factories build components and central or one-device variables
    (as TF's strategy creator calls the next creator, which makes a plain variable)."""
    outer = _building.strategy
    _building.strategy = strategy
    try:
        yield
    finally:
        _building.strategy = outer


class VariableCreator(Protocol):
    """What ``Variable(...)`` in a strategy's scope asks of its ``extended``
    (``strategies.base.StrategyExtended`` answers; declared here, below it)."""

    def create_variable(self, initial_value: Any, **kwargs: Any) -> Any:
        """This strategy's kind of variable (mirrored, sync-on-read, aggregating or plain), given
        ``Variable``'s ``trainable``, ``name``, ``synchronization`` and ``aggregation``."""
        ...


class _VariableMeta(type):
    """``Variable(...)`` inside a strategy's scope returns that strategy's kind of variable."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        _context.check_variable_creation_scope()
        if cls is Variable and _context.has_strategy() and _building.strategy is None:
            return _create_in_scope(_context.get_strategy(), *args, **kwargs)
        return super().__call__(*args, **kwargs)

    def __instancecheck__(cls, instance: Any) -> bool:
        if cls is Variable and isinstance(instance, _VariableBase):
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
    extended: VariableCreator = strategy.extended
    return extended.create_variable(
        initial_value,
        trainable=trainable,
        name=name,
        synchronization=synchronization,
        aggregation=aggregation,
    )


class Variable(_VariableBase, metaclass=_VariableMeta):
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
            strategy=_building.strategy,
        )

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
        self._container = None
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
        return distributed_container(self)

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
        return _snapshot(self) if read_value else None

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
            scatter_(self._tensor, op_name, indices, updates)
        return _snapshot(self)

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
