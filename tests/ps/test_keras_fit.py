"""Keras ``fit`` under ParameterServerStrategy, with the test process as the chief
(coordinator) and real ``python -m strategyjob.server`` ps and workers over gRPC: the update,
the history and ``evaluate`` against one process running Keras on the same batches, each step
applied once on the ps (a worker killed mid-fit included), and the errors of what cannot run."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import cloudpickle
import numpy as np
import pytest
import strategyjob as sj  # before keras: makes torch Keras's default backend
import torch
from strategyjob.keras import _ps
from strategyjob.keras._ps_optimizers import KerasAdam, KerasSGD
from strategyjob.ps._inmemory import InMemoryTransport

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        importlib.util.find_spec("keras") is None,
        reason="needs the keras extra (pip install 'strategyjob[keras]')",
    ),
]

# Workers cannot import this test module: ship its functions by value, as `__main__`'s are.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

BATCHES, ROWS = 5, 16


@pytest.fixture(scope="module")
def keras():  # type: ignore[no-untyped-def]
    import keras

    assert keras.backend.backend() == "torch"
    return keras


def _batches() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCHES, ROWS, 4, generator=g), torch.randint(
        0, 3, (BATCHES, ROWS), generator=g
    )


def _cycle(log: str | None = None):  # type: ignore[no-untyped-def]
    """The dataset_fn: the same BATCHES batches, in order, without end (on the worker); each
    batch drawn appends a line to ``log``."""

    def dataset_fn(input_context):  # type: ignore[no-untyped-def]
        x, y = _batches()

        def gen():  # type: ignore[no-untyped-def]
            while True:
                for i in range(BATCHES):
                    if log is not None:
                        with open(log, "a") as f:
                            f.write("batch\n")
                    yield x[i], y[i]

        return gen()

    return dataset_fn


def _classifier(keras):  # type: ignore[no-untyped-def]
    return keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
    )


def _compile(keras, model, optimizer=None):  # type: ignore[no-untyped-def]
    model.compile(
        optimizer=optimizer or keras.optimizers.SGD(0.1, momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda k: k.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
        lambda k: k.optimizers.AdamW(0.01, weight_decay=0.05, amsgrad=True),
        lambda k: k.optimizers.SGD(
            k.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5, staircase=True), momentum=0.5
        ),
        lambda k: k.optimizers.Adam(k.optimizers.schedules.CosineDecay(0.05, 5, warmup_steps=2)),
    ],
    ids=["sgd-nesterov", "adamw-amsgrad", "sgd-exponential-decay", "adam-cosine-warmup"],
)
def test_fit_on_one_worker_equals_one_process(
    keras, make_cluster, make_optimizer, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """One worker runs the steps in order: the ps's weights, the history, evaluate and predict
    equal one process running Keras on the same batches (the optimizer's slots live on the
    ps, its update rule is Keras's, bit for bit). 2 epochs of 3 steps draw 6 batches: the
    iterator continues across epochs."""
    cluster = make_cluster(workers=1, ps=2)
    strategy = sj.ParameterServerStrategy(cluster.resolver())
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = _classifier(keras)
    plain = _classifier(keras)
    initial = model.get_weights()
    plain.set_weights(initial)
    _compile(keras, model, make_optimizer(keras))
    _compile(keras, plain, make_optimizer(keras))

    x, y = _batches()
    validation = (x[4].numpy(), y[4].numpy())
    history = model.fit(
        sj.keras.DatasetCreator(_cycle()),
        epochs=2,
        steps_per_epoch=3,
        validation_data=validation,
        verbose=0,
    )

    order = [i % BATCHES for i in range(6)]
    expected = plain.fit(
        ((x[i].numpy(), y[i].numpy()) for i in order),
        epochs=2,
        steps_per_epoch=3,
        validation_data=validation,
        verbose=0,
    )
    assert history.history.keys() == expected.history.keys()
    assert set(history.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    for key, values in expected.history.items():
        np.testing.assert_allclose(history.history[key], values, rtol=1e-6)
    for got, want in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_array_equal(got, want)
    assert not np.allclose(model.get_weights()[0], initial[0])  # the chief read the ps
    model.save(tmp_path / "model.keras")  # with the optimizer's state, kept by the ps
    saved = keras.saving.load_model(tmp_path / "model.keras").optimizer.variables
    want = plain.optimizer.variables
    assert len(saved) == len(want)  # the same variables (their names follow the layers')
    for got, expected in zip(saved, want):
        np.testing.assert_array_equal(got.numpy(), expected.numpy(), err_msg=got.name)
    assert int(saved[0].numpy()) == 6  # iterations
    np.testing.assert_allclose(
        model.evaluate(x[0].numpy(), y[0].numpy(), verbose=0),
        plain.evaluate(x[0].numpy(), y[0].numpy(), verbose=0),
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        model.evaluate(sj.keras.DatasetCreator(_cycle()), steps=BATCHES, verbose=0),
        plain.evaluate(
            ((x[i].numpy(), y[i].numpy()) for i in range(BATCHES)), steps=BATCHES, verbose=0
        ),
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        model.predict(x[1].numpy(), verbose=0), plain.predict(x[1].numpy(), verbose=0), atol=1e-6
    )


def test_each_step_applied_once_on_two_workers(keras, make_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Two workers, two ps, asynchronous steps: a model whose gradient does not depend on its
    weights (mean absolute error far from the targets) ends exactly where one process's
    STEPS identical updates take it, whichever worker ran which step, so no step is lost or
    applied twice, although worker 1 is killed mid-fit (its steps re-run on worker 0); the
    rows drawn are the steps' (work not repeated) but for the batch a killed worker held."""
    cluster = make_cluster(workers=2, ps=2)
    strategy = sj.ParameterServerStrategy(cluster.resolver())
    log = tmp_path / "drawn.log"
    x = torch.linspace(0.5, 1.5, ROWS * 3).reshape(ROWS, 3)
    y = torch.full((ROWS, 1), 1000.0)

    def dataset_fn(input_context):  # type: ignore[no-untyped-def]
        def gen():  # type: ignore[no-untyped-def]
            while True:
                with open(log, "a") as f:
                    f.write("batch\n")
                yield x, y

        return gen()

    def linear():  # type: ignore[no-untyped-def]
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False)])

    with strategy.scope():  # compile and fit in the scope too, as TF's users often do
        model = linear()
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mae")
    plain = linear()
    plain.set_weights(model.get_weights())
    plain.compile(optimizer=keras.optimizers.SGD(0.01), loss="mae")

    class KillWorker1(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):  # type: ignore[no-untyped-def]
            if batch == 6 and ("worker", 1) in cluster.procs:  # in the first epoch
                cluster.kill("worker", 1)

    epochs, steps = 2, 12
    with strategy.scope():
        history = model.fit(
            sj.keras.DatasetCreator(dataset_fn),
            epochs=epochs,
            steps_per_epoch=steps,
            callbacks=[KillWorker1()],
            verbose=0,
        )
    plain.fit(x.numpy(), y.numpy(), batch_size=ROWS, epochs=epochs * steps, verbose=0)
    np.testing.assert_array_equal(model.get_weights()[0], plain.get_weights()[0])
    drawn = log.read_text().count("batch")
    assert epochs * steps <= drawn <= epochs * steps + 1
    assert len(history.history["loss"]) == epochs
    assert all(loss > 990 for loss in history.history["loss"])


