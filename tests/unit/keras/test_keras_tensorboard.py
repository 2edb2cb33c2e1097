"""Keras's ``TensorBoard`` callback for a model bound to a strategy, on the torch backend:
it writes through ``strategyjob.summary`` (Keras's own would import TensorFlow), and the
curves read back by TensorBoard's reader are ``fit``'s history; what needs TensorFlow's own
ops is left out (the graph, with a warning) or refused (images, embeddings)."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest
import strategyjob as sj  # before keras: makes torch Keras's default backend

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("keras") is None or importlib.util.find_spec("tensorboard") is None,
    reason="needs the keras extra and tensorboard (pip install 'strategyjob[all]')",
)


def _events(logdir: Path):  # type: ignore[no-untyped-def]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    events.Reload()
    return events


def _curve(events, tag):  # type: ignore[no-untyped-def]
    from tensorboard.util import tensor_util

    return [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]


def _model(keras):  # type: ignore[no-untyped-def]
    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1"])
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
    return model


def test_the_callback_writes_fits_global_curves_through_strategyjob_summary(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 3)).astype("float32"), rng.normal(size=(16, 2)).astype("float32")
    board = keras.callbacks.TensorBoard(str(tmp_path), histogram_freq=1, update_freq="batch")
    with caplog.at_level(logging.WARNING, logger="strategyjob.keras"):
        history = _model(keras).fit(
            x, y, batch_size=8, epochs=2, validation_split=0.25, callbacks=[board], verbose=0
        )
    assert "the model graph (write_graph=True) is not written" in caplog.text
    train, val = _events(tmp_path / "train"), _events(tmp_path / "validation")
    epochs = _curve(train, "epoch_loss")
    assert [s for s, _ in epochs] == [0, 1]
    assert [v for _, v in epochs] == pytest.approx(history.history["loss"], rel=1e-6)
    assert [v for _, v in _curve(val, "epoch_loss")] == pytest.approx(
        history.history["val_loss"], rel=1e-6
    )
    assert [s for s, _ in _curve(train, "batch_loss")] == [1, 2, 3, 4]  # 12 rows: 2 batches
    kernels = [t for t in train.Tags()["tensors"] if t.endswith("kernel/histogram")]
    assert kernels and train.SummaryMetadata(kernels[0]).plugin_data.plugin_name == "histograms"


@pytest.mark.parametrize(("field", "value"), [("write_images", True), ("embeddings_freq", 1)])
def test_what_needs_tensorflows_own_ops_is_refused_naming_it(
    tmp_path: Path, field: str, value: object
) -> None:
    import keras
    import numpy as np

    board = keras.callbacks.TensorBoard(str(tmp_path), **{field: value})
    x = np.zeros((4, 3), dtype="float32")
    with pytest.raises(ValueError) as raised:
        _model(keras).fit(x, np.zeros((4, 2), "float32"), epochs=1, callbacks=[board], verbose=0)
    assert str(raised.value).startswith(
        f"keras.callbacks.TensorBoard({field}={value!r}) needs TensorFlow's own summary ops"
    )
    assert not any(tmp_path.iterdir())
