"""Keras ``fit`` / ``evaluate`` / ``predict`` of a model built in the scope of a one-process
strategy with two replicas on logical CPU devices (MirroredStrategy, CentralStorageStrategy),
real Keras (torch backend), against a plain Keras copy run on the whole global batch: the same
weights, history, metrics and predictions, each replica computing on its own rows."""

from __future__ import annotations

import importlib.util
import types

import pytest
import strategyjob as sj  # before keras: makes torch Keras's default backend

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("keras") is None,
    reason="needs the keras extra (pip install 'strategyjob[keras]')",
)

ROWS, FEATURES, BATCH = 9, 3, 4  # global batches of 4, 4 and 1 rows: replica 1 has none in the last
TIGHT = dict(rtol=1e-5, atol=1e-6)

STRATEGIES = {
    "mirrored": lambda: sj.MirroredStrategy(["cpu:0", "cpu:1"]),
    "central_storage": lambda: sj.CentralStorageStrategy(["cpu:0", "cpu:1"]),
}


@pytest.fixture(scope="module")
def keras():  # type: ignore[no-untyped-def]
    import keras
    from keras.src.backend.torch import core

    assert keras.backend.backend() == "torch"
    if str(core.get_device()) != "cpu":  # these strategies' CPU replicas refuse it (tested below)
        pytest.skip("Keras computes on a GPU here: run with KERAS_TORCH_DEVICE=cpu")
    return keras


def _data():  # type: ignore[no-untyped-def]
    """Column 0 of x is the row's id (so a model can report which rows it computed on)."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, FEATURES)).astype("float32")
    x[:, 0] = np.arange(ROWS)
    y = rng.normal(size=(ROWS, 2)).astype("float32")
    weights = rng.uniform(0.5, 2.0, size=ROWS).astype("float32")
    return x, y, weights


def _layers(keras, batch_norm=False):  # type: ignore[no-untyped-def]
    layers = [keras.Input((FEATURES,)), keras.layers.Dense(5, activation="tanh")]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    return [*layers, keras.layers.Dense(2)]


def _pair(keras, strategy, model_class=None, batch_norm=False):  # type: ignore[no-untyped-def]
    """A model built in ``strategy``'s scope and a plain copy with the same weights."""
    model_class = model_class or keras.Sequential
    with strategy.scope():
        model = model_class(_layers(keras, batch_norm))
    plain = keras.Sequential(_layers(keras, batch_norm))
    plain.set_weights(model.get_weights())
    return model, plain


def _assert_same_weights(model, plain) -> None:  # type: ignore[no-untyped-def]
    import numpy as np

    for a, b in zip(model.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, **TIGHT)


@pytest.mark.parametrize("optimizer, weighting", [("sgd", "sample"), ("adam", "class")])
@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.timeout(60)
def test_fit_evaluate_predict_match_one_process_on_the_global_batch(
    keras, name, optimizer, weighting
) -> None:  # type: ignore[no-untyped-def]
    """SGD with sample weights, Adam with class weights, validation_split, a last batch of one
    row: the weights, the history (validation included), evaluate and every predicted row, in
    order, equal plain Keras on the global batch."""
    import numpy as np

    strategy = STRATEGIES[name]()
    model, plain = _pair(keras, strategy)
    assert sj.keras.strategy_of(model) is strategy
    x, y, weights = _data()
    weighted = (
        {"sample_weight": weights} if weighting == "sample" else {"class_weight": {0: 1.0, 1: 3.0}}
    )
    histories = []
    for m in (model, plain):
        opt = keras.optimizers.SGD(0.1) if optimizer == "sgd" else keras.optimizers.Adam(0.05)
        m.compile(optimizer=opt, loss="mse", metrics=["mae"])
        histories.append(
            m.fit(
                x,
                y,
                **weighted,
                batch_size=BATCH,
                epochs=3,
                shuffle=False,
                validation_split=0.25,
                verbose=0,
            ).history
        )
    _assert_same_weights(model, plain)
    assert sorted(histories[0]) == ["loss", "mae", "val_loss", "val_mae"]
    for key, values in histories[1].items():
        np.testing.assert_allclose(histories[0][key], values, **TIGHT)
    got = model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    expected = plain.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    assert got == pytest.approx(expected, rel=1e-5)
    predicted = model.predict(x, batch_size=BATCH, verbose=0)
    assert predicted.shape == (ROWS, 2)
    np.testing.assert_allclose(predicted, plain.predict(x, batch_size=BATCH, verbose=0), **TIGHT)


