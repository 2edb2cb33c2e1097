"""Replica and cross-replica contexts: the per-thread mode stack behind ``get_strategy()``.

Each thread keeps a stack of :class:`Mode` triples ``(strategy, cross_replica_context,
replica_context)``. ``strategy.scope()`` pushes cross-replica mode, every replica of
``strategy.run`` pushes replica mode in its own thread, and ``merge_call`` pushes cross-replica
mode while ``merge_fn`` runs. An empty stack means the default strategy's replica mode.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol

import torch

from . import _nest
from ._devices import Topology
from ._reduce import ReduceOp, to_reduce_op

__all__ = [
    "Mode",
    "ReplicaContext",
    "UpdateContext",
    "current_local_replica_id",
    "current_mode",
    "enter_mode",
    "experimental_set_strategy",
    "get_cross_replica_context",
    "get_replica_context",
    "get_strategy",
    "get_update_replica_id",
    "has_strategy",
    "in_cross_replica_context",
]

CROSS_REPLICA_REQUIRED = (
    "Method requires being in cross-replica context, use get_replica_context().merge_call()"
)


class ContextExtended(Protocol):
    """What the contexts ask of a strategy's ``extended`` (``strategies.base.StrategyExtended``
    implements it; declared here, so that this layer imports nothing above it)."""

    @property
    def topology(self) -> Topology: ...

    def container_strategy(self) -> ContextStrategy: ...

    def on_scope_entered(self) -> None:
        """Runs when the strategy's scope is entered (not on re-entry)."""
        ...

    def on_scope_exited(self) -> None:
        """Runs when the strategy's outermost scope is exited."""
        ...

    def replica_device_name(self, local_id: int) -> str: ...

    def batch_all_reduce(self, reduce_op: ReduceOp, values: list, options: Any) -> list: ...

    def batch_all_gather(self, values: list, axis: int, options: Any) -> list: ...


class MergeChannel(Protocol):
    """Where the replicas of one multi-replica run meet in ``merge_call``."""

    def merge_call(
        self, local_id: int, merge_fn: Callable[..., Any], args: tuple, kwargs: dict
    ) -> Any: ...


class ContextStrategy(Protocol):
    """What the contexts ask of a strategy (``strategies.base.Strategy``)."""

    @property
    def extended(self) -> ContextExtended: ...

    @property
    def num_replicas_in_sync(self) -> int: ...

    def scope(self) -> Any: ...


class Mode(NamedTuple):
    """One entry of the mode stack (TF's ``_ThreadMode``)."""

    strategy: Any
    cross_replica_context: Any
    replica_context: ReplicaContext | None
    #: In replica mode, the replica's index among this process's replicas: the component of a
    #: distributed value it reads and updates (``_values``, ``_variables``).
    local_replica_id: int | None = None


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.stack: list[Mode] = []
        self.global_scope: Any = None  # the scope entered by experimental_set_strategy
        self.default_scopes: list[Any] = []  # default strategies whose scope is open
        self.update_replica_ids: list[int] = []


_state = _ThreadState()
_default_mode: Mode | None = None
_default_mode_lock = threading.Lock()


# The default strategy is a Strategy, which this layer sits under: the strategies layer hands
# its maker over when it loads (``set_default_strategy_maker``). Every public door to the SDK
# loads it first (``strategyjob.__getattr__``, the strategies, ``strategyjob.nn``…).
_default_strategy_maker: Callable[[], ContextStrategy] | None = None


def set_default_strategy_maker(maker: Callable[[], ContextStrategy]) -> None:
    """Called once by ``strategies.base``: how to get the strategy in effect when no other is."""
    global _default_strategy_maker
    _default_strategy_maker = maker


def _default_strategy() -> ContextStrategy:
    if _default_strategy_maker is None:
        raise RuntimeError(
            "strategyjob's default strategy is not loaded: strategyjob.strategies.base was never "
            "imported. Reach the SDK through `import strategyjob` (its public names load it)."
        )
    return _default_strategy_maker()


