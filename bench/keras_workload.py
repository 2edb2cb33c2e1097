"""The workload of ``bench_keras.py``, shared by its torch side and TensorFlow's
(``tf_keras_reference.py``, run with a TensorFlow virtualenv's python): numpy only, so that
both import it.

MLP 784-512-512-10 (ReLU, logits), sparse cross-entropy, SGD lr 0.01, on in-memory arrays
that are the same on every worker, as a Keras user holds them.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

import numpy as np

SIZES = (784, 512, 512, 10)
LEARNING_RATE = 0.01
DATA_SEED = 1234


def arrays(examples: int) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``: float32 features and int64 labels, identical on every worker."""
    rng = np.random.default_rng(DATA_SEED)
    x = rng.standard_normal((examples, SIZES[0]), dtype=np.float32)
    y = rng.integers(0, SIZES[-1], size=examples, dtype=np.int64)
    return x, y


def keras_mlp(keras: ModuleType) -> Any:
    """The MLP, compiled, with ``keras`` (Keras 3 or ``tf_keras``): built where it is called
    (in a strategy's scope for the distributed runs)."""
    hidden = [keras.layers.Dense(units, activation="relu") for units in SIZES[1:-1]]
    model = keras.Sequential([keras.Input((SIZES[0],)), *hidden, keras.layers.Dense(SIZES[-1])])
    model.compile(
        optimizer=keras.optimizers.SGD(LEARNING_RATE),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


def steps_per_window(examples: int, global_batch: int, epochs: int) -> int:
    """Training steps of one ``fit(..., epochs=epochs)`` call (the last batch may be short)."""
    return epochs * -(-examples // global_batch)


def clock_callback(keras: ModuleType) -> Any:
    """A callback that stamps the end of every training batch (wall clock and the process's
    CPU, all threads): steps/s is measured from the first step's end to the last's, so the
    call's set-up and the first step (where the workers meet) are not counted."""

    class StepClock(keras.callbacks.Callback):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.wall: list[float] = []
            self.cpu: list[float] = []

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.wall.append(time.perf_counter())
            self.cpu.append(time.process_time())

    return StepClock()


def rate_and_cpu(wall: list[float], cpu: list[float]) -> tuple[float, float]:
    """Steps/s between the first and last stamp, and CPU seconds per step."""
    steps = len(wall) - 1
    if steps < 1:
        raise ValueError("a window needs at least 2 training steps; raise --examples or --epochs")
    return steps / (wall[-1] - wall[0]), (cpu[-1] - cpu[0]) / steps