@pytest.mark.timeout(60)
def test_three_replicas_and_a_model_of_named_inputs_and_outputs(keras) -> None:  # type: ignore[no-untyped-def]
    """Three replicas, a functional model of two named inputs and two outputs with their own
    losses and metrics, fit called inside the scope: batches of 4, 4 and 2 rows (split 2/1/1,
    2/1/1 and 1/1/0) give the weights, history and predictions of plain Keras."""
    import numpy as np

    def build():  # type: ignore[no-untyped-def]
        a, b = keras.Input((3,), name="a"), keras.Input((2,), name="b")
        hidden = keras.layers.Concatenate()([keras.layers.Dense(4, activation="tanh")(a), b])
        outputs = {
            "o1": keras.layers.Dense(2, name="o1")(hidden),
            "o2": keras.layers.Dense(1, name="o2")(hidden),
        }
        return keras.Model({"a": a, "b": b}, outputs)

    strategy = sj.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"])
    with strategy.scope():
        model = build()
    plain = build()
    plain.set_weights(model.get_weights())
    rng = np.random.default_rng(2)
    x = {"a": rng.normal(size=(10, 3)), "b": rng.normal(size=(10, 2))}
    y = {"o1": rng.normal(size=(10, 2)), "o2": rng.normal(size=(10, 1))}
    histories = []
    for m in (model, plain):
        m.compile(optimizer="adam", loss={"o1": "mse", "o2": "mae"}, metrics={"o1": ["mae"]})
    with strategy.scope():
        histories.append(model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0))
    histories.append(plain.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0))
    _assert_same_weights(model, plain)
    assert sorted(histories[0].history) == sorted(histories[1].history)
    for key, values in histories[1].history.items():
        np.testing.assert_allclose(histories[0].history[key], values, **TIGHT)
    got, expected = (m.predict(x, batch_size=4, verbose=0) for m in (model, plain))
    for key in ("o1", "o2"):
        np.testing.assert_allclose(got[key], expected[key], **TIGHT)


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.timeout(60)
def test_each_replica_computes_on_its_own_rows_of_the_global_batch(keras, name) -> None:  # type: ignore[no-untyped-def]
    """Batches of 4, 4 and 1 rows: replica 0 trains on rows 0-1, 4-5 and 8, replica 1 on 2-3
    and 6-7 (no row in the last batch, and nothing hangs); a DataLoader's batch is the global
    batch too, and so are evaluate's and predict's."""
    import numpy as np
    import torch

    class RowRecorder(keras.Sequential):
        """Records (replica, row ids) of each step this model computes on."""

        def _record(self, data):  # type: ignore[no-untyped-def]
            replica = int(sj.get_replica_context().replica_id_in_sync_group)
            x = data[0] if isinstance(data, (tuple, list)) else data
            self.seen.append((replica, [int(i) for i in x[:, 0]]))

        def train_step(self, data):  # type: ignore[no-untyped-def]
            self._record(data)
            return super().train_step(data)

        def test_step(self, data):  # type: ignore[no-untyped-def]
            self._record(data)
            return super().test_step(data)

        def predict_step(self, data):  # type: ignore[no-untyped-def]
            self._record(data)
            return super().predict_step(data)

    strategy = STRATEGIES[name]()
    model, _ = _pair(keras, strategy, RowRecorder)
    model.compile(optimizer="sgd", loss="mse")
    x, y, _ = _data()
    expected = [(0, [0, 1]), (1, [2, 3]), (0, [4, 5]), (1, [6, 7]), (0, [8])]
    model.seen = []
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    assert model.seen == expected
    model.seen = []
    rows = torch.utils.data.TensorDataset(torch.as_tensor(x), torch.as_tensor(y))
    loader = torch.utils.data.DataLoader(rows, batch_size=BATCH)
    model.fit(loader, epochs=1, verbose=0)
    assert model.seen == expected
    model.seen = []
    model.fit(strategy.experimental_distribute_dataset(loader), epochs=1, verbose=0)
    assert model.seen == expected
    model.seen = []
    model.evaluate(x, y, batch_size=BATCH, verbose=0)
    assert model.seen == expected
    model.seen = []
    predicted = model.predict(x, batch_size=BATCH, verbose=0)
    assert model.seen == expected
    assert predicted.shape == (ROWS, 2) and np.isfinite(predicted).all()


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.timeout(60)
def test_a_distributed_dataset_is_read_as_its_global_batches(keras, name) -> None:  # type: ignore[no-untyped-def]
    """strategy.experimental_distribute_dataset(loader) given to fit (and as validation_data),
    evaluate and predict: the same figures as plain Keras given the loader itself."""
    import numpy as np
    import torch

    strategy = STRATEGIES[name]()
    model, plain = _pair(keras, strategy)
    x, y, _ = _data()
    rows = torch.utils.data.TensorDataset(torch.as_tensor(x), torch.as_tensor(y))
    loader = torch.utils.data.DataLoader(rows, batch_size=BATCH)
    distributed = strategy.experimental_distribute_dataset(loader)
    histories = []
    for m, data in ((model, distributed), (plain, loader)):
        m.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", metrics=["mae"])
        histories.append(m.fit(data, validation_data=data, epochs=2, verbose=0).history)
    _assert_same_weights(model, plain)
    for key, values in histories[1].items():
        np.testing.assert_allclose(histories[0][key], values, **TIGHT)
    assert model.evaluate(distributed, verbose=0) == pytest.approx(
        plain.evaluate(loader, verbose=0)
    )
    inputs = torch.utils.data.DataLoader(torch.as_tensor(x), batch_size=BATCH)
    predicted = model.predict(strategy.experimental_distribute_dataset(inputs), verbose=0)
    np.testing.assert_allclose(predicted, plain.predict(x, batch_size=BATCH, verbose=0), **TIGHT)


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.timeout(60)
def test_batch_norm_keeps_the_mean_of_the_replicas_moving_statistics(keras, name) -> None:  # type: ignore[no-untyped-def]
    """One step on a global batch of 8 rows: each replica's BatchNormalization updates its
    moving mean and variance from its own 4 rows (from the same values); the model keeps their
    mean, as TF's ON_READ / MEAN variables read in cross-replica context."""
    import numpy as np

    strategy = STRATEGIES[name]()
    model, _ = _pair(keras, strategy, batch_norm=True)
    halves = []
    for part in (slice(0, 4), slice(4, 8)):
        replica = keras.Sequential(_layers(keras, batch_norm=True))
        replica.set_weights(model.get_weights())
        x, _, _ = _data()
        replica(x[part], training=True)
        halves.append(replica.layers[1])
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
    x, y, _ = _data()
    model.fit(x[:8], y[:8], batch_size=8, epochs=1, shuffle=False, verbose=0)
    norm = model.layers[1]
    for attribute in ("moving_mean", "moving_variance"):
        copies = [keras.ops.convert_to_numpy(getattr(h, attribute)) for h in halves]
        assert not np.allclose(copies[0], copies[1])  # the replicas' copies differ
        got = keras.ops.convert_to_numpy(getattr(norm, attribute))
        np.testing.assert_allclose(got, np.mean(copies, axis=0), **TIGHT)


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.timeout(60)
def test_keras_metrics_in_scope_read_the_global_value_in_a_custom_loop(keras, name) -> None:  # type: ignore[no-untyped-def]
    """A keras.metrics object created in scope and updated by each replica in strategy.run
    (its rows of a distributed dataset) reads the value over the global batch."""
    import numpy as np
    import torch

    strategy = STRATEGIES[name]()
    labels = torch.tensor([0, 1, 1, 0, 1, 1, 0, 0, 1])
    scores = torch.tensor(np.random.default_rng(1).normal(size=(ROWS, 2)).astype("float32"))
    with strategy.scope():
        accuracy = keras.metrics.SparseCategoricalAccuracy()
    seen = []

    def step(batch):  # type: ignore[no-untyped-def]
        y, logits = batch
        seen.append(len(y))
        accuracy.update_state(y, logits)

    dataset = torch.utils.data.TensorDataset(labels, scores)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH)
    for batch in strategy.experimental_distribute_dataset(loader):
        strategy.run(step, args=(batch,))
    plain = keras.metrics.SparseCategoricalAccuracy()
    plain.update_state(labels, scores)
    assert sorted(seen) == [0, 1, 2, 2, 2, 2]  # the work was split
    assert float(accuracy.result()) == pytest.approx(float(plain.result()))


