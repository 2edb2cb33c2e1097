"""What the bindings of every strategy share: entry points run in the strategy's scope, and
attributes set on one instance for one step (never on Keras's classes)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import keras

from strategyjob.keras._backend import check_keras_version
from strategyjob.keras._tensorboard import through_strategyjob_summary

__all__ = [
    "ENTRY_POINTS",
    "entry_point",
    "instance_attribute",
    "moving_statistics",
    "refusal",
    "scaled_loss",
]

#: The model's methods that run in its strategy's scope, called inside or outside it.
ENTRY_POINTS = ("compile", "fit", "evaluate", "predict")

JIT_COMPILE = (
    "jit_compile=True (torch.compile) is not supported by Keras fit under {strategy} yet; "
    "compile with jit_compile=False."
)

Call = Callable[[Callable[..., Any], tuple, dict], Any]


def entry_point(
    model: keras.Model,
    strategy: Any,
    name: str,
    call: Call | None = None,
    inputs: Callable[[Any], Any] | None = None,
) -> Any:
    """``model.<name>`` (the class's method) run in ``strategy``'s scope, as TF's Keras does;
    ``inputs(data)``, if given, is what the method reads for its ``x`` and ``validation_data``;
    ``call(method, args, kwargs)``, if given, runs it there instead (``fit``'s extras)."""
    method = getattr(type(model), name)

    def in_scope(*args: Any, **kwargs: Any) -> Any:
        check_keras_version(keras.__version__)
        if name == "compile" and kwargs.get("jit_compile") is True:
            raise NotImplementedError(JIT_COMPILE.format(strategy=type(strategy).__name__))
        if name != "compile":
            bound = inspect.signature(method).bind(model, *args, **kwargs)
            callbacks = bound.arguments.get("callbacks")
            if isinstance(callbacks, (list, tuple)):  # a CallbackList is Keras's own
                through_strategyjob_summary(callbacks, strategy)
            if inputs is not None:
                for key in ("x", "validation_data"):
                    if key in bound.arguments:
                        bound.arguments[key] = inputs(bound.arguments[key])
                args, kwargs = bound.args[1:], bound.kwargs
        with strategy.scope():
            if call is None:
                return method(model, *args, **kwargs)
            return call(method, args, kwargs)

    in_scope.__doc__ = method.__doc__
    return in_scope


def refusal(reason: str) -> Callable[..., Any]:
    """An entry point that raises ``NotImplementedError(reason)``."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(reason)

    return refuse


@contextlib.contextmanager
def instance_attribute(obj: Any, name: str, value: Any) -> Iterator[None]:
    """While entered, ``obj.<name>`` is ``value`` on this instance only; what the instance had
    before (its own attribute, or none: the class's) is back on exit."""
    own = name in vars(obj)
    original = vars(obj).get(name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if own:
            setattr(obj, name, original)
        else:
            delattr(obj, name)


def scaled_loss(
    optimizer: Any, factor: float, calls: set[str] | None = None
) -> contextlib.AbstractContextManager[None]:
    """For one step, the loss the optimizer hands to ``backward`` is multiplied by ``factor``
    (Keras's ``optimizer.scale_loss``, on the instance); each call adds ``"scale_loss"`` to
    ``calls``, if given, so that a step that never scaled its loss can be told apart."""
    original = optimizer.scale_loss

    def scale_loss(loss: Any) -> Any:
        if calls is not None:
            calls.add("scale_loss")
        return original(loss) * factor

    return instance_attribute(optimizer, "scale_loss", scale_loss)


def moving_statistics(model: keras.Model) -> list[Any]:
    """The float non-trainable weights a step may update (BatchNormalization's moving mean and
    variance): each replica updates them from its own rows, and the model keeps their mean over
    the replicas, as TF's MEAN-aggregated variables of Keras's layers."""
    return [
        v
        for v in model.non_trainable_weights
        if v.value.dtype.is_floating_point and v.value.numel()
    ]