def _default_replica_mode() -> Mode:
    global _default_mode
    if _default_mode is None:
        with _default_mode_lock:
            if _default_mode is None:
                strategy = _default_strategy()
                _default_mode = Mode(strategy, None, _DefaultReplicaContext(strategy), 0)
    return _default_mode


def is_default_strategy(strategy: Any) -> bool:
    """Whether ``strategy`` is the one in effect when no other is (there is one)."""
    return strategy is _default_replica_mode().strategy


# ---------------------------------------------------------------------------------------------
# The mode stack


def current_mode() -> Mode:
    """The innermost mode of this thread (the default replica mode when none was pushed)."""
    stack = _state.stack
    return stack[-1] if stack else _default_replica_mode()


def push_mode(mode: Mode) -> None:
    _state.stack.append(mode)


def pop_mode(mode: Mode | None = None) -> None:
    stack = _state.stack
    if not stack:
        raise RuntimeError("Distribution mode stack is empty: more scopes exited than entered.")
    if mode is not None and stack[-1] is not mode:
        raise RuntimeError(
            "Distribution scope nesting error: the innermost scope is not the one being exited. "
            "Exit `with` scopes in the reverse order of entering them."
        )
    stack.pop()


@contextlib.contextmanager
def enter_mode(mode: Mode) -> Iterator[Mode]:
    """Push ``mode`` for the current thread while the ``with`` body runs."""
    push_mode(mode)
    try:
        yield mode
    finally:
        pop_mode(mode)


def cross_replica_mode(strategy: Any) -> Mode:
    return Mode(strategy, strategy, None)


# ---------------------------------------------------------------------------------------------
# Public queries


def get_strategy() -> ContextStrategy:
    """The current strategy: the innermost ``scope()`` or ``run()``, else the default strategy."""
    return current_mode().strategy


def has_strategy() -> bool:
    """Whether a strategy other than the default one is current."""
    return not is_default_strategy(get_strategy())


def current_local_replica_id() -> int | None:
    """The current replica's index among this process's replicas; None in cross-replica mode."""
    return current_mode().local_replica_id


def in_cross_replica_context() -> bool:
    """True inside ``strategy.scope()`` or ``merge_fn``; False at top level and inside ``run``."""
    return current_mode().cross_replica_context is not None


def get_replica_context() -> ReplicaContext | None:
    """The current ``ReplicaContext``; None in cross-replica context."""
    return current_mode().replica_context


def get_cross_replica_context() -> ContextStrategy | None:
    """The current strategy when in cross-replica context, else None (deprecated in TF)."""
    return current_mode().cross_replica_context


def experimental_set_strategy(strategy: ContextStrategy | None) -> None:
    """Enter ``strategy.scope()`` for the rest of this thread (``None`` clears it)."""
    old_scope = _state.global_scope
    if old_scope is not None:
        _state.global_scope = None
        old_scope.__exit__(None, None, None)
    if has_strategy():
        raise RuntimeError("Must not be called inside a `tf.distribute.Strategy` scope.")
    if strategy is not None:
        new_scope = strategy.scope()
        new_scope.__enter__()
        _state.global_scope = new_scope


def _reset_for_tests() -> None:
    """Drop this thread's global strategy and every pushed mode (test isolation only)."""
    _state.global_scope = None
    _state.stack.clear()
    _state.default_scopes.clear()
    _state.update_replica_ids.clear()


# ---------------------------------------------------------------------------------------------
# Requirements with TensorFlow's messages


def wrong_strategy_scope(strategy: Any, mode: Mode | None = None) -> None:
    mode = mode or current_mode()
    if not has_strategy():
        raise RuntimeError(f'Need to be inside "with strategy.scope()" for {strategy}')
    raise RuntimeError(
        f"Mixing different tf.distribute.Strategy objects: {mode.strategy} is not {strategy}"
    )


