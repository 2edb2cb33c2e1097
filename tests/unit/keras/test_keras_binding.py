"""Keras models built in a strategy's scope, in one process with real Keras (torch backend):
which strategies bind them, the errors, and the split arithmetic. The 2-worker training itself:
tests/multiprocess/test_keras_mwms.py; several replicas in one process:
test_keras_local_replicas.py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types

import pytest
import strategyjob as sj  # before keras: makes torch Keras's default backend
from strategyjob.keras import _backend
from strategyjob.keras._split import local_rows

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("keras") is None,
    reason="needs the keras extra (pip install 'strategyjob[keras]')",
)


@pytest.fixture(scope="module")
def keras():  # type: ignore[no-untyped-def]
    import keras

    assert keras.backend.backend() == "torch"
    return keras


def _model(keras):  # type: ignore[no-untyped-def]
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])


def _data():  # type: ignore[no-untyped-def]
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.normal(size=(7, 3)).astype("float32"), rng.normal(size=(7, 2)).astype("float32")


def _fit_both(keras, strategy):  # type: ignore[no-untyped-def]
    """Fit a model built in ``strategy``'s scope and a plain copy; return both weights."""
    with strategy.scope():
        model = _model(keras)
    plain = _model(keras)
    plain.set_weights(model.get_weights())
    x, y = _data()
    for m in (model, plain):
        m.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
        m.fit(x, y, batch_size=3, epochs=2, shuffle=False, verbose=0)
    return model, plain


def test_local_rows_split_like_the_distributed_iterator() -> None:
    assert [local_rows(9, 2, w) for w in range(2)] == [(0, 5), (5, 9)]
    assert [local_rows(1, 2, w) for w in range(2)] == [(0, 1), (1, 1)]  # worker 1: no row
    assert [local_rows(7, 3, w) for w in range(3)] == [(0, 3), (3, 5), (5, 7)]
    assert [local_rows(0, 2, w) for w in range(2)] == [(0, 0), (0, 0)]


