"""What Keras does in the scope of a strategy that distributes it, seen through its name scopes.

Keras has no hook for variable creation, but every Keras variable is created, and every
layer called, inside ``keras.name_scope(name, caller=obj)``, which pushes itself onto the
``name_scope_stack`` of Keras's (thread-local) global state. When a strategy's scope is
entered (and at every ``run``), :func:`watch_name_scopes` makes that stack, on this thread,
a list that reports each pushed scope's ``caller``; outside the scope of a strategy that
distributes Keras models the report does nothing. Nothing of Keras's or torch's classes is
changed. It sees:

* a ``keras.metrics.Metric`` creating its variables in a MultiWorkerMirroredStrategy's scope
  (MirroredStrategy's replicas share one metric already): the metric is captured, and its
  ``result()`` read outside ``strategy.run`` gives the value over every worker (its variables
  summed, as TF's sync-on-read metric variables), while its updates stay local;
* ``compile`` in such a scope of a model with no weights yet (no input shape): refused, since
  its weights would be created later, by ``fit``, undistributed; and a compiled, unbound model
  being built by ``fit`` / ``evaluate`` / ``predict``, in such a scope or, having been made
  in one (its automatic name given there, seen through Keras's name counters), outside;
* a compiled Keras model built outside every scope being called in scope (by ``fit`` /
  ``evaluate`` / ``predict`` or directly) in the scope of MultiWorkerMirroredStrategy,
  MirroredStrategy or CentralStorageStrategy: refused, since training it would compute each
  whole batch on one replica, and repeat it on every worker (TensorFlow 2.21's Keras fails
  there too, with an ``AssertionError``).
  An uncompiled one (a frozen feature extractor, say) is called as plain Keras.

Tested with Keras ``_backend.MIN_KERAS`` to ``_backend.MAX_KERAS`` (``name_scope`` and its
``caller`` exist in every Keras 3).
"""

from __future__ import annotations

import collections
import sys
import types
import weakref
from typing import Any

import strategyjob
from strategyjob.keras._capture import strategy_of
from strategyjob.keras._sync_on_read import detached_copy, reading_summed, summed

__all__ = ["BUILT_OUTSIDE_SCOPE", "is_captured_metric", "watch_name_scopes"]

BUILT_OUTSIDE_SCOPE = (
    "The Keras model {name!r} was built outside every strategy's scope, so {strategy} does "
    "not distribute it: training or calling it in strategy.scope() would compute each whole "
    "batch on one replica (and repeat it on every worker). Build the model (with its input "
    "shape, so that its weights are created) inside `with strategy.scope():`."
)

NO_WEIGHTS_IN_SCOPE = (
    "The Keras model {name!r} has no weights yet, so {strategy} cannot distribute it: "
    "{strategy} binds a model when its weights are created in strategy.scope(), and this "
    "one's would be created later, by fit, on each worker alone. Give it its input shape "
    "(keras.Input((...)) as its first layer, or model.build(input_shape)) inside "
    "`with strategy.scope():`, before compile."
)
#: How far up the stack a metric's or optimizer's name scope looks for the ``compile`` that
#: creates it (Keras 3.10 - 3.15: 3 to 6 frames).
_COMPILE_FRAMES = 12

_captured: weakref.WeakSet[Any] = weakref.WeakSet()


class _WatchedStack(list):  # type: ignore[type-arg]
    """Keras's name-scope stack for one thread, reporting each scope pushed onto it."""

    def append(self, entry: Any) -> None:
        caller = getattr(entry, "caller", None)
        if caller is not None:
            _on_name_scope(caller)
        super().append(entry)


class _WatchedNames(collections.defaultdict):  # type: ignore[type-arg]
    """Keras's counters of automatic object names for one thread (``naming.uniquify``),
    noting each name given in a distributing strategy's scope: the one trace Keras leaves of
    a model made there before it has weights (it has no hook for construction)."""

    def __setitem__(self, prefix: Any, count: Any) -> None:
        super().__setitem__(prefix, count)
        if isinstance(count, int) and count > 0:
            strategy = _distributing_strategy()
            if strategy is not None:  # uniquify's name: the prefix, then prefix_1, prefix_2...
                name = prefix if count == 1 else f"{prefix}_{count - 1}"
                _named_in_scope[name] = type(strategy).__name__


#: Automatic names given in a distributing strategy's scope, with the strategy's class name.
_named_in_scope: dict[str, str] = {}