def require_cross_replica_or_default_context_extended(
    extended: ContextExtended, error_message: str | None = None
) -> None:
    """Raise unless in cross-replica context of ``extended``'s strategy or the default mode."""
    mode = current_mode()
    cross_replica = mode.cross_replica_context
    if cross_replica is not None and cross_replica.extended is extended:
        return
    if not _state.stack or mode is _default_replica_mode():
        return
    strategy = extended.container_strategy()
    if mode.strategy is not strategy:
        wrong_strategy_scope(strategy, mode)
    raise RuntimeError(error_message or CROSS_REPLICA_REQUIRED)


def require_replica_context(replica_ctx: ReplicaContext) -> None:
    """Raise unless ``replica_ctx`` is this thread's current replica context."""
    mode = current_mode()
    if mode.replica_context is replica_ctx:
        return
    if mode.replica_context is None:
        raise RuntimeError("Need to be inside `call_for_each_replica()`")
    if mode.strategy is replica_ctx.strategy:
        raise RuntimeError("Mismatching ReplicaContext.")
    raise RuntimeError(
        "Mismatching tf.distribute.Strategy objects: "
        f"{mode.strategy} is not {replica_ctx.strategy}."
    )


def in_replica_context_of_real_strategy() -> bool:
    """True inside ``run`` of a non-default strategy (where ``next(iterator)`` is refused)."""
    mode = current_mode()
    return mode.replica_context is not None and not is_default_strategy(mode.strategy)


# ---------------------------------------------------------------------------------------------
# scope() objects


class CrossReplicaScope:
    """What ``strategy.scope()`` returns for a real strategy (TF's ``_CurrentDistributionContext``).

    Re-entering the scope of the strategy that is already current in cross-replica context is
    allowed and pushes nothing.
    """

    def __init__(self, strategy: ContextStrategy) -> None:
        self._strategy = strategy
        self._mode = cross_replica_mode(strategy)
        self._reentries: list[int] = []  # per __enter__: 1 if re-entrant, 0 if pushed
        self._on_enter: list[Callable[[], Any]] = []

    def __enter__(self) -> ContextStrategy:
        if has_strategy():
            require_cross_replica_or_default_context_extended(self._strategy.extended)
            self._reentries.append(1)
            return self._strategy
        push_mode(self._mode)
        self._reentries.append(0)
        try:
            self._strategy.extended.on_scope_entered()
        except BaseException:
            self._reentries.pop()
            pop_mode(self._mode)
            raise
        return self._strategy

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if not self._reentries:
            raise RuntimeError("Strategy scope exited more often than it was entered.")
        if self._reentries.pop():
            return
        try:
            self._strategy.extended.on_scope_exited()
        finally:
            if _state.stack and _state.stack[-1] is self._mode:
                _state.stack.pop()
            elif exc_type is None:
                raise RuntimeError(
                    "Device scope nesting error: move call to tf.distribute.set_strategy() out "
                    "of `with` scope."
                )


class DefaultScope:
    """``scope()`` of the default strategy: pushes nothing but refuses to nest in real scopes."""

    def __init__(self, strategy: ContextStrategy) -> None:
        self._strategy = strategy

    def __enter__(self) -> ContextStrategy:
        if has_strategy():
            raise RuntimeError("Must not nest tf.distribute.Strategy scopes.")
        _state.default_scopes.append(self._strategy)
        return self._strategy

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if _state.default_scopes:
            _state.default_scopes.pop()


def check_variable_creation_scope() -> None:
    """Creating a variable under a default scope that encloses a real scope fails, as in TF."""
    if _state.default_scopes and has_strategy():
        raise RuntimeError(
            "Mixing different tf.distribute.Strategy objects: "
            f"{get_strategy()} is not {_state.default_scopes[-1]}"
        )


# ---------------------------------------------------------------------------------------------
# UpdateContext: which component `extended.update` is writing


def get_update_replica_id() -> int | None:
    """The local replica id of the component being updated, or None outside an update."""
    ids = _state.update_replica_ids
    return ids[-1] if ids else None


