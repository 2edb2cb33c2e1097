"""One MultiWorkerMirroredStrategy task (TF_CONFIG set by the test) training Keras models with
``fit`` / ``evaluate`` / ``predict``, each against a plain Keras copy of the model run in the
same process on the whole global batch (no strategy: one process, Keras's own math).

``python keras_worker.py`` prints one ``RESULT {json}`` line.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import keras  # KERAS_BACKEND=torch: set by the test, as a job's env sets it
import numpy as np
import strategyjob as sj
import torch

torch.set_num_threads(1)

ROWS, FEATURES, BATCH = 9, 3, 4  # batches of 4, 4 and 1 rows: worker 1 has no row in the last


class RowRecorder(keras.Sequential):
    """Records the rows each training step of this worker computed on (column 0: row id)."""

    seen: list[int]

    def train_step(self, data):  # type: ignore[no-untyped-def]
        self.seen.extend(int(i) for i in data[0][:, 0])
        return super().train_step(data)


def _layers() -> list:
    return [
        keras.Input((FEATURES,)),
        keras.layers.Dense(5, activation="tanh"),
        keras.layers.Dense(2),
    ]


def _plain_copy(model: keras.Model) -> keras.Model:
    """The same architecture and weights, built outside every scope: plain Keras."""
    reference = keras.Sequential(_layers())
    reference.set_weights(model.get_weights())
    return reference


def _compile(model: keras.Model) -> None:
    model.compile(
        optimizer=keras.optimizers.Adam(0.05),
        loss="mse",
        metrics=["mae", keras.metrics.MeanSquaredError(name="mse_metric")],
    )


def _max_diff(a: list, b: list) -> float:
    return max(float(np.max(np.abs(np.asarray(u) - np.asarray(v)))) for u, v in zip(a, b))


def fit_evaluate_predict(strategy: sj.MultiWorkerMirroredStrategy) -> dict:
    rng = np.random.default_rng(7)  # the same data on every worker
    x = rng.normal(size=(ROWS, FEATURES)).astype("float32")
    y = rng.normal(size=(ROWS, 2)).astype("float32")
    weights = rng.uniform(0.5, 2.0, size=ROWS).astype("float32")
    x_val = rng.normal(size=(5, FEATURES)).astype("float32")
    y_val = rng.normal(size=(5, 2)).astype("float32")

    keras.utils.set_random_seed(strategy.cluster_resolver.task_id)  # different draws per worker
    with strategy.scope():
        model = keras.Sequential(_layers())
    initial = [w.tolist() for w in model.get_weights()]  # the chief's, broadcast at scope exit
    _compile(model)  # outside the scope: the model keeps its strategy
    reference = _plain_copy(model)
    _compile(reference)

    kwargs = dict(batch_size=BATCH, epochs=2, shuffle=False, verbose=0, sample_weight=weights)
    history = model.fit(x, y, validation_data=(x_val, y_val), **kwargs)
    ref_history = reference.fit(x, y, validation_data=(x_val, y_val), **kwargs)
    return {
        "initial": initial,
        "weights_diff": _max_diff(model.get_weights(), reference.get_weights()),
        "history": history.history,
        "ref_history": ref_history.history,
        "evaluate": model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True),
        "ref_evaluate": reference.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True),
        "predict": model.predict(x, batch_size=BATCH, verbose=0).tolist(),
        "ref_predict": reference.predict(x, batch_size=BATCH, verbose=0).tolist(),
    }


def rows_computed(strategy: sj.MultiWorkerMirroredStrategy) -> dict:
    """Shuffled fit: the rows this worker trained on, per epoch (column 0 is the row id)."""
    x = np.arange(ROWS, dtype="float32")[:, None].repeat(FEATURES, axis=1)
    y = np.zeros((ROWS, 2), dtype="float32")
    with strategy.scope():
        model = RowRecorder(_layers())
    model.seen = []
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=True, verbose=0)
    return {"seen": model.seen}


def classification(strategy: sj.MultiWorkerMirroredStrategy) -> dict:
    """class_weight, validation_split and accuracy, against plain Keras on the global batch."""
    rng = np.random.default_rng(11)
    x = rng.normal(size=(14, FEATURES)).astype("float32")
    y = rng.integers(0, 3, size=14)
    layers = [keras.Input((FEATURES,)), keras.layers.Dense(3)]
    with strategy.scope():
        model = keras.Sequential(layers)
    reference = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(3)])
    reference.set_weights(model.get_weights())
    kwargs = dict(
        batch_size=BATCH,
        epochs=2,
        shuffle=False,
        verbose=0,
        validation_split=0.25,
        class_weight={0: 1.0, 1: 3.0, 2: 0.5},
    )
    histories = []
    for m in (model, reference):
        m.compile(
            optimizer=keras.optimizers.SGD(0.3, momentum=0.5),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        histories.append(m.fit(x, y, **kwargs).history)
    return {
        "cls_history": histories[0],
        "cls_ref_history": histories[1],
        "cls_weights_diff": _max_diff(model.get_weights(), reference.get_weights()),
    }


def data_loader_rows(strategy: sj.MultiWorkerMirroredStrategy) -> dict:
    """A shuffling torch DataLoader of the global batch: each worker trains on its rows."""
    x = torch.arange(ROWS, dtype=torch.float32)[:, None].repeat(1, FEATURES)
    dataset = torch.utils.data.TensorDataset(x, torch.zeros(ROWS, 2))
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True)
    with strategy.scope():
        model = RowRecorder(_layers())
    model.seen = []
    model.compile(optimizer="sgd", loss="mse")
    model.fit(loader, epochs=2, verbose=0)
    return {"loader_seen": model.seen}


def two_inputs_two_outputs(strategy: sj.MultiWorkerMirroredStrategy) -> dict:
    """A functional model with a dict of inputs and two outputs: fit and predict against
    plain Keras (every output's rows, in order)."""
    rng = np.random.default_rng(13)
    x = {
        "a": rng.normal(size=(ROWS, 2)).astype("float32"),
        "b": rng.normal(size=(ROWS, 1)).astype("float32"),
    }
    y = (rng.normal(size=(ROWS, 1)).astype("float32"), rng.normal(size=(ROWS, 2)).astype("float32"))

    def build() -> keras.Model:
        a, b = keras.Input((2,), name="a"), keras.Input((1,), name="b")
        hidden = keras.layers.Dense(4, activation="tanh")(keras.layers.Concatenate()([a, b]))
        outputs = [
            keras.layers.Dense(1, name="first")(hidden),
            keras.layers.Dense(2, name="second")(hidden),
        ]
        return keras.Model({"a": a, "b": b}, outputs)

    with strategy.scope():
        model = build()
    reference = build()
    reference.set_weights(model.get_weights())
    results = []
    for m in (model, reference):
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss=["mse", "mae"], loss_weights=[1.0, 0.5])
        history = m.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
        first, second = m.predict(x, batch_size=BATCH, verbose=0)
        results.append((history, first.tolist(), second.tolist(), m.get_weights()))
    return {
        "multi_history": results[0][0],
        "multi_ref_history": results[1][0],
        "multi_predict": results[0][1:3],
        "multi_ref_predict": results[1][1:3],
        "multi_weights_diff": _max_diff(results[0][3], results[1][3]),
    }