@pytest.mark.parametrize("name", list(STRATEGIES))
@pytest.mark.timeout(60)
def test_saving_and_backup_work_as_in_one_process(keras, name, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """model.save / save_weights and ModelCheckpoint write loadable files; a fit interrupted
    as epoch 2 begins resumes there from its BackupAndRestore and ends as an uninterrupted
    one."""
    import numpy as np

    x, y, _ = _data()

    class Stop(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):  # type: ignore[no-untyped-def]
            if epoch == 2:
                raise KeyboardInterrupt

    def run(callbacks):  # type: ignore[no-untyped-def]
        keras.utils.set_random_seed(0)
        with STRATEGIES[name]().scope():
            model = keras.Sequential(_layers(keras))
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
        model.fit(x, y, batch_size=BATCH, epochs=4, shuffle=False, verbose=0, callbacks=callbacks)
        return model

    checkpoint = str(tmp_path / "best.keras")
    reference = run([keras.callbacks.ModelCheckpoint(checkpoint)])
    backup = str(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        run([keras.callbacks.BackupAndRestore(backup), Stop()])
    resumed = run([keras.callbacks.BackupAndRestore(backup)])
    _assert_same_weights(resumed, reference)
    assert int(resumed.optimizer.iterations) == int(reference.optimizer.iterations) == 12

    reference.save(tmp_path / "model.keras")
    reference.save_weights(tmp_path / "model.weights.h5")
    expected = reference.predict(x, verbose=0)
    for loaded in (
        keras.models.load_model(tmp_path / "model.keras"),
        keras.models.load_model(checkpoint),
    ):
        np.testing.assert_allclose(loaded.predict(x, verbose=0), expected, **TIGHT)
    plain = keras.Sequential(_layers(keras))
    plain.load_weights(tmp_path / "model.weights.h5")
    np.testing.assert_allclose(plain.predict(x, verbose=0), expected, **TIGHT)


def test_several_gpus_in_one_process_are_refused_naming_the_alternative() -> None:
    """The replicas of one process share the model on Keras's device: with several GPUs, or
    CPU replicas while Keras is on a GPU (named through a stand-in strategy and Keras device,
    none being needed), compile/fit are refused."""
    from strategyjob.keras._local import local_replicas_refusal

    def strategy(*devices: str) -> types.SimpleNamespace:
        names = [f"/job:localhost/replica:0/task:0/device:{d}" for d in devices]
        return types.SimpleNamespace(extended=types.SimpleNamespace(worker_devices=names))

    assert local_replicas_refusal(strategy("CPU:0", "CPU:1"), "cpu") is None
    assert local_replicas_refusal(strategy("GPU:0"), "cuda") is None  # one replica, Keras's device
    message = local_replicas_refusal(strategy("GPU:0", "GPU:1"), "cuda")
    assert message is not None and "\n" not in message
    assert message.startswith("Keras fit/evaluate/predict under SimpleNamespace with 2 replicas")
    assert "Use MultiWorkerMirroredStrategy with one GPU per worker" in message
    # CPU replicas while Keras computes on the GPU (its default on a GPU machine)
    message = local_replicas_refusal(strategy("CPU:0", "CPU:1"), "cuda")
    assert message is not None and "\n" not in message
    assert message.startswith("Keras puts its variables and computation on 'cuda'")
    assert "set KERAS_TORCH_DEVICE=cpu before Keras is imported" in message


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_jit_compile_is_refused_naming_the_strategy(keras, name) -> None:  # type: ignore[no-untyped-def]
    with STRATEGIES[name]().scope():
        model = keras.Sequential(_layers(keras))
    with pytest.raises(NotImplementedError, match=r"jit_compile=True .* under \w+Strategy yet"):
        model.compile(loss="mse", jit_compile=True)


@pytest.mark.timeout(60)
def test_a_train_step_that_does_not_scale_its_loss_is_refused(keras) -> None:  # type: ignore[no-untyped-def]
    """A train_step written as Keras's torch guide shows, without optimizer.scale_loss: each
    replica's gradient would count as the whole batch's, so fit says what to add instead."""
    import torch

    class Custom(keras.Sequential):
        def train_step(self, data):  # type: ignore[no-untyped-def]
            x, y = data
            self.zero_grad()
            loss = self.compute_loss(y=y, y_pred=self(x, training=True))
            loss.backward()
            weights = self.trainable_weights[:]
            with torch.no_grad():
                self.optimizer.apply([v.value.grad for v in weights], weights)
            return {}

    model, _ = _pair(keras, STRATEGIES["mirrored"](), Custom)
    model.compile(optimizer="sgd", loss="mse")
    x, y, _ = _data()
    with pytest.raises(RuntimeError) as raised:
        model.fit(x, y, batch_size=BATCH, verbose=0)
    assert str(raised.value).startswith("The train_step of Custom applies the gradients of a loss")
    assert "call loss = self.optimizer.scale_loss(loss) before loss.backward()" in str(raised.value)