@contextlib.contextmanager
def UpdateContext(local_replica_id: int) -> Iterator[None]:
    _state.update_replica_ids.append(local_replica_id)
    try:
        yield
    finally:
        _state.update_replica_ids.pop()


# ---------------------------------------------------------------------------------------------
# ReplicaContext


_UNMADE: Any = object()  # a replica id tensor not made yet


class ReplicaContext:
    """One replica's context inside ``strategy.run`` (``tf.distribute.ReplicaContext``).

    ``replica_id_in_sync_group`` is global (across workers); ``_local_replica_id`` is the index
    among this process's replicas and selects the component of a ``DistributedValues``.
    """

    def __init__(
        self,
        strategy: ContextStrategy,
        replica_id_in_sync_group: int | torch.Tensor | None,
        *,
        _local_replica_id: int | None = None,
    ) -> None:
        if isinstance(replica_id_in_sync_group, bool) or not (
            replica_id_in_sync_group is None
            or isinstance(replica_id_in_sync_group, (int, torch.Tensor))
        ):
            raise ValueError("replica_id_in_sync_group can only be an integer, a Tensor or None.")
        self._strategy = strategy
        if isinstance(replica_id_in_sync_group, torch.Tensor):
            self._replica_id_tensor = replica_id_in_sync_group
            self._replica_id = int(replica_id_in_sync_group.item())
        elif replica_id_in_sync_group is None:
            self._replica_id_tensor = None
            self._replica_id = 0
        else:  # made on first use: ``strategy.run`` builds a context per replica and step
            self._replica_id_tensor = _UNMADE
            self._replica_id = int(replica_id_in_sync_group)
        if _local_replica_id is None:
            local_count = len(strategy.extended.topology.local_devices) or 1
            _local_replica_id = self._replica_id % local_count
        self._local_replica_id = _local_replica_id
        self._entered: list[Mode] = []

    # --- properties -----------------------------------------------------------------------
    @property
    def strategy(self) -> ContextStrategy:
        return self._strategy

    @property
    def replica_id_in_sync_group(self) -> torch.Tensor | int | None:
        """This replica's global id: an int32 tensor (the Python int 0 in the default context)."""
        if self._replica_id_tensor is _UNMADE:
            self._replica_id_tensor = torch.tensor(self._replica_id, dtype=torch.int32)
        return self._replica_id_tensor

    @property
    def num_replicas_in_sync(self) -> int:
        return self._strategy.num_replicas_in_sync

    @property
    def devices(self) -> tuple[str, ...]:
        """The device(s) this replica computes on, as TensorFlow device names."""
        require_replica_context(self)
        return (self._strategy.extended.replica_device_name(self._local_replica_id),)

    # --- entering the context directly ----------------------------------------------------
    def __enter__(self) -> ReplicaContext:
        """Replica mode of this context for the current thread (how a strategy runs a replica)."""
        mode = Mode(self._strategy, None, self, self._local_replica_id)
        push_mode(mode)
        self._entered.append(mode)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        pop_mode(self._entered.pop())

    # --- cross-replica communication ------------------------------------------------------
    def merge_call(
        self,
        merge_fn: Callable[..., Any],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        """Run ``merge_fn(strategy, *args, **kwargs)`` once, in cross-replica context.

        Every replica must call it; their arguments arrive regrouped (``PerReplica`` unless the
        very same object), and each replica gets its own component of the result back.
        """
        require_replica_context(self)
        return self._merge_call(merge_fn, tuple(args), dict(kwargs or {}))

    def _merge_call(self, merge_fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        channel = _merge_routes.get(self)
        if channel is not None:
            return channel.merge_call(self._local_replica_id, merge_fn, args, kwargs)
        with enter_mode(cross_replica_mode(self._strategy)):
            return merge_fn(self._strategy, *args, **kwargs)

    def all_reduce(self, reduce_op: ReduceOp | str, value: Any, options: Any = None) -> Any:
        """Reduce ``value`` (a nest of tensors) across replicas; every replica gets the result.

        Python numbers, numpy values and variables become a tensor in each replica first (as
        TF converts them), so ``all_reduce("SUM", 1.0)`` over 2 replicas is ``tensor(2.)``.
        Differentiable: the gradient of an all-SUM/all-MEAN is the all-SUM/all-MEAN of the
        replicas' upstream gradients, so every replica must run backward through it.
        """
        reduce_op = to_reduce_op(reduce_op)
        flat = [_replica_tensor(leaf) for leaf in _nest.flatten(value)]
        require_replica_context(self)
        if _needs_grad(flat) and self.num_replicas_in_sync > 1:
            reduced = _AllReduceWithGrad.apply(self._exchange(), reduce_op, options, *flat)
        else:
            reduced = self._all_reduce_flat(reduce_op, flat, options)
        return _nest.pack_sequence_as(value, list(reduced))

    def _all_reduce_flat(self, reduce_op: ReduceOp, flat: list, options: Any) -> list:
        def batch_all_reduce(strategy: ContextStrategy, *flat_values: Any) -> list:
            return strategy.extended.batch_all_reduce(reduce_op, list(flat_values), options)

        return list(self._merge_call(batch_all_reduce, tuple(flat), {}))

    def all_gather(self, value: Any, axis: int, options: Any = None) -> Any:
        """Concatenate ``value`` (a nest of tensors) of all replicas along ``axis``, in id order.

        Non-tensor leaves become tensors in each replica first, as in ``all_reduce``.
        Differentiable: the gradient is this replica's segment of the SUM-all-reduced upstream
        gradient, so every replica must run backward through it.
        """
        flat = [_replica_tensor(leaf) for leaf in _nest.flatten(value)]
        for leaf in flat:
            if isinstance(leaf, torch.Tensor) and leaf.is_sparse:
                raise NotImplementedError("all_gather does not support IndexedSlices")
        require_replica_context(self)
        if _needs_grad(flat) and self.num_replicas_in_sync > 1:
            gathered = _AllGatherWithGrad.apply(self._exchange(), axis, options, *flat)
        else:
            gathered = self._all_gather_flat(flat, axis, options)
        return _nest.pack_sequence_as(value, list(gathered))

    def _all_gather_flat(self, flat: list, axis: int, options: Any) -> list:
        def batch_all_gather(strategy: ContextStrategy, *flat_values: Any) -> list:
            return strategy.extended.batch_all_gather(list(flat_values), axis, options)

        return list(self._merge_call(batch_all_gather, tuple(flat), {}))

    def _exchange(self) -> _Exchange:
        return _Exchange(self._all_reduce_flat, self._all_gather_flat, self._replica_id)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} replica_id_in_sync_group={self._replica_id} "
            f"num_replicas_in_sync={self.num_replicas_in_sync}>"
        )