# --- what cannot run: one error at compile or fit --------------------------------------------
@pytest.fixture
def in_memory():  # type: ignore[no-untyped-def]
    """A ParameterServerStrategy over an in-process cluster (the errors come before any step
    but the last test's, which runs one)."""
    return sj.ParameterServerStrategy(transport=InMemoryTransport(1, 1))


def test_fit_requires_steps_per_epoch_and_a_dataset_creator(keras, in_memory) -> None:  # type: ignore[no-untyped-def]
    with in_memory.scope():
        model = _classifier(keras)
    _compile(keras, model)
    creator = sj.keras.DatasetCreator(_cycle())
    with pytest.raises(ValueError, match=r"^When using a `tf\.keras\.utils\.experimental\.Data"):
        model.fit(creator, epochs=1)
    with pytest.raises(ValueError, match=r"steps_per_epoch must be a positive integer.*got -1"):
        model.fit(creator, steps_per_epoch=-1)
    loader = torch.utils.data.DataLoader(list(zip(*_batches())))
    with pytest.raises(NotImplementedError, match=r"^Only `tf\.keras.*got DataLoader: wrap it"):
        model.fit(loader, steps_per_epoch=2)
    with pytest.raises(ValueError, match="`y` argument is not supported"):
        model.fit(creator, np.zeros(3), steps_per_epoch=2)
    with pytest.raises(NotImplementedError, match="`validation_split`"):
        model.fit(creator, steps_per_epoch=2, validation_split=0.2)
    backup = keras.callbacks.BackupAndRestore(str(Path("unused")))
    with pytest.raises(NotImplementedError, match=r"BackupAndRestore.*ModelCheckpoint"):
        model.fit(creator, steps_per_epoch=2, callbacks=[backup])
    with pytest.raises(TypeError, match="`dataset_fn` for `DatasetCreator` must be a `callable`"):
        sj.keras.DatasetCreator([1, 2])


