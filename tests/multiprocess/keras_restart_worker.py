"""One replica of a 2-worker MultiWorkerMirroredStrategy job under ``strategyjob run``, fitting
with ``BackupAndRestore`` on a directory both workers share. In the job's first run, worker 1
stops after the backup of epoch ``KILL_AFTER`` and writes its pid (``OUT/blocked-pid``) for the
test to SIGKILL it; the launcher restarts the whole job, which resumes after that epoch. The
result compares the weights with plain Keras fit uninterrupted on one process.

``python keras_restart_worker.py OUT`` prints one ``RESULT {json}`` line when fit ends.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import keras  # KERAS_BACKEND=torch: set by the test
import numpy as np
import strategyjob as sj
import torch

torch.set_num_threads(1)

OUT = Path(sys.argv[1])
KILL_AFTER, EPOCHS = 1, 4  # epochs 0-based: killed after the backup of epoch 1 of 0..3


class KilledOnce(keras.callbacks.Callback):
    """Worker 1, first run: after the epoch's backup, wait to be killed (60 s at most)."""

    def __init__(self, worker: int) -> None:
        super().__init__()
        self.worker = worker

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        marker = OUT / "blocked-pid"
        if self.worker != 1 or epoch != KILL_AFTER or marker.exists():
            return
        (OUT / "blocked-pid.tmp").write_text(str(os.getpid()))
        os.rename(OUT / "blocked-pid.tmp", marker)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)
        raise SystemExit("not killed within 60 s")


class Epochs(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.begun: list[int] = []

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.begun.append(epoch)


def _layers() -> list:
    return [keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)]


def main() -> None:
    strategy = sj.MultiWorkerMirroredStrategy()
    worker = strategy.cluster_resolver.task_id
    x = np.random.default_rng(0).normal(size=(16, 3)).astype("float32")
    y = np.random.default_rng(1).normal(size=(16, 2)).astype("float32")
    keras.utils.set_random_seed(0)  # the same initial weights in every run of the job
    with strategy.scope():
        model = keras.Sequential(_layers())
    initial = model.get_weights()
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    epochs = Epochs()
    backup = keras.callbacks.BackupAndRestore(str(OUT / "backup"))
    fit = dict(batch_size=4, epochs=EPOCHS, shuffle=False, verbose=0)
    model.fit(x, y, callbacks=[backup, KilledOnce(worker), epochs], **fit)

    reference = keras.Sequential(_layers())  # plain Keras, one process, never interrupted
    reference.set_weights(initial)
    reference.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    reference.fit(x, y, **fit)
    diff = max(
        float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), reference.get_weights())
    )
    result = {"worker": worker, "epochs": epochs.begun, "weights_diff": diff}
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