def _replica_tensor(leaf: Any) -> Any:
    """One replica's leaf as TF's ``convert_to_tensor`` gives it inside ``all_reduce``.

    Tensors stay as they are (the very same tensor on every replica is one value, which TF
    reduces as a non-distributed value); a variable is read; a distributed value gives this
    replica's component; a Python or numpy value becomes a new tensor of its own, so each
    replica contributes its copy.
    """
    if isinstance(leaf, torch.Tensor):
        return leaf
    read = getattr(leaf, "read_value", None)
    if callable(read):
        return read()
    component = _replica_component(leaf)
    if component is not leaf:
        return _replica_tensor(component)
    return torch.tensor(leaf)


def _no_distributed_values(leaf: Any) -> Any:
    return leaf


# A distributed value's component for the current replica (else the value itself), which
# ``_values`` (a layer above this one) hands over when it loads: no such value exists before.
_replica_component: Callable[[Any], Any] = _no_distributed_values


def register_replica_component(component: Callable[[Any], Any]) -> None:
    """``component(value)``: a distributed value's component for the current context, any other
    value as is; collectives (``all_reduce``, ``all_gather``) take each replica's so."""
    global _replica_component
    _replica_component = component


class _Exchange(NamedTuple):
    """What the differentiable collectives need of their replica's context, in forward and in
    backward (which autograd may run on another thread): its flat reduction and gather (through
    ``merge_call``, without the current-context check) and its global replica id."""

    all_reduce_flat: Callable[[ReduceOp, list, Any], list]
    all_gather_flat: Callable[[list, int, Any], list]
    replica_id: int


