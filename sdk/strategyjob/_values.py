"""Distributed values: one component per local replica (mirrors ``tf.distribute`` values.py).

``PerReplica`` holds unsynchronised per-replica values (what ``run`` returns); ``Mirrored``
holds values known to be equal, and behaves like its current component. ``regroup`` and
``select_replica`` convert between per-replica lists and distributed values.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import _context, _nest

__all__ = [
    "DistributedDelegate",
    "DistributedValues",
    "Mirrored",
    "PerReplica",
    "ValueContext",
    "container_of",
    "is_distributed_variable",
    "register_variable_types",
    "regroup",
    "select_replica",
]

PER_REPLICA_OUTSIDE_REPLICA_CONTEXT = (
    "It looks like you are using a PerReplica object while not inside a replica context, "
    "which is not supported. Try running your op or function inside a replica context by "
    "using `strategy.run`"
)


def _current_local_replica_id() -> int | None:
    """The component index in the current context: replica context or an update, else None."""
    update_id = _context.get_update_replica_id()
    if update_id is not None:
        return update_id
    mode = _context.current_mode()
    if mode.replica_context is None or _context.is_default_strategy(mode.strategy):
        return None
    return mode.local_replica_id


class DistributedValues:
    """Base class for values with one component per local replica."""

    def __init__(self, values: Sequence[Any]) -> None:
        values = tuple(values)
        if not values:
            raise ValueError(f"{type(self).__name__} needs at least one component value.")
        self._values = values

    @property
    def values(self) -> tuple:
        """The components, one per local replica, in replica order."""
        return self._values

    @property
    def _primary(self) -> Any:
        return self._values[0]

    @property
    def _devices(self) -> tuple:
        return tuple(getattr(v, "device", None) for v in self._values)

    def _get(self) -> Any:
        """The component of the current replica, else the class's cross-replica value."""
        local_id = _current_local_replica_id()
        if local_id is None or local_id >= len(self._values):
            return self._get_cross_replica()
        return self._values[local_id]

    def _get_cross_replica(self) -> Any:
        raise NotImplementedError(
            "DistributedValues._get_cross_replica() is implemented by the subclasses."
        )

    def _get_on_device_or_primary(self) -> Any:
        local_id = _current_local_replica_id()
        return self._values[local_id] if local_id is not None else self._primary

    def __str__(self) -> str:
        body = ",\n".join(f"  {i}: {v!s}" for i, v in enumerate(self._values))
        return f"{type(self).__name__}:{{\n{body}\n}}"

    def __repr__(self) -> str:
        body = ",\n".join(f"  {i}: {v!r}" for i, v in enumerate(self._values))
        return f"{type(self).__name__}:{{\n{body}\n}}"

    @classmethod
    def __torch_function__(
        cls, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        """torch ops on a distributed value use the current replica's component."""
        args = _nest.map_structure(cls._unwrap, args)
        kwargs = _nest.map_structure(cls._unwrap, kwargs or {})
        return func(*args, **kwargs)

    @staticmethod
    def _unwrap(value: Any) -> Any:
        """``value``'s component for the current context when it is a distributed value."""
        if not isinstance(value, DistributedValues):
            return value
        distributed: DistributedValues = value  # its own ``_get``, which subclasses override
        return distributed._get()

    # Each replica's collectives (``ReplicaContext.all_reduce``) take its component, too.
    _context.register_replica_component(_unwrap)


class PerReplica(DistributedValues):
    """Unsynchronised values, one per replica (the usual result of ``strategy.run``)."""

    def _get_cross_replica(self) -> Any:
        raise ValueError(PER_REPLICA_OUTSIDE_REPLICA_CONTEXT)


def _binary(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def forward(self: DistributedDelegate, other: Any) -> Any:
        return op(self._get(), self._unwrap(other))

    return forward


def _reflected(op: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def backward(self: DistributedDelegate, other: Any) -> Any:
        return op(self._unwrap(other), self._get())

    return backward


def _unary(op: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def apply(self: DistributedDelegate) -> Any:
        return op(self._get())

    return apply


class DistributedDelegate(DistributedValues):
    """A distributed value that acts like its current component.

    Public attributes and the arithmetic, comparison and bitwise operators are forwarded to the
    component of the current replica (the primary component in cross-replica context).
    """

    def __getattr__(self, name: str) -> Any:
        # Private names are never forwarded: it keeps copy/pickle and internal probes sane.
        if name.startswith("_") or "_values" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self._get(), name)

    __add__ = _binary(operator.add)
    __radd__ = _reflected(operator.add)
    __sub__ = _binary(operator.sub)
    __rsub__ = _reflected(operator.sub)
    __mul__ = _binary(operator.mul)
    __rmul__ = _reflected(operator.mul)
    __truediv__ = _binary(operator.truediv)
    __rtruediv__ = _reflected(operator.truediv)
    __floordiv__ = _binary(operator.floordiv)
    __rfloordiv__ = _reflected(operator.floordiv)
    __mod__ = _binary(operator.mod)
    __rmod__ = _reflected(operator.mod)
    __matmul__ = _binary(operator.matmul)
    __rmatmul__ = _reflected(operator.matmul)
    __lt__ = _binary(operator.lt)
    __le__ = _binary(operator.le)
    __gt__ = _binary(operator.gt)
    __ge__ = _binary(operator.ge)
    __and__ = _binary(operator.and_)
    __rand__ = _reflected(operator.and_)
    __or__ = _binary(operator.or_)
    __ror__ = _reflected(operator.or_)
    __xor__ = _binary(operator.xor)
    __rxor__ = _reflected(operator.xor)
    __lshift__ = _binary(operator.lshift)
    __rlshift__ = _reflected(operator.lshift)
    __rshift__ = _binary(operator.rshift)
    __rrshift__ = _reflected(operator.rshift)
    __rpow__ = _reflected(operator.pow)
    __neg__ = _unary(operator.neg)
    __pos__ = _unary(operator.pos)
    __abs__ = _unary(operator.abs)
    __invert__ = _unary(operator.invert)

    def __pow__(self, other: Any, modulo: Any = None) -> Any:
        return pow(self._get(), self._unwrap(other), modulo)

    def __getitem__(self, key: Any) -> Any:
        return self._get()[key]

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        import numpy as np

        return np.asarray(_to_numpy(self._get()), dtype=dtype)


def _to_numpy(value: Any) -> Any:
    numpy = getattr(value, "numpy", None)
    if callable(numpy):
        return numpy() if not hasattr(value, "detach") else value.detach().cpu().numpy()
    return value


class Mirrored(DistributedDelegate):
    """Values known to be equal on every replica; reads give the current replica's copy."""

    def _get_cross_replica(self) -> Any:
        return self._get_on_device_or_primary()


class ValueContext:
    """What ``experimental_distribute_values_from_function`` passes to ``value_fn``."""

    __slots__ = ("_num_replicas_in_sync", "_replica_id_in_sync_group")

    def __init__(self, replica_id_in_sync_group: int = 0, num_replicas_in_sync: int = 1) -> None:
        self._replica_id_in_sync_group = replica_id_in_sync_group
        self._num_replicas_in_sync = num_replicas_in_sync

    @property
    def num_replicas_in_sync(self) -> int:
        return self._num_replicas_in_sync

    @property
    def replica_id_in_sync_group(self) -> int:
        return self._replica_id_in_sync_group

    def __str__(self) -> str:
        return (
            f"tf.distribute.ValueContext(replica id {self._replica_id_in_sync_group}, "
            f" total replicas in sync: {self._num_replicas_in_sync})"
        )

    __repr__ = __str__


# The variables layer's types (``_variables``, above this one, which cannot import it), as it
# declares them with ``register_variable_types``.
_distributed_variable_types: tuple[type, ...] = ()
_component_types: tuple[type, ...] = ()
_containers: list[Callable[[Any], Any]] = []


def register_variable_types(
    distributed: type, component: type, container_of: Callable[[Any], Any]
) -> None:
    """Declare the variables: a ``distributed`` value is one variable, which :func:`regroup` and
    :func:`select_replica` keep whole; ``container_of(c)`` is the distributed variable that a
    ``c`` whose class is ``component`` or a subclass of it belongs to, or None."""
    global _distributed_variable_types, _component_types
    if not issubclass(distributed, DistributedValues):
        raise TypeError(f"{distributed.__name__} is not a DistributedValues subclass.")
    _distributed_variable_types = (*_distributed_variable_types, distributed)
    _component_types = (*_component_types, component)
    _containers.append(container_of)


def is_distributed_variable(value: Any) -> bool:
    """A distributed variable container (a type declared by ``register_variable_types``)."""
    return isinstance(value, _distributed_variable_types)


def container_of(value: Any) -> Any:
    """The distributed variable a component belongs to, or None (``extended.value_container``
    and :func:`regroup` ask)."""
    kind = type(value)  # by class: to isinstance, every kind of variable is a Variable (as in TF)
    if not issubclass(kind, _component_types):
        return None
    return next(get(value) for c, get in zip(_component_types, _containers) if issubclass(kind, c))


def regroup(
    per_replica_results: Sequence[Any],
    always_wrap: bool = False,
    *,
    wrap_class: type[DistributedValues] = PerReplica,
) -> Any:
    """Turn a list of per-replica nests into one nest of distributed values.

    Lists, tuples, namedtuples and mappings recurse structurally. A leaf that is the very same
    object on every replica comes back unwrapped (so ``run(lambda: 1)`` is ``1`` and one replica
    gives its value as is) unless ``always_wrap``; components of one distributed variable give
    the variable; anything else becomes ``wrap_class(values)``.
    """
    values = tuple(per_replica_results)
    v0 = values[0]
    if isinstance(v0, list):
        for v in values[1:]:
            _check_same_kind(v0, v, list)
        return [
            regroup(tuple(v[i] for v in values), always_wrap, wrap_class=wrap_class)
            for i in range(len(v0))
        ]
    if isinstance(v0, tuple):
        for v in values[1:]:
            _check_same_kind(v0, v, tuple)
        items = tuple(
            regroup(tuple(v[i] for v in values), always_wrap, wrap_class=wrap_class)
            for i in range(len(v0))
        )
        return type(v0)(*items) if hasattr(type(v0), "_fields") else items
    if isinstance(v0, Mapping):
        for v in values[1:]:
            if not isinstance(v, Mapping) or set(v.keys()) != set(v0.keys()):
                raise ValueError(
                    "Replicas returned dictionaries with different keys: "
                    f"{sorted(map(str, v0.keys()))} vs "
                    f"{sorted(map(str, v.keys())) if isinstance(v, Mapping) else v!r}."
                )
        merged = {
            key: regroup(tuple(v[key] for v in values), always_wrap, wrap_class=wrap_class)
            for key in v0.keys()
        }
        try:
            return type(v0)(merged)
        except TypeError:
            return merged
    same_object = all(v is v0 for v in values[1:])
    if same_object and is_distributed_variable(v0):
        return v0
    container = container_of(v0)
    if same_object and not always_wrap and container is None:
        return v0
    if container is not None and all(container_of(v) is container for v in values[1:]):
        return container
    return wrap_class(values)


def _immutable_without_per_replica(structure: Any) -> bool:
    """Whether ``structure`` is a leaf other than a per-replica value, or tuples of such: then
    every replica can be given the very object (a list or dict is copied for each, as a replica
    function may change it)."""
    if isinstance(structure, tuple):
        return all(map(_immutable_without_per_replica, structure))
    if isinstance(structure, DistributedValues):
        return is_distributed_variable(structure)
    return not isinstance(structure, (list, Mapping))


def _check_same_kind(v0: Any, v: Any, kind: type) -> None:
    if not isinstance(v, kind) or len(v) != len(v0):
        raise ValueError(
            "Replicas returned values with different structures: "
            f"{type(v0).__name__} of length {len(v0)} vs {v!r}. Every replica must return the "
            "same nested structure."
        )


def select_replica(local_id: int, structure: Any) -> Any:
    """Replace every non-variable ``DistributedValues`` by its component ``local_id``."""
    if _immutable_without_per_replica(structure):
        return structure  # ``run``'s usual arguments, a tuple of tensors: nothing to pick or copy
    if type(structure) is dict and not structure:
        return {}  # ``run``'s usual keyword arguments

    def pick(x: Any) -> Any:
        if isinstance(x, DistributedValues) and not is_distributed_variable(x):
            return x.values[local_id]
        return x

    return _nest.map_structure(pick, structure)