def watch_name_scopes(strategy: Any) -> None:
    """Scope-entry hook: make this thread's Keras name-scope stack and automatic-name counters
    watched ones (once; again after ``keras.backend.clear_session()``, which drops them). A
    no-op before Keras loads."""
    state = sys.modules.get("keras.src.backend.common.global_state")
    if state is None:
        return
    stack = state.get_global_attribute("name_scope_stack")
    if not isinstance(stack, _WatchedStack):
        state.set_global_attribute("name_scope_stack", _WatchedStack(stack or ()))
    names = state.get_global_attribute("object_name_uids")
    if not isinstance(names, _WatchedNames):
        state.set_global_attribute("object_name_uids", _WatchedNames(int, names or {}))


def _distributing_strategy() -> Any:
    """The strategy whose scope is entered, if it distributes Keras models across replicas."""
    if not strategyjob.has_strategy():
        return None
    from strategyjob.strategies.central_storage import CentralStorageStrategy
    from strategyjob.strategies.mirrored import MirroredStrategy
    from strategyjob.strategies.multi_worker_mirrored import MultiWorkerMirroredStrategy

    strategy = strategyjob.get_strategy()
    distributing = (MultiWorkerMirroredStrategy, MirroredStrategy, CentralStorageStrategy)
    return strategy if isinstance(strategy, distributing) else None


def _on_name_scope(caller: Any) -> None:
    model_module = sys.modules.get("keras.src.models.model")
    is_model = model_module is not None and isinstance(caller, model_module.Model)
    strategy = _distributing_strategy()
    if (
        is_model
        and not caller.built
        and getattr(caller, "compiled", False)
        and strategy_of(caller) is None
    ):  # built now, by fit / evaluate / predict: too late to be bound
        made_in = _named_in_scope.get(caller.name)
        if strategy is not None or made_in is not None:
            name = type(strategy).__name__ if strategy is not None else made_in
            raise RuntimeError(NO_WEIGHTS_IN_SCOPE.format(name=caller.name, strategy=name))
    if strategy is None:  # what follows concerns a distributing strategy's scope only
        return
    from strategyjob.strategies.multi_worker_mirrored import MultiWorkerMirroredStrategy

    metric_module = sys.modules.get("keras.src.metrics.metric")
    optimizer_module = sys.modules.get("keras.src.optimizers.base_optimizer")
    is_metric = metric_module is not None and isinstance(caller, metric_module.Metric)
    if is_metric or (
        optimizer_module is not None and isinstance(caller, optimizer_module.BaseOptimizer)
    ):
        _refuse_weightless_compile(model_module, strategy)
    if is_metric:
        if isinstance(strategy, MultiWorkerMirroredStrategy):
            _capture_metric(caller, strategy)
    elif (
        is_model
        and caller.built
        and getattr(caller, "compiled", False)
        and strategy_of(caller) is None
    ):
        raise RuntimeError(
            BUILT_OUTSIDE_SCOPE.format(name=caller.name, strategy=type(strategy).__name__)
        )


def _refuse_weightless_compile(model_module: Any, strategy: Any) -> None:
    """A metric or optimizer made by ``compile`` in a distributing strategy's scope: refuse
    compiling a model that has no weights and is not bound (built without an input shape), which
    would otherwise train undistributed, repeating the work on every worker. Keras gives no
    hook for a model's construction, so the ``compile`` frame's model is read off the stack."""
    if model_module is None:
        return
    frame = sys._getframe(2)  # noqa: SLF001  (the caller of Keras's name scope)
    for _ in range(_COMPILE_FRAMES):
        if frame is None:
            return
        model = frame.f_locals.get("self") if frame.f_code.co_name == "compile" else None
        if isinstance(model, model_module.Model):
            if not model.built and strategy_of(model) is None:
                raise RuntimeError(
                    NO_WEIGHTS_IN_SCOPE.format(name=model.name, strategy=type(strategy).__name__)
                )
            return
        frame = frame.f_back


def is_captured_metric(metric: Any) -> bool:
    """Whether ``metric`` was created in a MultiWorkerMirroredStrategy's scope (sync-on-read)."""
    return metric in _captured


def _capture_metric(metric: Any, strategy: Any) -> None:
    """Give ``metric`` (this instance) a ``result`` that sums its variables over the workers
    when read outside ``strategy.run``; inside ``run`` it reads the local value. A bound
    method, so that a deep copy of the metric (which copies it bound to the copy) reads its own
    variables."""
    if metric in _captured:
        return
    _captured.add(metric)
    read = type(metric).result
    collectives = strategy.extended.collectives

    def result(own: Any) -> Any:
        local = strategyjob.has_strategy() and strategyjob.get_replica_context() is not None
        if local or reading_summed():
            return read(own)
        with summed(collectives, own.variables):
            return sys.modules["keras"].tree.map_structure(detached_copy, read(own))

    result.__doc__ = read.__doc__
    object.__setattr__(metric, "result", types.MethodType(result, metric))