def _needs_grad(flat: list) -> bool:
    return (
        torch.is_grad_enabled()
        and all(isinstance(t, torch.Tensor) for t in flat)
        and any(t.requires_grad for t in flat)
    )


class _AllReduceWithGrad(torch.autograd.Function):
    """All-reduce whose backward all-reduces the upstream gradients with the same op."""

    @staticmethod
    def forward(ctx: Any, exchange: _Exchange, reduce_op: ReduceOp, options: Any, *flat):
        ctx.exchange, ctx.reduce_op, ctx.options = exchange, reduce_op, options
        ctx.like = [(t.shape, t.dtype, t.device) for t in flat]
        with torch.no_grad():
            reduced = exchange.all_reduce_flat(reduce_op, [t.detach() for t in flat], options)
        return tuple(reduced)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple:
        # A gradient torch leaves out is zero; every replica must still take part.
        filled = [
            g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
            for g, (shape, dtype, device) in zip(grads, ctx.like)
        ]
        with torch.no_grad():
            reduced = ctx.exchange.all_reduce_flat(ctx.reduce_op, filled, ctx.options)
        return (None, None, None, *reduced)


class _AllGatherWithGrad(torch.autograd.Function):
    """All-gather whose backward takes this replica's slice of the all-SUMmed gradient."""

    @staticmethod
    def forward(ctx: Any, exchange: _Exchange, axis: int, options: Any, *flat):
        ctx.exchange, ctx.options = exchange, options
        ctx.like = [(t.dtype, t.device) for t in flat]
        with torch.no_grad():
            gathered = exchange.all_gather_flat([t.detach() for t in flat], axis, options)
            # Where this replica's rows sit: every replica's length along `axis`, in id order.
            dims = [axis % t.dim() if t.dim() else 0 for t in flat]
            lengths = torch.tensor([[t.shape[d]] for t, d in zip(flat, dims)], dtype=torch.int64)
            all_lengths = exchange.all_gather_flat([lengths], 1, options)[0]
        offsets = all_lengths[:, : exchange.replica_id].sum(dim=1).tolist()
        ctx.segments = [(d, o, t.shape[d]) for t, d, o in zip(flat, dims, offsets)]
        ctx.shapes = [g.shape for g in gathered]
        return tuple(gathered)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple:
        filled = [
            g if g is not None else torch.zeros(shape, dtype=dtype, device=device)
            for g, shape, (dtype, device) in zip(grads, ctx.shapes, ctx.like)
        ]
        with torch.no_grad():
            summed = ctx.exchange.all_reduce_flat(ReduceOp.SUM, filled, ctx.options)
        pieces = [g.narrow(d, o, n) for g, (d, o, n) in zip(summed, ctx.segments)]
        return (None, None, None, *pieces)


# Where each replica context of a multi-replica run sends its merge calls (kept here, by the
# module that routes them, rather than on the user-visible context); not listed: inline.
_merge_routes: weakref.WeakKeyDictionary[ReplicaContext, MergeChannel] = weakref.WeakKeyDictionary()


def route_merge_calls(context: ReplicaContext, channel: MergeChannel | None) -> None:
    """Route ``context``'s ``merge_call`` through ``channel`` (the thread group of a
    multi-replica run, ``collective/local.py``); None: it runs inline again."""
    if channel is None:
        _merge_routes.pop(context, None)
    else:
        _merge_routes[context] = channel


class _DefaultReplicaContext(ReplicaContext):
    """The replica context of the default strategy: id is the Python int 0."""

    def __init__(self, strategy: ContextStrategy) -> None:
        super().__init__(strategy, None, _local_replica_id=0)

    @property
    def replica_id_in_sync_group(self) -> int:
        return 0