def test_fit_on_arrays_checkpoints_and_loads_through_the_ps(keras, in_memory, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Arrays are made a DatasetCreator, as TF does (each worker draws shuffled batches of
    ``batch_size`` rows of the whole arrays; ``steps_per_epoch`` is still required);
    ``ModelCheckpoint`` saves the ps values from the chief and ``load_weights`` sends loaded
    values to the ps."""
    with in_memory.scope():
        model = _classifier(keras)
    _compile(keras, model)
    x, y = (t.reshape(-1, *t.shape[2:]).numpy() for t in _batches())
    with pytest.raises(ValueError, match=r"`steps_per_epoch`, `validation_steps` or `steps`"):
        model.fit(x, y, batch_size=16)
    path = str(tmp_path / "last.weights.h5")
    checkpoint = keras.callbacks.ModelCheckpoint(path, save_weights_only=True)
    initial = model.get_weights()
    history = model.fit(
        x, y, batch_size=16, epochs=2, steps_per_epoch=7, callbacks=[checkpoint], verbose=0
    )
    assert len(history.history["loss"]) == 2
    plain = _classifier(keras)
    _compile(keras, plain)
    plain.load_weights(path)
    np.testing.assert_allclose(
        model.evaluate(x, y, verbose=0), plain.evaluate(x, y, verbose=0), rtol=1e-6
    )
    assert not np.allclose(plain.get_weights()[0], initial[0])
    keep = str(tmp_path / "initial.weights.h5")
    plain.set_weights(initial)
    plain.save_weights(keep)
    model.load_weights(keep)
    in_memory.extended.pull_parameters([v.value for v in model.weights])  # what the ps hold
    for got, want in zip(model.get_weights(), initial):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    "make_optimizer, named",
    [
        (lambda k: k.optimizers.RMSprop(), "the optimizer RMSprop"),
        (lambda k: k.optimizers.SGD(0.1, clipnorm=1.0), r"SGD\(clipnorm=1\.0\)"),
        (
            lambda k: k.optimizers.SGD(lambda: 0.1),
            "the learning rate",
        ),
    ],
)
def test_compile_refuses_an_update_rule_the_ps_cannot_run(
    keras, in_memory, make_optimizer, named
) -> None:  # type: ignore[no-untyped-def]
    with in_memory.scope():
        model = _classifier(keras)
    with pytest.raises(
        NotImplementedError,
        match=f"^Keras fit under ParameterServerStrategy does not support {named}",
    ):
        _compile(keras, model, make_optimizer(keras))


def test_compile_refuses_a_model_not_built_in_the_scope(keras, in_memory) -> None:  # type: ignore[no-untyped-def]
    """A subclassed model created in scope whose weights would be built later, elsewhere."""

    class Net(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x):  # type: ignore[no-untyped-def]
            return self.dense(x)

    with in_memory.scope():
        model = Net()
    assert sj.keras.strategy_of(model) is in_memory
    with pytest.raises(RuntimeError, match=r"not all on the ps: build the model in strategy"):
        _compile(keras, model)


def test_a_step_updating_moving_statistics_fails_the_fit(keras, in_memory) -> None:  # type: ignore[no-untyped-def]
    with in_memory.scope():
        model = keras.Sequential(
            [keras.Input((4,)), keras.layers.BatchNormalization(), keras.layers.Dense(3)]
        )
    _compile(keras, model)
    with pytest.raises(
        NotImplementedError, match=r"updates the non-trainable weight .*moving_mean"
    ):
        model.fit(sj.keras.DatasetCreator(_cycle()), steps_per_epoch=2, verbose=0)


def test_ps_optimizer_maps_keras_optimizers(keras) -> None:  # type: ignore[no-untyped-def]
    cls, arguments = _ps.ps_optimizer(keras.optimizers.SGD(0.5, momentum=0.8, nesterov=True), [])
    assert cls is KerasSGD
    assert arguments == {
        "lr": 0.5,
        "momentum": pytest.approx(0.8),
        "nesterov": True,
        "weight_decay": None,
        "lr_schedule": None,
    }
    model = _classifier(keras)
    adamw = keras.optimizers.AdamW(0.01)
    cls, arguments = _ps.ps_optimizer(adamw, model.trainable_weights)
    assert cls is KerasAdam
    assert arguments["weight_decay"] == pytest.approx(0.004)
    adamw.exclude_from_weight_decay(var_names=["bias"])
    with pytest.raises(NotImplementedError, match="exclude_from_weight_decay"):
        _ps.ps_optimizer(adamw, model.trainable_weights)


EVALUATOR = """
import json, sys
import strategyjob as sj
import keras
import torch

directory, out = sys.argv[1], sys.argv[2]
layers = keras.layers
model = keras.Sequential([keras.Input((4,)), layers.Dense(8, activation="relu"), layers.Dense(3)])
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
model.compile(loss=loss, metrics=["accuracy"])
g = torch.Generator().manual_seed(1)
x = torch.randn({batches}, {rows}, 4, generator=g)
y = torch.randint(0, 3, ({batches}, {rows}), generator=g)
results = []


class Record(keras.callbacks.Callback):
    def on_test_end(self, logs=None):
        results.append(logs)
        with open(out, "w") as f:
            json.dump(results, f)


sj.keras.SidecarEvaluator(
    model, (x[0].numpy(), y[0].numpy()), directory, max_evaluations=2, callbacks=[Record()],
    poll_interval=0.1,
).start()
"""


@pytest.mark.timeout(300)
def test_sidecar_evaluator_evaluates_the_chiefs_checkpoints(keras, make_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The chief fits with ModelCheckpoint(ckpt-{epoch}.weights.h5) while an evaluator process
    runs SidecarEvaluator on the directory: it evaluates the last checkpoint (and maybe the
    first), each figure that of the checkpoint's weights, and stops by itself."""
    import json
    import os
    import subprocess

    cluster = make_cluster(workers=1, ps=1)
    strategy = sj.ParameterServerStrategy(cluster.resolver())
    with strategy.scope():
        model = _classifier(keras)
    _compile(keras, model)
    directory, out = tmp_path / "ckpt", tmp_path / "evaluations.json"
    script = EVALUATOR.format(batches=BATCHES, rows=ROWS)
    env = dict(
        os.environ,
        PYTHONPATH=str(Path(sj.__file__).parents[1])
        + os.pathsep
        + os.environ.get("PYTHONPATH", ""),
    )
    evaluator = subprocess.Popen([sys.executable, "-c", script, str(directory), str(out)], env=env)
    try:
        model.fit(
            sj.keras.DatasetCreator(_cycle()),
            epochs=2,
            steps_per_epoch=3,
            callbacks=[
                keras.callbacks.ModelCheckpoint(
                    str(directory / "ckpt-{epoch}.weights.h5"), save_weights_only=True
                )
            ],
            verbose=0,
        )
        assert evaluator.wait(timeout=180) == 0
    finally:
        if evaluator.poll() is None:
            evaluator.kill()
            evaluator.wait()
    evaluations = json.loads(out.read_text())
    assert 1 <= len(evaluations) <= 2
    plain = _classifier(keras)
    _compile(keras, plain)
    x, y = _batches()
    for epoch, logs in zip(range(3 - len(evaluations), 3), evaluations):
        plain.load_weights(directory / f"ckpt-{epoch}.weights.h5")
        expected = plain.evaluate(x[0].numpy(), y[0].numpy(), verbose=0, return_dict=True)
        assert logs == pytest.approx(expected, rel=1e-6)
    assert sorted(os.listdir(directory)) == ["ckpt-1.weights.h5", "ckpt-2.weights.h5"]
