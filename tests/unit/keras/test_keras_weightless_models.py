"""A Keras model made in a strategy's scope without its input shape has no weights there, so
the strategy cannot bind it (Keras gives no hook for a model's construction): compiling it in
the scope, or having ``fit`` build it (in the scope or outside), is refused with one line
naming the fix, instead of training it undistributed (on every worker alone, repeating the
work)."""

from __future__ import annotations

import importlib.util

import pytest
import strategyjob as sj  # before keras: makes torch Keras's default backend

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("keras") is None,
    reason="needs the keras extra (pip install 'strategyjob[keras]')",
)

FIX = "Give it its input shape (keras.Input((...)) as its first layer, or model.build(input_shape))"


def test_compile_in_scope_of_a_model_without_weights_is_refused() -> None:
    import keras

    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(2)], name="lazy")
        with pytest.raises(RuntimeError) as raised:
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    assert str(raised.value).startswith(
        "The Keras model 'lazy' has no weights yet, so MirroredStrategy cannot distribute it"
    )
    assert FIX in str(raised.value)
    with strategy.scope():  # built in scope (its input shape given): bound, compiled, trained
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    assert model.fit(_x(), _y(), verbose=0).history["loss"]


def test_fit_in_scope_that_would_build_an_unbound_model_is_refused() -> None:
    import keras

    strategy = sj.CentralStorageStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(2)], name="lazy_fit")
    model.compile(optimizer="sgd", loss="mse")  # outside the scope: nothing to see yet
    with strategy.scope(), pytest.raises(RuntimeError) as raised:
        model.fit(_x(), _y(), verbose=0)
    assert "The Keras model 'lazy_fit' has no weights yet, so CentralStorageStrategy" in str(
        raised.value
    )


def test_made_in_scope_then_compiled_and_fit_outside_is_refused_at_fit() -> None:
    """The one order no scope sees the model's compile or build in: its automatic name, given
    in the scope (Keras's name counters), marks it, and the fit that would build it raises."""
    import keras

    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(RuntimeError) as raised:
        model.fit(_x(), _y(), verbose=0)
    assert f"The Keras model {model.name!r} has no weights yet, so MirroredStrategy" in str(
        raised.value
    )
    # made outside every scope: plain Keras, built by its fit
    plain = keras.Sequential([keras.layers.Dense(2)])
    plain.compile(optimizer="sgd", loss="mse")
    assert plain.fit(_x(), _y(), verbose=0).history["loss"]


def _x():  # type: ignore[no-untyped-def]
    import numpy as np

    return np.ones((4, 3), dtype="float32")


def _y():  # type: ignore[no-untyped-def]
    import numpy as np

    return np.zeros((4, 2), dtype="float32")