@pytest.mark.parametrize(
    "make", [lambda: sj.OneDeviceStrategy("cpu:0"), lambda: sj.MultiWorkerMirroredStrategy()]
)
def test_one_replica_strategies_train_as_plain_keras(keras, make) -> None:  # type: ignore[no-untyped-def]
    import numpy as np

    strategy = make()
    model, plain = _fit_both(keras, strategy)
    assert sj.keras.strategy_of(model) is strategy
    for a, b in zip(model.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    x, y = _data()
    assert model.evaluate(x, y, verbose=0) == pytest.approx(plain.evaluate(x, y, verbose=0))
    np.testing.assert_allclose(model.predict(x, verbose=0), plain.predict(x, verbose=0), rtol=1e-6)


def test_model_built_outside_every_scope_is_plain_keras(keras) -> None:  # type: ignore[no-untyped-def]
    model = _model(keras)
    assert sj.keras.strategy_of(model) is None
    assert "train_step" not in vars(model)


@pytest.mark.parametrize("data", ["steps_per_epoch", "own_generator", "python_generator"])
def test_a_mid_epoch_backup_is_refused_when_an_epoch_may_draw_other_rows(
    keras, tmp_path, data
) -> None:  # type: ignore[no-untyped-def]
    """A backup taken mid-epoch is resumed by drawing the epoch's rows again in the same order:
    fit refuses it, before writing anything, where that is not assured (steps_per_epoch: an
    epoch does not restart its data; a DataLoader with its own generator; a Python generator)."""
    import torch

    with sj.MultiWorkerMirroredStrategy().scope():
        model = _model(keras)
    model.compile(loss="mse")
    x, y = _data()
    rows = torch.utils.data.TensorDataset(torch.as_tensor(x), torch.as_tensor(y))
    args = {
        "steps_per_epoch": dict(x=x, y=y, steps_per_epoch=2),
        "own_generator": dict(
            x=torch.utils.data.DataLoader(rows, 3, shuffle=True, generator=torch.Generator())
        ),
        "python_generator": dict(
            x=((x[i : i + 3], y[i : i + 3]) for i in (0, 3)), steps_per_epoch=None
        ),
    }[data]
    why = {
        "steps_per_epoch": "with steps_per_epoch an epoch does not restart its data",
        "own_generator": "the DataLoader shuffles with its own torch.Generator",
        "python_generator": "the order of the batches of a generator is its own",
    }[data]
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"), save_freq=2)
    with pytest.raises(ValueError, match=r"save_freq=2\) backs up in the middle of an epoch") as e:
        model.fit(verbose=0, callbacks=[backup], **args)
    assert why in str(e.value)
    assert not list(tmp_path.iterdir())


def test_a_mid_epoch_backup_resumes_at_its_batch_in_one_worker(keras, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """One worker, shuffled, 4 batches an epoch, save_freq=3: a fit stopped in epoch 1 after
    its batch 2 resumes after the backup taken there after batch 1 (the 6th batch), skipping
    the 2 batches already trained, with the epoch shuffled as before and its metrics given
    back: the weights, the optimizer's step count and the history are those of an
    uninterrupted fit."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 3)).astype("float32")
    y = rng.normal(size=(12, 2)).astype("float32")

    class Stop(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):  # type: ignore[no-untyped-def]
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):  # type: ignore[no-untyped-def]
            if (self.epoch, batch) == (1, 2):
                raise KeyboardInterrupt

    def run(callbacks, seed=0):  # type: ignore[no-untyped-def]
        keras.utils.set_random_seed(seed)
        with sj.MultiWorkerMirroredStrategy().scope():
            model = _model(keras)
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse", metrics=["mae"])
        keras.utils.set_random_seed(1)
        history = model.fit(x, y, batch_size=3, epochs=3, verbose=0, callbacks=callbacks)
        return model, history

    reference, expected = run([])
    backup_dir = str(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        run([keras.callbacks.BackupAndRestore(backup_dir, save_freq=3), Stop()])
    model, history = run([keras.callbacks.BackupAndRestore(backup_dir, save_freq=3)])
    assert int(model.optimizer.iterations) == int(reference.optimizer.iterations) == 12
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6)
    for key in ("loss", "mae"):
        np.testing.assert_allclose(history.history[key], expected.history[key][1:], rtol=1e-5)
    assert not (tmp_path / "backup").exists()


@pytest.mark.parametrize(
    "make",
    [
        lambda: sj.MultiWorkerMirroredStrategy(),
        lambda: sj.MirroredStrategy(["cpu:0", "cpu:1"]),
        lambda: sj.CentralStorageStrategy(["cpu:0", "cpu:1"]),
    ],
)
def test_a_model_built_outside_every_scope_is_refused_when_fit_in_one(keras, make) -> None:  # type: ignore[no-untyped-def]
    """It would compute each whole batch on one replica: refused, naming the strategy."""
    model = _model(keras)
    model.compile(loss="mse")
    x, y = _data()
    strategy = make()
    with strategy.scope():
        with pytest.raises(RuntimeError, match="was built outside every strategy's scope") as e:
            model.fit(x, y, verbose=0)
    assert f"so {type(strategy).__name__} does not distribute it" in str(e.value)
    model.fit(x, y, verbose=0)  # outside every scope: plain Keras, as before


def test_an_uncompiled_model_built_outside_every_scope_may_be_called_in_one(keras) -> None:  # type: ignore[no-untyped-def]
    extractor = _model(keras)  # e.g. a frozen feature extractor: not trained here
    x, _ = _data()
    expected = keras.ops.convert_to_numpy(extractor(x))
    with sj.MultiWorkerMirroredStrategy().scope():
        got = keras.ops.convert_to_numpy(extractor(x))
    assert (got == expected).all()


def test_jit_compile_is_refused_under_multi_worker_mirrored(keras) -> None:  # type: ignore[no-untyped-def]
    with sj.MultiWorkerMirroredStrategy().scope():
        model = _model(keras)
    with pytest.raises(NotImplementedError, match="jit_compile=True"):
        model.compile(loss="mse", jit_compile=True)


def test_keras_versions_outside_the_tested_range_are_refused() -> None:
    _backend.check_keras_version("3.15.1")
    _backend.check_keras_version("3.10.0")
    for version in ("3.9.2", "3.16.0", "2.15.0"):
        with pytest.raises(RuntimeError, match=rf"Keras {version} is not supported"):
            _backend.check_keras_version(version)


def test_a_strategy_scope_is_refused_under_another_keras_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Keras loaded on another backend (jax or tensorflow are not installed here: its
    configuration module stands in): a model built in scope would not be a torch module and
    would silently train undistributed, so entering the scope says what to do."""
    config = types.SimpleNamespace(backend=lambda: "jax")
    monkeypatch.setitem(sys.modules, "keras.src.backend.config", config)
    strategy = sj.OneDeviceStrategy("cpu:0")
    with pytest.raises(RuntimeError) as raised:
        with strategy.scope():
            pass
    assert str(raised.value).startswith("Keras is running on its 'jax' backend")
    assert "Set KERAS_BACKEND=torch" in str(raised.value)
    assert not sj.has_strategy()  # the refused scope left nothing entered
    monkeypatch.undo()
    with strategy.scope():
        assert sj.get_strategy() is strategy


@pytest.mark.timeout(60)
def test_strategyjob_makes_torch_the_default_backend_and_imports_no_keras() -> None:
    code = (
        "import os, sys, strategyjob as sj\n"
        "with sj.MultiWorkerMirroredStrategy().scope():\n"
        "    pass\n"
        "print(os.environ['KERAS_BACKEND'], 'keras' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["torch", "False"]


def test_a_batch_is_sliced_in_every_array_it_holds(keras) -> None:  # type: ignore[no-untyped-def]
    """Dicts, tuples and lists of inputs, targets and sample weights: every array whose first
    dimension is the batch's rows is cut; None and other values pass as they are."""
    import torch
    from strategyjob.keras._split import rows_of, slice_rows

    batch = ({"a": torch.arange(6).reshape(3, 2), "b": torch.arange(3)}, [torch.ones(3)], None)
    assert rows_of(batch) == 3
    (x, y, weights) = slice_rows(batch, 1, 3, 3)
    assert x["a"].tolist() == [[2, 3], [4, 5]] and x["b"].tolist() == [1, 2]
    assert y[0].tolist() == [1.0, 1.0] and weights is None
    assert slice_rows((torch.zeros(5), torch.zeros(2)), 0, 1, 5)[1].shape == (2,)
    with pytest.raises(ValueError, match="holds no array"):
        rows_of((None, 3))


def test_a_distributed_dataset_is_refused_under_multi_worker_mirrored(keras) -> None:  # type: ignore[no-untyped-def]
    """Its batches on a worker are that worker's rows only, not the global batches that fit
    splits: refused, saying to pass the dataset itself."""
    import torch

    strategy = sj.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = _model(keras)
    model.compile(loss="mse")
    x, y = _data()
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.as_tensor(x), torch.as_tensor(y)), batch_size=3
    )
    distributed = strategy.experimental_distribute_dataset(loader)
    for call in (
        lambda: model.fit(distributed, verbose=0),
        lambda: model.fit(loader, validation_data=distributed, verbose=0),
        lambda: model.evaluate(distributed, verbose=0),
        lambda: model.predict(distributed, verbose=0),
    ):
        with pytest.raises(ValueError, match="were given a distributed dataset") as raised:
            call()
        assert "pass the dataset itself" in str(raised.value)