def saving(strategy: sj.MultiWorkerMirroredStrategy) -> dict:
    """model.save, save_weights and ModelCheckpoint into a directory both workers share."""
    shared = Path(os.environ["KERAS_SAVE_DIR"])
    x = np.random.default_rng(3).normal(size=(ROWS, FEATURES)).astype("float32")
    with strategy.scope():
        model = keras.Sequential(_layers())
    _compile(model)
    checkpoint = keras.callbacks.ModelCheckpoint(
        str(shared / "ckpt-{epoch}.weights.h5"), save_weights_only=True
    )
    model.fit(x, x[:, :2], batch_size=BATCH, epochs=2, verbose=0, callbacks=[checkpoint])
    model.save(shared / "model.keras")
    model.save_weights(shared / "last.weights.h5")
    loaded = keras.models.load_model(shared / "model.keras")  # the chief's, complete
    reloaded = keras.Sequential(_layers())
    reloaded.load_weights(shared / "ckpt-2.weights.h5")
    return {
        "files": sorted(p.name for p in shared.iterdir()),
        "loaded_diff": _max_diff(loaded.get_weights(), model.get_weights()),
        "checkpoint_diff": _max_diff(reloaded.get_weights(), model.get_weights()),
    }


def batch_norm(strategy: sj.MultiWorkerMirroredStrategy) -> dict:
    """A model with moving statistics, trained on different rows per worker: every worker
    ends with the same weights, moving mean and variance included."""
    x = np.random.default_rng(5).normal(size=(16, FEATURES)).astype("float32")
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((FEATURES,)), keras.layers.BatchNormalization(), keras.layers.Dense(2)]
        )
    model.compile(optimizer="sgd", loss="mse")
    # Keras's TensorBoard callback on every worker, into one directory (it writes through
    # strategyjob.summary: the chief alone)
    board = keras.callbacks.TensorBoard(os.environ["KERAS_TENSORBOARD_DIR"], write_graph=False)
    history = model.fit(
        x, x[:, :2], batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[board]
    )
    weights = [w.tolist() for w in model.get_weights()]
    return {"bn_weights": weights, "bn_loss": history.history["loss"]}


def main() -> None:
    strategy = sj.MultiWorkerMirroredStrategy()
    result = {"worker": strategy.cluster_resolver.task_id, "keras": keras.__version__}
    result.update(fit_evaluate_predict(strategy))
    result.update(rows_computed(strategy))
    result.update(saving(strategy))
    result.update(batch_norm(strategy))
    result.update(classification(strategy))
    result.update(data_loader_rows(strategy))
    result.update(two_inputs_two_outputs(strategy))
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
